"""Static (QDQ) INT8 for the graphs that read a text whole (issue 31): a sentence-transformers
BertModel at all-MiniLM-L6-v2's settings (width 64, 2 layers), a RoBERTa sequence classifier
and a BERT token classifier (1 layer each), random weights. The calibration feeds training
text as the runtime feeds it (checked against transformers' tokenizer); the graphs are QDQ on
the weight matmuls and embedding tables only; each report (cosine and recall@10, label
agreement) is recomputed here from the two artifacts' outputs through tinyt.runtime; label
agreement can fail, and is what every imported classifier now reports; bad requests are
refused by name."""
import json

import numpy as np
import onnx
import pytest
from cli_run import run_cli
from hf_fixtures import LABELS, save_bert, save_encoder
from onnx import helper, numpy_helper

from tinyt.errors import DataError
from tinyt.export.quantize import QuantizeError, quantize
from tinyt.export.retrieval_set import PASSAGES, QUERIES, TOPICS, docstring_set
from tinyt.hardware import int8_preset

# Each text's quantized sentence embedding against fp32's, at least. Static QDQ rounds each
# weight matmul's weights per output channel (int8, a step of max|w| / 127: 0.55% of sigma
# rms for Gaussian weights, twice that at 7 bits), its input activations per tensor (uint8
# over the calibrated range, ~5 sigma of a LayerNorm's output each side: a step of 10 sigma /
# 255, 1.1% rms) and the three tables per tensor (uint8 over the table's whole range, 1.1%).
# 2 layers x 4 matmuls x 2 roundings + 3 tables ~ 20 independent errors of ~1-2%: sqrt(20) x
# 2% ~ 9% of the embedding at the very worst, so cos = 1 - |error|^2 / 2 >= 0.99; 0.9 allows
# an error of 45%. Measured: min 0.9996 (0.9990 with 7-bit weights).
COSINE_FLOOR = 0.9
# The report's figures against the same figures computed here from the artifacts: the
# reference runs in batches of 32 in both, the static candidate each text alone in both, so
# the embeddings and logits agree to float summation order (~1e-7; ONNX Runtime's session
# options differ: threads, level). A ranking or a label flips only where two scores are that
# close: at most one passage of one query (recall 0.1 / 50 queries) or one label.
RECOMPUTE_ATOL = 1e-5
ONE_PASSAGE = 0.1 / len(docstring_set().queries)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """{name: (hf directory, plain export)}, and the encoder's cpu-optimized graph."""
    from tinyt.export import export_onnx
    from tinyt.export.optimize import optimize
    from tinyt.hf import import_hf
    root = tmp_path_factory.mktemp("static")
    save_bert(root / "enc-hf", num_hidden_layers=2)
    save_encoder("roberta", root / "seq-hf", sentence=False, head="sequence",
                 num_hidden_layers=1)
    save_encoder("bert", root / "tok-hf", sentence=False, head="token", num_hidden_layers=1)
    out = {}
    for name in ("enc", "seq", "tok"):
        import_hf(root / f"{name}-hf", root / f"{name}-ckpt")
        out[name] = (root / f"{name}-hf", export_onnx(root / f"{name}-ckpt", root / name))
    out["enc-opt"] = (None, optimize(out["enc"][1], root / "enc-opt"))
    return out


@pytest.fixture(scope="module")
def static(models, tmp_path_factory):
    root = tmp_path_factory.mktemp("static-q")
    return {name: quantize(models[name][1], root / name, mode="static")
            for name in ("enc", "seq", "tok")}


def _nodes(path):
    return onnx.load(str(path / "model.onnx"), load_external_data=False).graph


def test_only_weight_matmuls_and_tables_are_qdq(models, static):
    graph = _nodes(static["enc"])
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    made_by = {o: n for n in graph.node for o in n.output}
    assert all(n.domain in ("", "ai.onnx") for n in graph.node)  # standard ops only
    dq_of = {n.output[0]: inits.get(n.input[0]) for n in graph.node
             if n.op_type == "DequantizeLinear"}
    weights = [a for a in dq_of.values() if a is not None and a.dtype == np.int8]
    tables = [a for a in dq_of.values() if a is not None and a.dtype == np.uint8]
    # 2 layers x (qkv, attention out, mlp in, mlp out); word, position and type tables
    assert (len(weights), sorted(t.shape for t in tables)) == \
        (8, [(2, 64), (512, 64), (30522, 64)])
    matmuls = [n for n in graph.node if n.op_type == "MatMul"]
    layer = [n for n in matmuls if n.name.rsplit("/", 2)[-2] in ("c_attn", "c_proj", "c_fc")]
    assert len(matmuls) == 12 and len(layer) == 8, [n.name for n in matmuls]
    for n in matmuls:  # weights and their inputs through QDQ; attention's scores stay float
        fed = [made_by.get(x) for x in n.input]
        quantized = [f is not None and f.op_type == "DequantizeLinear" for f in fed]
        assert quantized == ([True, True] if n in layer else [False, False]), n.name
    preset = int8_preset()
    limit = 64 if preset["reduce_range"] else 127  # 7 bits where int8 sums saturate
    assert max(int(np.abs(w.astype(np.int32)).max()) for w in weights) <= limit
    m = static["enc"].manifest
    assert m["graph"] == "encoder" and m["options"]["mode"] == "static"
    assert m["int8"]["model.onnx"]["u8s8_gemm"] and \
        m["int8"]["model.onnx"]["weight_bits"] == (7 if preset["reduce_range"] else 8)
    cal = m["quantization"]["calibration_set"]
    assert (cal["texts"], cal["batch"], cal["pairs"]) == (32, 4, 0)
    # the cut of sentence_bert_config (256), under check_tokens (the 512-row table)
    assert 2 < cal["shortest_tokens"] < cal["longest_tokens"] <= 256
    assert cal["data"].startswith("Python standard library")


def test_seven_bit_weights_when_asked(models, tmp_path):
    """reduce_range (the preset on x86 without VNNI): |w| <= 64, so a u8 x s8 pair sums to at
    most 2 x 255 x 64 = 32640 < 32767 and the graph is exact on every CPU."""
    out = quantize(models["tok"][1], tmp_path / "q7", mode="static", reduce_range=True)
    graph = _nodes(out)
    ws = [numpy_helper.to_array(i) for i in graph.initializer if i.data_type == onnx.TensorProto.INT8]
    assert ws and max(int(np.abs(w.astype(np.int32)).max()) for w in ws) <= 64
    assert out.manifest["int8"]["model.onnx"] == {"u8s8_gemm": True, "weight_bits": 7,
                                                  "exact_on": "every CPU"}


def _calibration_matches_transformers(models, name, kind):
    """Every calibration row is transformers' tokenization of its text (special tokens, the
    cut, token types), right-padded under the mask to one length for all batches."""
    from transformers import AutoTokenizer

    from tinyt.export.qdq import calibration_batches, calibration_texts
    from tinyt.export.stage import open_source
    from tinyt.export.text_batches import runtime_cut
    from tinyt.runtime.feeds import check_tokens
    from tinyt.tokenizer import Tokenizer
    hf_dir, plain = models[name]
    src = open_source(plain)
    tok = Tokenizer.from_file(plain / "tokenizer.json")
    batches, info = calibration_batches(tok, src.config, kind, None)
    items, _ = calibration_texts(kind, None)
    hf = AutoTokenizer.from_pretrained(hf_dir)
    cut = min(runtime_cut(tok, src.config), check_tokens(src.config))
    assert len({b["input_ids"].shape for b in batches}) == 1 and len(batches) == 8
    for b, part in zip(batches, [items[i:i + 4] for i in range(0, len(items), 4)]):
        assert b["attention_mask"].sum() < b["attention_mask"].size  # padding in every batch
        for r, item in enumerate(part):
            want = hf(*([item] if isinstance(item, str) else item), truncation=True,
                      max_length=cut)
            real = b["attention_mask"][r].astype(bool)
            assert b["input_ids"][r][real].tolist() == want["input_ids"], item
            assert real[:real.sum()].all()  # right padding
            if "token_type_ids" in b:
                assert b["token_type_ids"][r][real].tolist() == want["token_type_ids"]
    return info


def test_calibration_feeds_as_transformers_tokenizes(models):
    seq = _calibration_matches_transformers(models, "seq", "classifier")  # pairs, no types
    assert seq["pairs"] == 8
    tok = _calibration_matches_transformers(models, "tok", "token_classifier")  # types
    assert tok["pairs"] == 0


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def test_static_encoder_report_is_what_the_artifacts_give(models, static):
    import tinyt.runtime as rt
    a = static["enc"].manifest["accuracy"]
    rs = docstring_set()  # what the report measures on
    assert a["batched"] is False and a["texts"] == 550  # per-tensor scales: each text alone
    ref, cand = rt.load(models["enc"][1], threads=1), rt.load(static["enc"], threads=1)
    texts = [*rs.queries, *rs.passages]
    x, y = ref.embed(texts, batch_size=32), cand.embed(texts, batch_size=1)
    cos = (_unit(x.astype(np.float64)) * _unit(y.astype(np.float64))).sum(-1)
    n = len(rs.queries)

    def top10(e):
        e = _unit(e.astype(np.float64))
        return np.argsort(-(e[:n] @ e[n:].T), axis=-1, kind="stable")[:, :10]

    recall = np.mean([len(set(p) & set(q)) / 10 for p, q in zip(top10(x), top10(y))])
    assert abs(a["cosine_min"] - cos.min()) <= RECOMPUTE_ATOL
    assert abs(a["cosine_mean"] - cos.mean()) <= RECOMPUTE_ATOL
    assert abs(a["recall_at_10"] - recall) <= ONE_PASSAGE + 1e-12
    assert a["cosine_min"] > COSINE_FLOOR, a


def _neg_logits(src, dst):
    """The graph with its logits negated: every argmax becomes the argmin."""
    proto = onnx.load(str(src / "model.onnx"))
    for n in proto.graph.node:
        n.output[:] = ["logits_raw" if o == "logits" else o for o in n.output]
    proto.graph.node.append(helper.make_node("Neg", ["logits_raw"], ["logits"]))
    onnx.save(proto, str(dst))
    return dst


def _probabilities(preds):
    return np.array([[p.probabilities[label] for label in LABELS] for p in preds], np.float64)


def test_sequence_classifier_agreement_is_what_the_artifacts_give(models, static):
    import tinyt.runtime as rt
    a = static["seq"].manifest["accuracy"]
    items = [*QUERIES, *PASSAGES, *((q, p) for q, ps in TOPICS.values() for p in ps)]
    assert (a["agreement_unit"], a["agreement_texts"], a["agreement_pairs"],
            a["agreement_compared"]) == ("text", 220, 200, len(items))
    assert "accuracy" not in a  # an imported classifier: no labelled data of its labels
    ref, cand = rt.load(models["seq"][1], threads=1), rt.load(static["seq"], threads=1)
    p, q = _probabilities(ref.classify(items)), _probabilities(cand.classify(items, batch_size=1))
    same = p.argmax(-1) == q.argmax(-1)
    assert abs(a["label_agreement"] - same.mean()) <= 1 / len(items) + 1e-12
    kl = (p * (np.log(p) - np.log(q))).sum(-1).mean()
    assert abs(a["kl_divergence"] - kl) <= RECOMPUTE_ATOL
    assert a["reference_labels_used"] == len(set(p.argmax(-1)))
    # A label flips only where fp32's top two logits are within 2 x max |logit difference|
    top2 = np.sort(np.log(p), axis=-1)[:, -2:]
    margin = top2[:, 1] - top2[:, 0]
    assert (margin[~same] <= 2 * a["max_abs_logit_diff"] + RECOMPUTE_ATOL).all()
    assert a["label_agreement"] >= (margin > 2 * a["max_abs_logit_diff"]).mean()


def test_token_classifier_agreement_is_what_the_artifacts_give(models, static):
    import tinyt.runtime as rt
    a = static["tok"].manifest["accuracy"]
    texts = [*QUERIES, *PASSAGES]
    ref, cand = rt.load(models["tok"][1], threads=1), rt.load(static["tok"], threads=1)
    ta, tb = ref.tag(texts), cand.tag(texts, batch_size=1)
    pairs = [(x, y) for ra, rb in zip(ta, tb) for x, y in zip(ra, rb)]
    assert all(x.token == y.token for x, y in pairs)
    assert (a["agreement_unit"], a["agreement_texts"], a["agreement_compared"]) == \
        ("token", 220, len(pairs))  # every token, [CLS] and [SEP] too
    same = np.mean([x.label == y.label for x, y in pairs])
    assert abs(a["label_agreement"] - same) <= 1 / len(pairs) + 1e-12


@pytest.mark.parametrize("name, kind", [("seq", "classifier"), ("tok", "token_classifier")])
def test_agreement_can_fail(models, tmp_path, name, kind):
    """Against itself: agreement 1, KL 0; against its own logits negated: agreement 0."""
    from tinyt.export.accuracy import label_agreement
    from tinyt.export.stage import open_source
    from tinyt.runtime.session import graph_session
    from tinyt.tokenizer import Tokenizer
    plain = models[name][1]
    cfg = open_source(plain).config
    tok = Tokenizer.from_file(plain / "tokenizer.json")
    ref = graph_session(plain / "model.onnx", level="all")
    same = label_agreement(ref, ref, cfg, kind, tok)
    assert (same["label_agreement"], same["kl_divergence"], same["max_abs_logit_diff"]) == \
        (1.0, 0.0, 0.0)
    neg = label_agreement(ref, graph_session(_neg_logits(plain, tmp_path / "neg.onnx"),
                                             level="all"), cfg, kind, tok)
    assert neg["label_agreement"] == 0.0 and neg["kl_divergence"] > 0, neg


@pytest.mark.parametrize("name", ["seq", "tok"])
def test_dynamic_int8_of_an_imported_classifier_reports_agreement(models, tmp_path, name):
    """Before, these asked the built-in labelled set (other labels) or corpus windows."""
    out = quantize(models[name][1], tmp_path / "q")
    a = out.manifest["accuracy"]
    assert a["batched"] is True and 0.0 <= a["label_agreement"] <= 1.0
    assert a["max_abs_logit_diff"] > 0 and a["kl_divergence"] >= 0
    assert 1 <= a["reference_labels_used"] <= len(LABELS)


def _labelled(root, labels):
    """A directory per label, four files each of plain sentences (enough training snippets
    to calibrate on)."""
    rng = np.random.default_rng(0)
    for label in labels:
        (root / label).mkdir(parents=True)
        for i in range(4):
            lines = [" ".join(rng.choice(PASSAGES[j % 200].split(), 8)) for j in range(i, 400, 4)]
            (root / label / f"{label}-{i}.txt").write_text(f"{label}\n" + "\n".join(lines))
    return root


def test_labelled_data_adds_accuracy_beside_agreement(models, tmp_path):
    data = _labelled(tmp_path / "labelled", LABELS)
    out = quantize(models["seq"][1], tmp_path / "q", mode="static", data=str(data))
    m = out.manifest
    a = m["accuracy"]
    assert a["data"] == "classification" and a["examples"] > 0
    assert 0 <= a["accuracy"] <= 1 and a["accuracy_change"] == pytest.approx(
        a["accuracy"] - a["accuracy_reference"])
    assert a["agreement_compared"] == 420 and 0 <= a["label_agreement"] <= 1
    assert m["quantization"]["calibration_set"]["data"] == str(data)  # its training texts
    other = _labelled(tmp_path / "other", ["spam", "ham", "eggs"])
    with pytest.raises(DataError, match="are not the model's"):
        quantize(models["seq"][1], tmp_path / "o", data=str(other))
    assert not (tmp_path / "o").exists()


def test_tinyt_classifier_static_keeps_its_labelled_accuracy(tiny_clf, labelled_dir, tmp_path):
    """tinyt's own classifier (no [CLS], no token types), static now too: accuracy on the
    labelled directory's validation split, as the runtime classifies it, beside agreement."""
    import tinyt.runtime as rt
    from tinyt import data as D
    from tinyt.export import export_onnx
    plain = export_onnx(tiny_clf, tmp_path / "onnx")
    out = quantize(plain, tmp_path / "q", mode="static", data=str(labelled_dir))
    a = out.manifest["accuracy"]
    val = D.load_classification(str(labelled_dir)).val
    assert a["examples"] == len(val) and a["agreement_compared"] == 420
    for key, path in (("accuracy_reference", plain), ("accuracy", out)):
        preds = rt.load(path, threads=1).classify([t for t, _ in val], batch_size=8)
        right = np.mean([p.label == ("maths", "strings")[y] for p, (_, y) in zip(preds, val)])
        assert abs(a[key] - right) <= 1 / len(val) + 1e-12, key  # a near-tie at most


def test_bad_requests_are_refused_by_name(models, tmp_path, monkeypatch):
    enc, opt, tok = models["enc"][1], models["enc-opt"][1], models["tok"][1]
    for src, kw, said in (
            (enc, dict(mode="static", bits=4), "static quantization is 8-bit only"),
            (opt, dict(mode="static"), "takes the plain export.*rotary"),
            (enc, dict(mode="static", kernel="qgemm"), "kernel='qgemm' with mode='static'"),
            (enc, dict(mode="static", calibration="kl"), "calibration='kl' is not one of"),
            (enc, dict(mode="static", data=str(tmp_path)), "reads queries and passages drawn"),
            (tok, dict(mode="static", data=str(tmp_path)), "is a token classifier")):
        with pytest.raises(QuantizeError, match=said):
            quantize(src, tmp_path / "q", **kw)
        assert not (tmp_path / "q").exists()
    import tinyt.export.quantize as Q
    monkeypatch.setattr(Q, "saturates_here", lambda: True)
    with pytest.raises(QuantizeError, match="saturate on this CPU"):
        quantize(enc, tmp_path / "q", mode="static", reduce_range=False)
    assert not (tmp_path / "q").exists()


def test_cli_static_token_classifier_prints_agreement(models, tmp_path, monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, "quantize", models["tok"][1], tmp_path / "q",
                             "--mode", "static", "--calibration", "percentile")
    assert code in (0, None), err
    said = dict(line.split(maxsplit=1) for line in out.splitlines() if line[:1].islower()
                and len(line.split()) == 2)
    assert 0 <= float(said["label_agreement"]) <= 1 and float(said["max_abs_logit_diff"]) > 0
    manifest = json.loads((tmp_path / "q" / "manifest.json").read_text())
    assert manifest["options"]["calibration"] == "percentile"


def test_the_search_costs_every_report():
    """--max-loss-increase reads each kind's report: an imported classifier's has label
    agreement and no labelled accuracy."""
    from tinyt.export.search import cost

    assert cost({"val_loss_change": 0.01}) == 0.01
    assert cost({"recall_at_10": 0.97, "cosine_mean": 0.999}) == pytest.approx(0.03)
    assert cost({"accuracy_change": -0.02, "label_agreement": 0.9}) == pytest.approx(0.02)
    assert cost({"label_agreement": 0.983, "kl_divergence": 3e-4}) == pytest.approx(0.017)
