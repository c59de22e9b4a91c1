"""Hugging Face encoders (issue 31): a sentence-transformers directory around a BertModel at
all-MiniLM-L6-v2's settings (512 positions, two token types, eps 1e-12, the 30,522-id uncased
WordPiece, mean pooling, Normalize, texts cut at 256) through import-hf, export, optimize,
verify and `embed`, against transformers' hidden states and sentence-transformers'
arithmetic on them; and what is not run, refused by name."""
import json

import numpy as np
import pytest
import torch
from cli_run import run_cli
from hf_fixtures import save_bert, save_encoder, sentence_embeddings

from tinyt.config import ModelConfig
from tinyt.errors import ConfigError, ConversionError

TEXTS = ["A man is eating food.", "short", "The quick brown fox jumps over the lazy dog. " * 40,
         "Ünïcode café, naïve façade — 東京!", "def __init__(self): return None"]
# fp32 against transformers: the same arithmetic in other orders (export/verifier.py's bound)
ATOL = 1e-4


_cli = run_cli


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    """(sentence-transformers directory, transformers' model, tinyt checkpoint)."""
    from tinyt.hf import import_hf
    root = tmp_path_factory.mktemp("minilm")
    model = save_bert(root / "st")
    said: list[str] = []
    import_hf(root / "st", root / "ckpt", log=said.append)
    assert any("pooler.dense.weight" in s for s in said), said  # dropped, and said
    return root / "st", model, root / "ckpt"


def _batch(rows):
    T = max(len(ids) for ids, _ in rows)
    pad = lambda xs: torch.tensor([x + [0] * (T - len(x)) for x in xs])  # noqa: E731
    ids, types = pad([r[0] for r in rows]), pad([r[1] for r in rows])
    mask = (torch.arange(T)[None] < torch.tensor([len(r[0]) for r in rows])[:, None]).long()
    return ids, mask, types


def test_sentence_transformers_directory_imports_as_the_encoder(minilm):
    from transformers import AutoTokenizer

    from tinyt.checkpoint import load_checkpoint
    st, hf, ckpt_dir = minilm
    ckpt = load_checkpoint(ckpt_dir)
    cfg = ckpt.config
    assert (cfg.task, cfg.pooling, cfg.normalize, cfg.norm_placement, cfg.embedding_norm,
            cfg.type_vocab_size, cfg.block_size, cfg.vocab_size, cfg.norm_eps) == \
        ("encoder", "mean", True, "post", True, 2, 512, 30522, 1e-12)
    tok = ckpt.tokenizer
    assert tok.hf.truncation["max_length"] == 256  # sentence_bert_config's, not the 512 table
    # transformers' tokenizer of the directory gives the same ids and token types, a pair too
    theirs = AutoTokenizer.from_pretrained(st)
    for text in TEXTS:
        ours = tok.hf.encode(text)
        ref = theirs(text, truncation=True, max_length=256)
        assert ours.ids == ref["input_ids"] and ours.type_ids == ref["token_type_ids"]
    pair = tok.hf.encode("How old are you?", "I am six.")
    assert set(pair.type_ids) == {0, 1}
    rows = [(e.ids, e.type_ids) for e in tok.hf.encode_batch(TEXTS)] + [(pair.ids, pair.type_ids)]
    ids, mask, types = _batch(rows)
    h, e = sentence_embeddings(hf, ids, mask, types)
    with torch.no_grad():
        x, s = ckpt.model.eval()(ids, mask, types)
    real = mask.bool()
    assert (x - h)[real].abs().max() <= ATOL
    assert (s - e).abs().max() <= ATOL
    assert torch.allclose(s.norm(dim=-1), torch.ones(len(rows)), atol=1e-6)
    # the token types matter: all-zero types give other hidden states for the pair
    with torch.no_grad():
        x0, _ = ckpt.model(ids, mask)
    assert (x0[-1] - x[-1])[real[-1]].abs().max() > 1e-2


@pytest.mark.slow
def test_encoder_through_export_optimize_verify_and_embed(minilm, tmp_path, monkeypatch,
                                                          capsys):
    import onnx

    import tinyt.runtime as rt
    st, hf, ckpt = minilm
    for stage, args in (("export", (ckpt, tmp_path / "onnx")),
                        ("optimize", (tmp_path / "onnx", tmp_path / "opt")),
                        ("verify", (ckpt, tmp_path / "opt"))):
        code, out, err = _cli(monkeypatch, capsys, stage, *args)
        assert code in (0, None), (stage, err)
    report = json.loads((tmp_path / "opt-verify.json").read_text())
    assert report["passed"] and report["sizes"]["longest_sequence"] == 512
    assert set(report["worst"]) == {"last_hidden_state", "sentence_embedding"}
    graph = onnx.load(str(tmp_path / "onnx" / "model.onnx"), load_external_data=False)
    assert [i.name for i in graph.graph.input] == ["input_ids", "attention_mask",
                                                    "token_type_ids"]
    assert [o.name for o in graph.graph.output] == ["last_hidden_state", "sentence_embedding"]
    config = json.loads((tmp_path / "onnx" / "config.json").read_text())
    assert config["model_type"] == "bert" and config["architectures"] == ["BertModel"]
    opt = json.loads((tmp_path / "opt" / "manifest.json").read_text())
    ops = {n.op_type for n in onnx.load(str(tmp_path / "opt" / "model.onnx"),
                                        load_external_data=False).graph.node}
    # residual norms as Sum + LayerNormalization (export/encoder_fusions.py)
    assert {"MultiHeadAttention", "Sum", "LayerNormalization", "BiasGelu"} <= ops, (ops, opt)
    enc = rt.load(tmp_path / "opt", threads=1)
    assert isinstance(enc, rt.Encoder) and enc.max_length == 256
    got = enc.embed(TEXTS, batch_size=2)  # sorted by length into batches, put back in order
    ids, mask, types = _batch(enc.encode(TEXTS))
    assert mask.sum(1).max() == 256  # the long text cut where sentence-transformers cuts
    _, ref = sentence_embeddings(hf, ids, mask, types)
    assert got.shape == (len(TEXTS), 64) and np.abs(got - ref.numpy()).max() <= ATOL
    assert np.abs(enc.embed(TEXTS[1]) - got[1]).max() <= 1e-6  # alone as in a batch
    raw = enc.embed(TEXTS[:2], normalize=True)
    assert np.allclose(np.linalg.norm(raw, axis=1), 1.0, atol=1e-6)
    with pytest.raises(ConfigError, match="normalizes its embeddings itself"):
        enc.embed(TEXTS[:2], normalize=False)
    code, out, err = _cli(monkeypatch, capsys, "embed", tmp_path / "opt", TEXTS[0], TEXTS[1])
    lines = [json.loads(line) for line in out.splitlines()]
    assert code in (0, None) and [x["text"] for x in lines] == TEXTS[:2]
    assert np.abs(np.array([x["embedding"] for x in lines]) - got[:2]).max() <= 1e-6
    (tmp_path / "texts.txt").write_text("\n".join(TEXTS[1:3]) + "\n", encoding="utf-8")
    code, out, err = _cli(monkeypatch, capsys, "embed", tmp_path / "opt", TEXTS[0],
                          "--file", tmp_path / "texts.txt")  # each line after the arguments
    lines = [json.loads(line) for line in out.splitlines()]
    assert code in (0, None) and [x["text"] for x in lines] == TEXTS[:3]
    assert np.abs(np.array([x["embedding"] for x in lines]) - got[:3]).max() <= 1e-6
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe not utf-8")
    code, out, err = _cli(monkeypatch, capsys, "embed", tmp_path / "opt", "--file",
                          tmp_path / "bad.txt")
    assert code == 2 and "cannot read it as UTF-8 text" in err
    code, out, err = _cli(monkeypatch, capsys, "generate", tmp_path / "opt", "hi")
    assert code == 2 and "is an encoder; use 'tinyt embed'" in err
    code, out, err = _cli(monkeypatch, capsys, "export-hf", ckpt, tmp_path / "hf-out")
    assert code in (0, None) and "last_hidden_state max abs diff vs tinyt: 0.00e+00" in out
    assert "zeros, not the original model's" in err  # the pooler it cannot give back, said
    assert (tmp_path / "hf-out" / "modules.json").is_file()


@pytest.mark.parametrize("change, said", [
    (lambda d: (d / "1_Pooling" / "config.json").write_text(json.dumps(
        {"pooling_mode_max_tokens": True})), "pooling 'max' is not implemented"),
    (lambda d: (d / "1_Pooling" / "config.json").write_text(json.dumps(
        {"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True})),
     "concatenates several poolings"),
    (lambda d: (d / "modules.json").write_text(json.dumps(
        [*json.loads((d / "modules.json").read_text()),
         {"idx": 3, "name": "3", "path": "3_Dense",
          "type": "sentence_transformers.models.Dense"}])), "Dense not implemented"),
    (lambda d: (d / "sentence_bert_config.json").write_text(json.dumps(
        {"max_seq_length": 256, "do_lower_case": True})), "do_lower_case=true"),
    (lambda d: (d / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {"query": "query: "}, "default_prompt_name": "query"})),
     "default_prompt_name='query' puts a prompt before every text"),
    (lambda d: (d / "config.json").write_text(json.dumps(
        {**json.loads((d / "config.json").read_text()),
         "position_embedding_type": "relative_key"})), "position_embedding_type='relative_key'"),
    (lambda d: (d / "config.json").write_text(json.dumps(
        {**json.loads((d / "config.json").read_text()),
         "architectures": ["BertForSequenceClassification"]})),
     "a sentence-transformers directory around a BertForSequenceClassification"),
])
def test_what_the_encoder_does_not_run_is_refused_by_name(tmp_path, change, said):
    from tinyt.hf import import_hf
    save_bert(tmp_path / "st", num_hidden_layers=1)
    change(tmp_path / "st")
    with pytest.raises(ConversionError, match=said.replace("(", r"\(").replace("'", "'")):
        import_hf(tmp_path / "st", tmp_path / "ckpt")
    assert not (tmp_path / "ckpt").exists()


def test_encoder_options_are_validated_by_name():
    enc = dict(task="encoder", norm_placement="post", embedding_norm=True, block_size=16,
               vocab_size=32, n_layer=1, n_head=2, n_embd=8)
    assert ModelConfig(**enc, pooling=None).pooling is None
    for bad, said in ((dict(pooling="max"), "pooling='max' is invalid: allowed: mean, cls, last"),
                      (dict(pooling=None, normalize=True), "normalize=True is invalid"),
                      (dict(norm_placement="middle"), "norm_placement='middle' is invalid"),
                      (dict(type_vocab_size=-1), "type_vocab_size=-1 is invalid"),
                      (dict(num_labels=2), "num_labels=2 is invalid"),
                      (dict(norm_placement="post", post_norms=True), "takes neither")):
        with pytest.raises(ConfigError, match=said.replace("(", r"\(")):
            ModelConfig(**{**enc, **bad})
    with pytest.raises(ConfigError, match="pooling=None is invalid"):
        ModelConfig(task="classifier", num_labels=2, pooling=None)
    with pytest.raises(ConfigError, match="a causal LM keeps the default"):
        ModelConfig(pooling="cls")


def test_pooling_takes_the_first_the_last_real_or_the_mean_token():
    from tinyt.model import build_model
    base = dict(task="encoder", block_size=16, vocab_size=32, n_layer=1, n_head=2, n_embd=8)
    ids = torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    torch.manual_seed(0)
    model = build_model(ModelConfig(**base, pooling=None)).eval()
    with torch.no_grad():
        h = model(ids, mask)
        for pooling, want in (("cls", h[:, 0]), ("last", h[[0, 1], [2, 1]]),
                              ("mean", torch.stack([h[0, :3].mean(0), h[1, :2].mean(0)]))):
            model.config = ModelConfig(**base, pooling=pooling)
            assert torch.allclose(model(ids, mask)[1], want, atol=1e-6), pooling


# DistilBERT (no token types, eps fixed), RoBERTa and XLM-R (positions from pad_token_id + 1,
# one token type; byte-level BPE and Unigram tokenizers), ModernBERT (rotary over 8,192
# positions, +-64-token windows in 2 of every 3 layers, GeGLU, no biases) at their real
# models' settings: (class, position offset, token types, context)
FAMILIES = {"distilbert": ("DistilBertModel", 0, 0, 512), "roberta": ("RobertaModel", 2, 1, 512),
            "xlm-roberta": ("XLMRobertaModel", 2, 1, 512),
            "modernbert": ("ModernBertModel", 0, 0, 8192)}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    from tinyt.hf import import_hf
    root = tmp_path_factory.mktemp(request.param)
    model = save_encoder(request.param, root / "st", pooling="cls", normalize=False)
    import_hf(root / "st", root / "ckpt")
    return request.param, root, model


def test_each_encoder_family_matches_transformers(family):
    from transformers import AutoTokenizer

    from tinyt.checkpoint import load_checkpoint
    kind, root, hf = family
    ckpt = load_checkpoint(root / "ckpt")
    cfg = ckpt.config
    arch, offset, types, context = FAMILIES[kind]
    assert (cfg.block_size, cfg.position_offset, cfg.type_vocab_size, cfg.pooling,
            cfg.normalize) == (context, offset, types, "cls", False)
    theirs = AutoTokenizer.from_pretrained(root / "st")
    rows = []
    for text in TEXTS:
        ours = ckpt.tokenizer.hf.encode(text)
        assert ours.ids == theirs(text, truncation=True, max_length=256)["input_ids"], text
        rows.append((ours.ids, ours.type_ids))
    ids, mask, _ = _batch(rows)
    ids[~mask.bool()] = hf.config.pad_token_id  # RoBERTa reads its padding from the ids
    h, e = sentence_embeddings(hf, ids, mask, pooling="cls", normalize=False)
    with torch.no_grad():
        x, s = ckpt.model.eval()(ids, mask)
    assert (x - h)[mask.bool()].abs().max() <= ATOL and (s - e).abs().max() <= ATOL
    with torch.no_grad():  # 512 tokens: a table's last row; ModernBERT's windows 4x over
        full = torch.randint(5, cfg.vocab_size, (1, 512))
        ref = hf(input_ids=full).last_hidden_state
        assert (ckpt.model(full)[0] - ref).abs().max() <= ATOL


@pytest.mark.slow
def test_each_encoder_family_through_export_verify_and_embed(family, tmp_path):
    import tinyt.runtime as rt
    from tinyt.export import export_onnx, verify
    kind, root, hf = family
    export_onnx(root / "ckpt", tmp_path / "onnx")
    report = verify(root / "ckpt", tmp_path / "onnx")
    assert report["passed"], report["failures"]
    config = json.loads((tmp_path / "onnx" / "config.json").read_text())
    assert config["architectures"] == [FAMILIES[kind][0]]
    enc = rt.load(tmp_path / "onnx", threads=1)
    assert ("token_type_ids" in enc.inputs) == (kind == "bert")
    got = enc.embed(TEXTS, batch_size=2)
    ids, mask, _ = _batch(enc.encode(TEXTS))
    ids[~mask.bool()] = hf.config.pad_token_id
    _, ref = sentence_embeddings(hf, ids, mask, pooling="cls", normalize=False)
    assert np.abs(got - ref.numpy()).max() <= ATOL


# the classification heads: sequence (pooler / pre_classifier / classifier.dense on [CLS],
# then the labels) and token classifiers of each family, three named labels
HEAD_CASES = [(k, h) for k in ("bert", "distilbert", "roberta", "xlm-roberta", "modernbert")
              for h in ("sequence", "token")]


def _head_batch(tokenizer, pad: int):
    rows = [(e.ids, e.type_ids) for e in tokenizer.hf.encode_batch(TEXTS)]
    ids, mask, types = _batch(rows)
    ids[~mask.bool()] = pad
    return ids, mask, types


@pytest.mark.parametrize("kind, head", HEAD_CASES)
def test_each_classifier_head_matches_transformers(kind, head, tmp_path):
    from hf_fixtures import LABELS

    from tinyt.checkpoint import load_checkpoint
    from tinyt.hf import import_hf
    hf = save_encoder(kind, tmp_path / "hf", sentence=False, head=head, num_hidden_layers=1)
    import_hf(tmp_path / "hf", tmp_path / "ckpt")
    ckpt = load_checkpoint(tmp_path / "ckpt")
    assert ckpt.labels == list(LABELS)
    assert ckpt.config.task == ("classifier" if head == "sequence" else "token_classifier")
    ids, mask, types = _head_batch(ckpt.tokenizer, hf.config.pad_token_id)
    typed = {"token_type_ids": types} if kind == "bert" else {}
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, **typed).logits
        got = ckpt.model.eval()(ids, mask, types if kind == "bert" else None)
    diff = (got - ref)[mask.bool()] if head == "token" else got - ref
    assert got.shape == ref.shape and diff.abs().max() <= ATOL


def test_head_refusals_name_the_problem(tmp_path):
    from tinyt.hf import import_hf
    save_encoder("bert", tmp_path / "hf", sentence=False, head="sequence", num_hidden_layers=1,
                 problem_type="multi_label_classification")
    with pytest.raises(ConversionError, match="problem_type='multi_label_classification'"):
        import_hf(tmp_path / "hf", tmp_path / "ckpt")
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    cfg.update(problem_type=None, architectures=["BertForMaskedLM"])
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConversionError, match="tinyt imports BertModel, "
                       "BertForSequenceClassification, BertForTokenClassification"):
        import_hf(tmp_path / "hf", tmp_path / "ckpt")


@pytest.mark.slow
@pytest.mark.parametrize("kind, head", [("bert", "sequence"), ("bert", "token"),
                                        ("distilbert", "sequence"), ("roberta", "sequence"),
                                        ("modernbert", "sequence")])
def test_classifier_heads_through_export_verify_and_the_runtime(kind, head, tmp_path,
                                                                monkeypatch, capsys):
    from hf_fixtures import LABELS
    from transformers import AutoTokenizer

    import tinyt.runtime as rt
    from tinyt.export import export_onnx, verify
    from tinyt.hf import import_hf
    hf = save_encoder(kind, tmp_path / "hf", sentence=False, head=head)
    import_hf(tmp_path / "hf", tmp_path / "ckpt")
    export_onnx(tmp_path / "ckpt", tmp_path / "onnx")
    report = verify(tmp_path / "ckpt", tmp_path / "onnx")
    assert report["passed"], report["failures"]
    config = json.loads((tmp_path / "onnx" / "config.json").read_text())
    assert config["architectures"] == [type(hf).__name__]
    assert config["id2label"] == {str(i): n for i, n in enumerate(LABELS)}
    model = rt.load(tmp_path / "onnx", threads=1)
    batch = AutoTokenizer.from_pretrained(tmp_path / "hf")(  # cut where the model's context is
        TEXTS, padding=True, truncation=True, max_length=model.max_length, return_tensors="pt")
    with torch.no_grad():
        ref = torch.softmax(hf(**batch).logits, dim=-1).numpy()
    if head == "sequence":
        got = model.classify(TEXTS)
        probs = np.array([[p.probabilities[n] for n in LABELS] for p in got])
        assert np.abs(probs - ref).max() <= ATOL
        assert [p.label for p in got] == [LABELS[i] for i in ref.argmax(-1)]
        pair = AutoTokenizer.from_pretrained(tmp_path / "hf")(  # [CLS] a [SEP] b [SEP]
            TEXTS[0], TEXTS[4], return_tensors="pt")
        with torch.no_grad():
            pair_ref = torch.softmax(hf(**pair).logits, dim=-1).numpy()[0]
        got = model.classify([(TEXTS[0], TEXTS[4])])[0]
        assert np.abs(np.array([got.probabilities[n] for n in LABELS]) - pair_ref).max() \
            <= ATOL
        if kind == "bert":  # pinned shapes: texts cut at the pinned length, [SEP] kept
            from tinyt.export.package import package
            package(tmp_path / "onnx", tmp_path / "pinned", format="onnx",
                    fixed=["batch_size=2", "sequence_length=8"])
            pinned = rt.load(tmp_path / "pinned", threads=1)
            cut = AutoTokenizer.from_pretrained(tmp_path / "hf")(
                TEXTS[:3], padding=True, truncation=True, max_length=8, return_tensors="pt")
            with torch.no_grad():
                cut_ref = torch.softmax(hf(**cut).logits, dim=-1).numpy()
            got = pinned.classify(TEXTS[:3])
            assert np.abs(np.array([[p.probabilities[n] for n in LABELS] for p in got])
                          - cut_ref).max() <= ATOL
    else:
        assert isinstance(model, rt.TokenClassifier)
        tagged = model.tag(TEXTS)
        for row, ref_row, n in zip(tagged, ref, batch["attention_mask"].sum(1).tolist()):
            assert len(row) == n
            assert [t.label for t in row] == [LABELS[i] for i in ref_row[:n].argmax(-1)]
            assert np.abs(np.array([t.probability for t in row]) - ref_row[:n].max(-1)).max() \
                <= ATOL
        first = tagged[0][1]  # the first word's first piece, where it sits in the text
        assert TEXTS[0][first.start:first.end].lower() == first.token.lower().lstrip("#")
        code, out, _ = _cli(monkeypatch, capsys, "classify", tmp_path / "onnx", TEXTS[1])
        lines = out.splitlines()  # the text, then a line a token: piece, label, prob, span
        assert code in (0, None) and lines[0] == repr(TEXTS[1])
        assert [line.split("\t")[1] for line in lines[1:]] == [t.label for t in tagged[1]]


def test_older_and_odder_saves_import_as_transformers_loads_them(tmp_path):
    """A BERT save with gamma / beta LayerNorm names (transformers renames them); a RoBERTa
    classifier whose file also holds the base model's pooler (transformers leaves it unused)."""
    from safetensors.torch import load_file, save_file

    from tinyt.checkpoint import load_checkpoint
    from tinyt.hf import import_hf
    hf = save_encoder("bert", tmp_path / "old", sentence=False, num_hidden_layers=1)
    sd = load_file(tmp_path / "old" / "model.safetensors")
    renamed = {k.replace("LayerNorm.weight", "LayerNorm.gamma")
               .replace("LayerNorm.bias", "LayerNorm.beta"): v for k, v in sd.items()}
    assert renamed != sd
    save_file(renamed, tmp_path / "old" / "model.safetensors", metadata={"format": "pt"})
    import_hf(tmp_path / "old", tmp_path / "old-ckpt")
    ids = torch.tensor([[101, 500, 600, 102]])
    with torch.no_grad():
        assert (load_checkpoint(tmp_path / "old-ckpt").model(ids) -
                hf(input_ids=ids).last_hidden_state).abs().max() <= ATOL
    hf = save_encoder("roberta", tmp_path / "rc", sentence=False, head="sequence",
                      num_hidden_layers=1)
    sd = load_file(tmp_path / "rc" / "model.safetensors")
    sd.update({"roberta.pooler.dense.weight": torch.randn(64, 64),
               "roberta.pooler.dense.bias": torch.randn(64)})
    save_file(sd, tmp_path / "rc" / "model.safetensors", metadata={"format": "pt"})
    said: list[str] = []
    import_hf(tmp_path / "rc", tmp_path / "rc-ckpt", log=said.append)
    assert any("roberta.pooler.dense.weight" in s for s in said), said
    ids = torch.tensor([[0, 500, 600, 2]])
    with torch.no_grad():
        assert (load_checkpoint(tmp_path / "rc-ckpt").model(ids) -
                hf(input_ids=ids).logits).abs().max() <= ATOL


def test_settings_that_change_the_math_are_refused(tmp_path):
    from tinyt.hf import import_hf
    save_encoder("modernbert", tmp_path / "mb", sentence=False, num_hidden_layers=1,
                 rope_scaling={"rope_type": "linear", "factor": 4.0})
    with pytest.raises(ConversionError, match="rope scaling 'linear' is not implemented"):
        import_hf(tmp_path / "mb", tmp_path / "mb-ckpt")
    save_encoder("bert", tmp_path / "bt", sentence=False, num_hidden_layers=1)
    config = json.loads((tmp_path / "bt" / "tokenizer_config.json").read_text())
    (tmp_path / "bt" / "tokenizer_config.json").write_text(json.dumps(
        {**config, "do_lower_case": False}))
    with pytest.raises(ConversionError, match="do_lower_case=False but tokenizer.json's "
                                              "normalizer has lowercase=True"):
        import_hf(tmp_path / "bt", tmp_path / "bt-ckpt")
