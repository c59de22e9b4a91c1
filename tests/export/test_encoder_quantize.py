"""Quantized encoders (issue 31): a sentence-transformers BertModel at all-MiniLM-L6-v2's
settings (width 64, 2 layers, random weights) through export, optimize and quantize; the
artifact embeds through tinyt.runtime; its report (cosine to fp32, retrieval recall@10 on the
standard library's docstrings) is right where it can be checked and can fail; what does not
apply to an encoder is refused by name."""
import dataclasses
import json

import numpy as np
import onnx
import pytest
from cli_run import run_cli
from hf_fixtures import save_bert
from onnx import numpy_helper

from tinyt.export.accuracy import ENCODER_TARGETS, encoder_accuracy, recall_at_k, top_k
from tinyt.export.quantize import QuantizeError, quantize
from tinyt.export.retrieval_set import docstring_set

# The quantized sentence embedding's cosine to fp32, at least (8-bit weights). From the
# arithmetic, not from this machine: a symmetric 8-bit block of 64 Gaussian weights has a step
# of max|w| / 127 ~ 2.4 sigma / 127, so a rounding error of rms step / sqrt(12) ~ 0.55% of
# sigma; each matmul's output moves by that fraction of itself, and as much again for its int8
# activations (or 1.1% for the 7-bit weights of the qgemm kernels where a CPU's int8 sums
# saturate). 2 layers x 4 matmuls x (weights + activations) and the 3 embedding tables are ~20
# such independent errors: sqrt(20) x 1.1% ~ 5% of the embedding at the very worst, or up to
# ~15% if the random layers amplified it threefold, and cos = 1 - |error|^2 / 2 >= 0.989.
# 0.9 allows an error of 45%. Measured here: min 0.9998 (an error of ~1.5%). MatMulNBits
# computes the same integers on every CPU (docs/quantization.md), so only float summation
# order differs between machines (~1e-6).
COSINE_FLOOR = 0.9
# Two unrelated rankings of 500 passages share k^2 / 500 = 0.2 of their top 10 on average:
# recall 0.02 (measured for a model of other weights on the 200 hand-written passages: 0.055,
# k^2 / 200 = 0.05 expected). A metric that can fail stays well under 0.3 there.
UNRELATED_RECALL = 0.3
TEXTS = ["A man is eating food.", "short", "Ünïcode café, naïve façade — 東京!"]


_cli = run_cli


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    """(checkpoint, plain export, cpu-optimized graph) of the MiniLM-shaped fixture."""
    from tinyt.export import export_onnx
    from tinyt.export.optimize import optimize
    from tinyt.hf import import_hf
    root = tmp_path_factory.mktemp("enc")
    save_bert(root / "st", num_hidden_layers=2)
    import_hf(root / "st", root / "ckpt")
    export_onnx(root / "ckpt", root / "onnx")
    optimize(root / "onnx", root / "opt")
    return root / "ckpt", root / "onnx", root / "opt"


@pytest.fixture(scope="module")
def int8(encoder, tmp_path_factory):
    return quantize(encoder[2], tmp_path_factory.mktemp("q") / "int8")


def _ops(path) -> dict[str, int]:
    graph = onnx.load(str(path / "model.onnx"), load_external_data=False).graph
    counts: dict[str, int] = {}
    for n in graph.node:
        counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return counts


def _session(path):
    from tinyt.runtime.session import graph_session
    return graph_session(path, level="all")


def _report_is_sound(a: dict) -> None:
    assert (a["output"], a["queries"], a["passages"], a["texts"], a["k"]) == \
        ("sentence_embedding", 50, 500, 550, 10)
    assert a["set_digest"] == docstring_set().digest and "docstrings" in a["data"]
    for key in ("hit_rate_at_10_reference", "hit_rate_at_10"):
        assert 0.0 <= a[key] <= 1.0, (key, a[key])
    assert 0 < a["longest_text_tokens"] <= a["max_length"] == 256  # sentence_bert_config's cut
    for key in ("cosine_min", "cosine_mean", "recall_at_10", "recall_at_10_worst_query"):
        assert 0.0 <= a[key] <= 1.0, (key, a[key])
    assert a["cosine_min"] <= a["cosine_mean"] and a["recall_at_10_worst_query"] <= \
        a["recall_at_10"]
    assert a["targets"] == ENCODER_TARGETS
    assert a["meets_targets"] == all(a[m] >= t for m, t in ENCODER_TARGETS.items())


def test_int8_encoder_quantizes_every_weight_embeds_and_reports(encoder, int8):
    import tinyt.runtime as rt
    ops = _ops(int8)
    # 2 layers x (qkv, attention out, mlp in, mlp out), and the word, position and type tables
    assert (ops.get("MatMulNBits"), ops.get("GatherBlockQuantized"), ops.get("MatMul", 0),
            ops.get("Gather", 0)) == (8, 3, 0, 0), ops
    m = json.loads((int8 / "manifest.json").read_text())
    assert m["graph"] == "encoder" and m["stage"] == "quantize"
    assert m["quantization"]["size_ratio"] < 0.3  # the 30,522 x 64 word table is most of it
    assert m["quantization"]["rows_independent"] and m["accuracy"]["batched"]
    assert m["int8"]["model.onnx"]["exact_on"] == "every CPU"
    a = m["accuracy"]
    _report_is_sound(a)
    assert a["cosine_min"] > COSINE_FLOOR, a
    enc, ref = rt.load(int8, threads=1), rt.load(encoder[2], threads=1)
    assert isinstance(enc, rt.Encoder)
    got, want = enc.embed(TEXTS), ref.embed(TEXTS)
    assert got.shape == want.shape == (3, 64) and got.dtype == np.float32
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)  # Normalize kept
    assert (got * want).sum(1).min() > COSINE_FLOOR


@pytest.mark.parametrize("kw, want", [
    (dict(kernel="qgemm"), {"DynamicQuantizeMatMul": 6, "MatMulInteger": 2}),  # attn.c_proj per row
    (dict(kernel="qgemm-rows"), {"MatMulInteger": 8}),
    (dict(mode="weight-only"), {"MatMulNBits": 8}),
    (dict(bits=4, block_size=32), {"MatMulNBits": 8}),
])
def test_each_kernel_and_mode_quantizes_an_encoder(encoder, int8, tmp_path, kw, want):
    out = quantize(encoder[2], tmp_path / "q", **kw)
    ops = _ops(out)
    assert {k: ops.get(k) for k in want} == want and ops.get("MatMul", 0) == 0, ops
    a = out.manifest["accuracy"]
    _report_is_sound(a)
    assert a["batched"] == (kw.get("kernel") != "qgemm")  # one scale per tensor: texts alone
    if kw.get("bits") == 4:  # 16 levels, not 255: a coarser step moves the embedding more
        assert a["cosine_mean"] < int8.manifest["accuracy"]["cosine_mean"]
    else:
        assert a["cosine_min"] > COSINE_FLOOR, a


def test_recall_and_cosine_can_fail(encoder, tmp_path):
    """The report against fp32 itself is perfect; against a model of the same shape with
    other weights, recall is near chance and the embeddings are unrelated."""
    from tinyt.runtime.session import open_artifact
    from tinyt.tokenizer import Tokenizer
    opt = encoder[2]
    proto = onnx.load(str(opt / "model.onnx"))
    rng = np.random.default_rng(1)
    for init in proto.graph.initializer:  # every weight matrix and table drawn again
        w = numpy_helper.to_array(init)
        if w.ndim == 2 and w.dtype == np.float32:
            init.CopyFrom(numpy_helper.from_array(
                rng.normal(0, w.std(), w.shape).astype(np.float32), init.name))
    onnx.save(proto, str(tmp_path / "other.onnx"))
    art, ref = open_artifact(opt), _session(opt / "model.onnx")
    tok = Tokenizer.from_file(opt / "tokenizer.json")
    same = encoder_accuracy(ref, ref, art, tok)
    _report_is_sound(same)
    assert same["recall_at_10"] == same["recall_at_10_worst_query"] == 1.0
    assert same["cosine_min"] > 1 - 1e-6
    broken = encoder_accuracy(ref, _session(tmp_path / "other.onnx"), art, tok)
    assert broken["recall_at_10"] < UNRELATED_RECALL, broken
    assert broken["cosine_mean"] < 0.5 and not broken["meets_targets"], broken


def test_top_k_and_recall_by_hand():
    # 4 passages on a circle; queries at angle 0 and pi/2
    p = np.array([[1, 0], [0.9, 0.1], [0, 1], [-1, 0]], np.float32)
    q = np.array([[1, 0], [0, 2]], np.float32)  # the length does not matter: cosine
    assert top_k(q, p, 2).tolist() == [[0, 1], [2, 1]]
    assert recall_at_k(np.array([[0, 1], [2, 1]]), np.array([[1, 0], [3, 1]])).tolist() == \
        [2, 1]  # hits: divided by k where reported (49 of 50 is 0.98, not 0.97999...)


def test_search_budgets_an_encoders_recall(encoder, tmp_path):
    from tinyt.export.search import quantize_search
    out = quantize_search(encoder[2], tmp_path / "best", max_loss_increase=1.0)
    s = out.manifest["search"]
    names = [t["variant"] for t in s["tried"]]
    assert names == ["dynamic-int8", "dynamic-int8-block32", "dynamic-int4",
                     "dynamic-int8-qgemm"], names  # no lm_head to exclude or keep
    assert all(0 <= t["cost"] <= 1 and t["within_budget"] for t in s["tried"])
    assert s["chosen"] in names and "forward of 256 tokens" in s["objective"]
    chosen = next(t for t in s["tried"] if t["variant"] == s["chosen"])
    assert chosen["cost"] == pytest.approx(1 - out.manifest["accuracy"]["recall_at_10"])


def test_what_does_not_apply_to_an_encoder_is_refused(encoder, tmp_path):
    opt = encoder[2]
    for src, kw, said in (
            (opt, dict(mode="static"), "static .QDQ. quantization takes the plain export"),
            (opt, dict(data=str(tmp_path)), "passages drawn from the standard library"),
            (opt, dict(bits=4, keep_8bit=["lm_head"]), "names no module with weights")):
        with pytest.raises(QuantizeError, match=said):
            quantize(src, tmp_path / "q", **kw)
        assert not (tmp_path / "q").exists()


def test_an_encoder_without_pooling_is_compared_on_hidden_states(encoder, tmp_path):
    """A hidden-states-only encoder (pooling None): cosine per token, no recall; the search,
    which budgets recall, refuses it."""
    from tinyt.checkpoint import load_checkpoint, save_checkpoint
    from tinyt.export import export_onnx
    from tinyt.export.search import quantize_search
    ckpt = load_checkpoint(encoder[0])
    ckpt.model.config = dataclasses.replace(ckpt.config, pooling=None, normalize=False)
    save_checkpoint(tmp_path / "ckpt", ckpt.model, ckpt.tokenizer)
    export_onnx(tmp_path / "ckpt", tmp_path / "onnx")
    a = quantize(tmp_path / "onnx", tmp_path / "q").manifest["accuracy"]
    assert a["output"] == "last_hidden_state" and "recall_at_10" not in a
    assert a["tokens"] >= a["texts"] == 550 and COSINE_FLOOR < a["cosine_min"] <= 1.0, a
    with pytest.raises(QuantizeError, match="without a pooling"):
        quantize_search(tmp_path / "onnx", tmp_path / "s", max_loss_increase=0.1)


def test_quantize_cli_prints_an_encoders_report(encoder, tmp_path, monkeypatch, capsys):
    code, out, err = _cli(monkeypatch, capsys, "quantize", encoder[2], tmp_path / "q")
    assert code in (0, None), err
    said = dict(line.split(maxsplit=1) for line in out.splitlines() if line[:1].islower()
                and len(line.split()) == 2)
    assert COSINE_FLOOR < float(said["cosine_min"]) <= 1.0 and 0 <= float(
        said["recall_at_10"]) <= 1.0, out
    code, out, err = _cli(monkeypatch, capsys, "quantize", encoder[2], tmp_path / "s",
                          "--mode", "static")  # static reads the plain export
    assert code == 2 and "takes the plain export, not the output of stage 'optimize'" in err
