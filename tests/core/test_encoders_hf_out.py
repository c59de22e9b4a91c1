"""`tinyt export-hf` of encoders and their heads: each imported family and head goes back to
its own class (BertModel, DistilBertModel, RobertaModel, XLMRobertaModel, their sequence and
token classifiers), transformers loads it with nothing missing and gives tinyt's outputs, the
sentence-transformers layout and the tokenizer come back, and import -> export-hf -> import
is bit-identical."""
from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the peers / optimum extra")

from hf_fixtures import LABELS, save_encoder, sentence_embeddings  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from tinyt.checkpoint import load_checkpoint, save_checkpoint, unique_state_dict  # noqa: E402
from tinyt.errors import ConversionError  # noqa: E402
from tinyt.hf import HF_LOGITS_ATOL, import_hf, to_hf  # noqa: E402
from tinyt.hf.sentence import read_sentence_modules  # noqa: E402

TEXTS = ["A man is eating food.", "short", "Ünïcode café, naïve façade — 東京!",
         "def __init__(self): return None " * 3]
CLASSES = {"bert": "Bert", "distilbert": "DistilBert", "roberta": "Roberta",
           "xlm-roberta": "XLMRoberta", "modernbert": "ModernBert"}
# head None: a sentence-transformers directory (mean pooling, Normalize, cut at 256 tokens);
# "plain": the base model alone (hidden states; no sentence-transformers layout written)
CASES = [(k, h) for k in CLASSES for h in (None, "sequence", "token")] + [("bert", "plain")]
AUTO = {None: "AutoModel", "plain": "AutoModel", "sequence": "AutoModelForSequenceClassification",
        "token": "AutoModelForTokenClassification"}


def _class(kind: str, head: str | None) -> str:
    return CLASSES[kind] + {"sequence": "ForSequenceClassification",
                            "token": "ForTokenClassification"}.get(head, "Model")


@pytest.fixture(scope="module")
def trip(request, tmp_path_factory):
    """(kind, head, source checkpoint, the written directory, the checkpoint imported back
    from it, what to_hf said), once per case for the module."""
    kind, head = request.param
    root = tmp_path_factory.mktemp(f"{kind}-{head}")
    save_encoder(kind, root / "hf", sentence=head is None,
                 head=None if head == "plain" else head, num_hidden_layers=1)
    said: list[str] = []
    src = import_hf(root / "hf", root / "ckpt")
    out = to_hf(src, root / "out", log=said.append)
    back = import_hf(out, root / "back")
    return kind, head, load_checkpoint(src), out, load_checkpoint(back), said


@pytest.mark.parametrize("trip", CASES, indirect=True, ids=[f"{k}-{h}" for k, h in CASES])
def test_each_family_and_head_goes_back_to_its_class_bit_identically(trip):
    kind, head, src, out, back, said = trip
    meta = json.loads((out / "config.json").read_text())
    assert meta["architectures"] == [_class(kind, head)]
    output = "last_hidden_state" if head in (None, "plain") else "logits"
    assert meta["tinyt"][f"{output}_max_abs_diff"] <= HF_LOGITS_ATOL
    # import -> export-hf -> import: the same config, labels, tokenizer and weights, bit for bit
    assert back.config == src.config
    assert back.labels == src.labels == (list(LABELS) if head in ("sequence", "token") else None)
    assert back.tokenizer.hf.to_str() == src.tokenizer.hf.to_str()  # truncation included
    assert back.tokenizer.settings == src.tokenizer.settings
    a, b = unique_state_dict(src.model), unique_state_dict(back.model)
    assert a.keys() == b.keys()
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    if head in ("sequence", "token"):
        assert meta["id2label"] == {str(i): n for i, n in enumerate(LABELS)}
        assert meta["label2id"] == {n: i for i, n in enumerate(LABELS)}
    # the base models' pooler: tinyt drops it on import; written as zeros, and said
    pooled = kind not in ("distilbert", "modernbert") and head in (None, "plain")
    assert ("pooler" in meta["tinyt"]) == pooled
    if pooled:
        tensors = load_file(out / "model.safetensors")
        assert meta["tinyt"]["pooler"]["tensors"] == ["pooler.dense.bias", "pooler.dense.weight"]
        assert "not the original" in meta["tinyt"]["pooler"]["weights"]
        assert not tensors["pooler.dense.weight"].any() and not tensors["pooler.dense.bias"].any()
        assert any("pooler" in s and "not the original" in s for s in said), said


LOADED = [("bert", None), ("distilbert", "sequence"), ("roberta", "token"),
          ("xlm-roberta", None), ("bert", "plain"), ("modernbert", "sequence")]


@pytest.mark.parametrize("trip", LOADED, indirect=True, ids=[f"{k}-{h}" for k, h in LOADED])
def test_transformers_loads_it_whole_and_gives_tinyt_outputs(trip):
    """AutoModel* load it with no weight missing (no pooler drawn at random), AutoTokenizer
    gives tinyt's ids and feeds what the class takes, and a padded batch through both agrees;
    a sentence-transformers layout reads back as it was imported."""
    kind, head, src, out, _, _ = trip
    model, info = getattr(transformers, AUTO[head]).from_pretrained(out, output_loading_info=True)
    assert type(model).__name__ == _class(kind, head)
    assert {k: v for k, v in info.items() if v} == {}, info
    tok = transformers.AutoTokenizer.from_pretrained(out)
    for text in TEXTS:
        assert tok(text)["input_ids"] == src.tokenizer.hf.encode(text).ids, text
    batch = tok(TEXTS, padding=True, return_tensors="pt")
    assert ("token_type_ids" in batch) == (kind == "bert")
    mask = batch["attention_mask"]
    with torch.no_grad():
        theirs = model.eval()(**batch)
        ours = src.model(batch["input_ids"], mask, batch.get("token_type_ids"))
    if head in (None, "plain"):
        x = ours[0] if isinstance(ours, tuple) else ours
        assert (x - theirs.last_hidden_state)[mask.bool()].abs().max() <= HF_LOGITS_ATOL
    else:
        diff = (ours - theirs.logits)
        assert (diff[mask.bool()] if head == "token" else diff).abs().max() <= HF_LOGITS_ATOL
    modules = read_sentence_modules(out)  # an encoder's pooling is written as a Pooling module
    cfg = src.config
    if cfg.task != "encoder" or cfg.pooling is None:  # a head, a bare base model
        assert modules is None and head is not None
        return
    assert (modules.pooling, modules.normalize, modules.max_seq_length) == \
        (cfg.pooling, cfg.normalize, src.tokenizer.hf.truncation["max_length"])
    if head is None:  # the sentence-transformers directory's own settings
        assert (modules.pooling, modules.normalize, modules.max_seq_length) == \
            ("mean", True, 256)
    pooling = json.loads((out / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode_mean_tokens"] and not pooling["pooling_mode_cls_token"]
    _, e = sentence_embeddings(model, batch["input_ids"], mask, batch.get("token_type_ids"),
                               normalize=modules.normalize)
    assert (ours[1] - e).abs().max() <= HF_LOGITS_ATOL


def test_cls_pooling_without_normalize_round_trips(tmp_path):
    save_encoder("roberta", tmp_path / "hf", pooling="cls", normalize=False, max_seq_length=128,
                 num_hidden_layers=1)
    src = load_checkpoint(import_hf(tmp_path / "hf", tmp_path / "ckpt"))
    out = to_hf(tmp_path / "ckpt", tmp_path / "out")
    modules = read_sentence_modules(out)
    assert (modules.pooling, modules.normalize, modules.max_seq_length) == ("cls", False, 128)
    assert not (out / "2_Normalize").exists()
    back = load_checkpoint(import_hf(out, tmp_path / "back"))
    assert back.config == src.config and back.tokenizer.hf.truncation["max_length"] == 128


def test_the_recorded_class_is_kept_else_the_first_that_holds_it(tmp_path):
    """XLM-R and RoBERTa hold the same models: an XLM-R import goes back as XLM-R; a checkpoint
    without the record is written as the first class that holds it."""
    save_encoder("xlm-roberta", tmp_path / "hf", sentence=False, head="sequence",
                 num_hidden_layers=1)
    import_hf(tmp_path / "hf", tmp_path / "ckpt")
    meta = json.loads((to_hf(tmp_path / "ckpt", tmp_path / "a") / "config.json").read_text())
    assert meta["architectures"] == ["XLMRobertaForSequenceClassification"]
    config = tmp_path / "ckpt" / "config.json"
    data = json.loads(config.read_text())
    del data["metrics"]["architecture"]
    config.write_text(json.dumps(data))
    meta = json.loads((to_hf(tmp_path / "ckpt", tmp_path / "b") / "config.json").read_text())
    assert meta["architectures"] == ["RobertaForSequenceClassification"]


def test_a_wrong_conversion_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    from tinyt.hf import convert
    save_encoder("bert", tmp_path / "hf", sentence=False, head="token", num_hidden_layers=1)
    import_hf(tmp_path / "hf", tmp_path / "ckpt")
    real = convert.hf_state

    def swapped(family, model):  # q and k of the one layer exchanged: a plausible slip
        state = real(family, model)
        q, k = (f"bert.encoder.layer.0.attention.self.{n}.weight" for n in ("query", "key"))
        state[q], state[k] = state[k], state[q]
        return state
    monkeypatch.setattr(convert, "hf_state", swapped)
    with pytest.raises(ConversionError, match=r"BertForTokenClassification's logits differ "
                                              r"from tinyt's by .* \(allowed 0.0001\)"):
        to_hf(tmp_path / "ckpt", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_tinyts_own_classifier_is_refused_with_each_reason(tmp_path):
    from tinyt.config import ModelConfig
    from tinyt.model import build_model
    from tinyt.tokenizer import Tokenizer

    cfg = ModelConfig(task="classifier", num_labels=2, vocab_size=300, block_size=32, n_layer=1,
                      n_head=2, n_embd=16)
    src = save_checkpoint(tmp_path / "src", build_model(cfg), Tokenizer.byte_level(),
                          labels=["a", "b"])
    with pytest.raises(ConversionError, match="cannot be written as BertForSequence"
                                              "Classification / .*norm_placement='post'"):
        to_hf(src, tmp_path / "out")
    assert not (tmp_path / "out").exists()
