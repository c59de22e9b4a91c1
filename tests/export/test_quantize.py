import json
import re

import numpy as np
import onnx
import pytest

from tinyt.export.blockquant import SCHEMES, block_quantize, dequantize, excluded_by, pick_block
from tinyt.export.optimize import OptimizeError, op_counts, optimize
from tinyt.export.quantize import QuantizeError, quantize
from tinyt.manifest import check_manifest, read_model_config

INT8_LOSS_BUDGET = 0.02  # default INT8: validation loss within +2% of fp32


@pytest.fixture(scope="module")
def int8(lm_onnx, corpus_dir, tmp_path_factory):
    return quantize(lm_onnx, tmp_path_factory.mktemp("q") / "int8", data=str(corpus_dir))


def test_block_quantize_round_trip():
    """Each scheme rounds to the nearest of its levels (half a step at most, 0.0 exact), uses
    the levels it claims, and the scale search never does worse per block than its start."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 96)).astype(np.float32)
    w[0, :32] += 3  # an all-positive block: asymmetric's zero point at the lowest level
    w[1, 32:64] = 0  # an all-zero block
    for bits, block in ((8, 32), (4, 16), (4, 32)):
        nb = 96 // block
        for scheme in SCHEMES:
            q, s, z = block_quantize(w, bits, block, scheme)
            assert q.dtype == np.uint8 and q.shape == (6, nb, block * bits // 8)
            assert s.shape == (6, nb) and s.dtype == np.float32
            assert (z is None) == (scheme != "asymmetric")
            if z is not None:  # MatMulNBits' layout: 4-bit zero points two to a byte
                assert z.shape == (6, (nb * bits + 7) // 8) and z.dtype == np.uint8
            deq = dequantize(q, s, bits, z)
            step = np.abs(np.repeat(s, block, axis=1))
            levels = np.stack([q & 0x0F, q >> 4], -1) if bits == 4 else q
            # half a step, but symmetric-full's top level is one short of the other sign's
            # extreme: a value of that sign past 2^(bits-1) - 1 steps clips, within one step
            top = (levels.reshape(6, 96) == 2 ** bits - 1) & (scheme == "symmetric-full")
            bound = np.where(top, step, step / 2) + 1e-6
            assert (np.abs(deq - w) <= bound).all(), (bits, scheme)
            assert (deq[1, 32:64] == 0).all()
            if scheme == "symmetric":  # the lowest level unused: 2^bits - 1 levels
                assert levels.min() >= 1
            else:
                assert levels.min() == 0
            searched = block_quantize(w, bits, block, scheme, scale_search=True)
            errors = [np.square(d - w).reshape(6, nb, block).sum(-1)
                      for d in (dequantize(*searched[:2], bits, searched[2]), deq)]
            assert (errors[0] <= errors[1] + 1e-9).all()
    with pytest.raises(ValueError, match="scheme='q4_k' is not one of symmetric"):
        block_quantize(w, 4, 32, "q4_k")


@pytest.mark.parametrize("bits", [4, 8])
def test_onnx_runtime_reads_every_scheme_as_dequantize_does(bits):
    """MatMulNBits (fp32 products) and GatherBlockQuantized give dequantize's matrix for each
    scheme: negative scales (symmetric-full), zero points packed for an odd count of blocks."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    N, K, blk = 10, 96, 32
    w = rng.standard_normal((N, K)).astype(np.float32)
    w[0, :32] += 3
    x = rng.standard_normal((3, K)).astype(np.float32)
    for scheme in SCHEMES:
        q, s, z = block_quantize(w, bits, blk, scheme, scale_search=True)
        deq = dequantize(q, s, bits, z)
        zero = [] if z is None else ["z"]
        inits = [numpy_helper.from_array(q, "q"), numpy_helper.from_array(s, "s"),
                 numpy_helper.from_array(np.array([N, K * bits // 8], np.int64), "shape")]
        inits += [] if z is None else [numpy_helper.from_array(z, "z")]
        nodes = [helper.make_node("MatMulNBits", ["x", "q", "s", *zero], ["y"],
                                  domain="com.microsoft", K=K, N=N, bits=bits, block_size=blk,
                                  accuracy_level=0),
                 helper.make_node("Reshape", ["q", "shape"], ["q2"]),
                 helper.make_node("GatherBlockQuantized", ["q2", "ids", "s", *zero], ["e"],
                                  domain="com.microsoft", bits=bits, block_size=blk,
                                  gather_axis=0, quantize_axis=1)]
        graph = helper.make_graph(
            nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, K]),
                         helper.make_tensor_value_info("ids", TensorProto.INT64, [N])],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "e")],
            inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                        helper.make_opsetid("com.microsoft", 1)])
        sess = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"])
        y, e = sess.run(None, {"x": x, "ids": np.arange(N)})
        assert np.array_equal(e, deq), scheme
        # fp32 products of K=96 terms of magnitude <= ~4 x 3: float32 rounding, ~1e-5
        np.testing.assert_allclose(y, x @ deq.T, atol=1e-4, err_msg=scheme)


def test_pick_block_and_exclusion_matching():
    assert pick_block(128, 64) == 64 and pick_block(96, 64) == 32 and pick_block(24, 64) is None
    assert excluded_by("transformer.h.0.attn.c_attn", ["h.0"]) == "h.0"
    assert excluded_by("transformer.h.0.attn.c_attn", ["transformer.h.0"]) == "transformer.h.0"
    assert excluded_by("transformer.h.10.mlp.c_fc", ["h.1"]) is None
    assert excluded_by("lm_head", ["lm_head"]) == "lm_head"


def test_int8_quantizes_every_weight_and_shares_the_tied_table(int8, lm_onnx):
    manifest = check_manifest(int8)
    q = manifest["quantization"]
    cfg = json.loads((int8 / "config.json").read_text())["tinyt"]["model"]
    counts = op_counts(onnx.load(str(int8 / "model.onnx")))
    assert counts["com.microsoft.MatMulNBits"] == 4 * cfg["n_layer"] + 1  # blocks + lm_head
    assert counts["com.microsoft.GatherBlockQuantized"] == 2  # token and position embeddings
    model = onnx.load(str(int8 / "model.onnx"))
    weights = {i.name for i in model.graph.initializer}
    float_matmuls = [n.name for n in model.graph.node
                     if n.op_type == "MatMul" and set(n.input) & weights]
    assert float_matmuls == []  # attention's activation x activation MatMuls stay, weights don't
    assert counts["MatMul"] == 2 * cfg["n_layer"]  # q @ k^T and attn @ v per layer
    assert q["shared_tables"] == ["model.lm_head.weight_q8"]
    V, E = cfg["vocab_size"], cfg["n_embd"]
    assert not [i.name for i in model.graph.initializer
                if i.data_type == onnx.TensorProto.FLOAT and sorted(i.dims) == sorted([V, E])]
    assert manifest["source"]["manifest"]["stage"] == "export"


def test_int8_accuracy_report(int8):
    a = check_manifest(int8)["accuracy"]
    assert a["val_loss_change"] <= INT8_LOSS_BUDGET
    assert a["top1_agreement"] >= 0.9
    assert 0.0 <= a["greedy_agreement"] <= 1.0
    assert a["val_nats_per_byte"] > 0 and a["tokens"] > 0
    assert 0.0 < a["kl_divergence"] < 0.01  # nats per token: INT8 barely moves the distribution


def test_greedy_prompts_batched_are_each_prompt_alone(int8, lm_onnx, monkeypatch):
    """The accuracy report's greedy prompts run as one batch through graphs whose rows are
    independent (fp32; MatMulNBits quantizes activations per row): each row's tokens are that
    prompt's alone, in batches of at most GREEDY_LOGITS prefill logits, never a padding id."""
    from tinyt.data import held_out_prompts, load_corpus
    from tinyt.export import compare
    from tinyt.export.compare import ort_greedy, ort_greedy_rows
    from tinyt.runtime.session import graph_session
    from tinyt.tokenizer import Tokenizer

    cfg, _ = read_model_config(int8)
    tok = Tokenizer.from_file(int8 / "tokenizer.json")
    prompts = held_out_prompts(tok, load_corpus(None).val, 5, 8)
    calls = []  # the rows of each batch decoded
    rows = compare._greedy_rows
    monkeypatch.setattr(compare, "_greedy_rows", lambda s, c, k, p, *a: calls.append(len(p))
                        or rows(s, c, k, p, *a))
    everything = compare.GREEDY_LOGITS
    for graph in (lm_onnx, int8):
        sess = graph_session(graph / "model.onnx", level="all")
        for limit in (None, 100):  # 100: as if the tokenizer reached only ids below it
            alone = [ort_greedy(sess, cfg, "decoder_with_past", p, 12, vocab_limit=limit)
                     for p in prompts]
            calls.clear()
            assert ort_greedy_rows(sess, cfg, "decoder_with_past", prompts, 12, limit) == alone
            assert calls == [5]  # one batch
            if limit:
                assert max(max(t) for t in alone) < limit
        monkeypatch.setattr(compare, "GREEDY_LOGITS", 2 * 8 * cfg.vocab_size)  # two rows
        calls.clear()
        assert ort_greedy_rows(sess, cfg, "decoder_with_past", prompts, 12) == \
            [ort_greedy(sess, cfg, "decoder_with_past", p, 12) for p in prompts]
        assert calls == [2, 2, 1] + [1] * 5  # the batches, then the five alone
        monkeypatch.setattr(compare, "GREEDY_LOGITS", everything)
        calls.clear()
        mixed = [prompts[0][:5], *prompts[1:]]  # lengths differ: each prompt alone
        assert [len(t) for t in ort_greedy_rows(sess, cfg, "decoder_with_past", mixed, 12)] \
            == [12] * 5
        assert calls == [1] * 5
    assert check_manifest(int8)["accuracy"]["greedy_batched"] is True


def test_kl_divergence_is_the_closed_form():
    from tinyt.export.accuracy import _kl_sum, _window_sums
    p, q = np.log([[0.5, 0.25, 0.25]]), np.log([[0.25, 0.5, 0.25]])
    assert _kl_sum(p, p) == pytest.approx(0.0, abs=1e-12)
    assert _kl_sum(p + 3.0, q) == pytest.approx(0.5 * np.log(2) + 0.25 * np.log(0.5))
    # and the targets' negative log-likelihood under each, from the same log-softmax
    nll_p, nll_q, kl = _window_sums(p + 3.0, q, np.array([1]))
    assert (nll_p, nll_q) == (pytest.approx(np.log(4)), pytest.approx(np.log(2)))
    assert kl == pytest.approx(_kl_sum(p, q))


def test_quantize_optimized_graph_and_4bit(lm_onnx, corpus_dir, tmp_path):
    opt = optimize(lm_onnx, tmp_path / "opt")
    q8 = quantize(opt, tmp_path / "opt-int8", data=str(corpus_dir))
    counts = op_counts(onnx.load(str(q8 / "model.onnx")))
    layers = read_model_config(q8)[0].n_layer
    assert counts["com.microsoft.MultiHeadAttention"] == layers  # fusions survive quantization
    q4 = quantize(opt, tmp_path / "opt-int4", bits=4, block_size=16, data=str(corpus_dir))
    s8 = check_manifest(q8)["quantization"]["bytes"]
    s4 = check_manifest(q4)["quantization"]["bytes"]
    assert s4 < s8
    assert check_manifest(q4)["quantization"]["shared_tables"] == ["model.lm_head.weight_q4"]
    kl8, kl4 = (check_manifest(q)["accuracy"]["kl_divergence"] for q in (q8, q4))
    assert 0 < kl8 < kl4  # 4-bit weights move the distribution further than 8-bit ones


def test_int4_keeps_the_tied_table_or_a_layer_at_8_bits(lm_onnx, corpus_dir, tmp_path):
    """keep_8bit=['lm_head'] in a 4-bit run: the tied table is quantized once at 8 bits and
    read by both the embedding's GatherBlockQuantized and the lm_head's MatMulNBits, the
    layers stay 4-bit; the table's error is 8-bit's, so the distribution moves less than with
    everything at 4 bits. A named layer is kept the same way."""
    opt = optimize(lm_onnx, tmp_path / "opt")
    q4 = quantize(opt, tmp_path / "q4", bits=4, block_size=16, data=str(corpus_dir))
    head8 = quantize(opt, tmp_path / "head8", bits=4, block_size=16, keep_8bit=["lm_head"],
                     data=str(corpus_dir))
    manifest = check_manifest(head8)
    q = manifest["quantization"]
    assert q["shared_tables"] == ["model.lm_head.weight_q8"]
    assert sorted(q["kept_8bit"]) == ["lm_head (FusedMatMul)", "transformer.wte (Gather)"]
    graph = onnx.load(str(head8 / "model.onnx")).graph
    bits = {n.name: [a.i for a in n.attribute if a.name == "bits"][0] for n in graph.node
            if n.op_type in ("MatMulNBits", "GatherBlockQuantized")}
    table_readers = [n for n in graph.node if n.op_type in ("MatMulNBits", "GatherBlockQuantized")
                     and any(i.startswith("model.lm_head.weight_q8") for i in n.input)]
    assert len(table_readers) == 2 and all(bits[n.name] == 8 for n in table_readers)
    assert sorted(set(bits.values())) == [4, 8] and \
        sum(b == 4 for b in bits.values()) == len(bits) - 2  # every layer's matmul at 4 bits
    assert manifest["options"]["keep_8bit"] == ["lm_head"]
    kl4, kl48 = (check_manifest(d)["accuracy"]["kl_divergence"] for d in (q4, head8))
    assert kl48 < kl4
    assert check_manifest(head8)["quantization"]["bytes"] > \
        check_manifest(q4)["quantization"]["bytes"]
    layer = quantize(opt, tmp_path / "h0", bits=4, block_size=16, keep_8bit=["h.0"],
                     data=str(corpus_dir))
    kept = check_manifest(layer)["quantization"]["kept_8bit"]
    assert kept and all(".h.0." in k for k in kept)
    assert check_manifest(layer)["quantization"]["shared_tables"] == ["model.lm_head.weight_q4"]
    for kw, needle in ((dict(bits=8, keep_8bit=["lm_head"]), "keeps modules at 8 bits in a 4-bit"),
                       (dict(bits=4, keep_8bit=["h.9"]), "--keep-8bit h.9 names no module")):
        with pytest.raises(QuantizeError, match=needle):
            quantize(opt, tmp_path / "bad", data=str(corpus_dir), **kw)
        assert not (tmp_path / "bad").exists()


def test_int4_schemes_zero_points_and_scale_search(lm_onnx, corpus_dir, tmp_path):
    """scheme='asymmetric' gives every MatMulNBits and the embedding's GatherBlockQuantized a
    zero-point input (the tied table's read by both), costs bytes for them, and moves the
    distribution less than 'symmetric' at the same block size; the manifest says which."""
    opt = optimize(lm_onnx, tmp_path / "opt")
    kl, size = {}, {}
    for scheme, search in (("symmetric", False), ("symmetric-full", True), ("asymmetric", True)):
        out = quantize(opt, tmp_path / scheme, bits=4, block_size=16, scheme=scheme,
                       scale_search=search, data=str(corpus_dir))
        manifest = check_manifest(out)
        assert (manifest["options"]["scheme"], manifest["options"]["scale_search"]) == \
            (scheme, search)
        kl[scheme] = manifest["accuracy"]["kl_divergence"]
        size[scheme] = manifest["quantization"]["bytes"]
        graph = onnx.load(str(out / "model.onnx")).graph
        readers = [n for n in graph.node if n.op_type in ("MatMulNBits", "GatherBlockQuantized")]
        zeros = {n.input[3] for n in readers if len(n.input) > 3}
        if scheme == "asymmetric":
            assert all(len(n.input) == 4 for n in readers)
            assert "model.lm_head.weight_zero_points" in zeros
            assert sum("model.lm_head.weight_zero_points" in n.input for n in readers) == 2
        else:
            assert not zeros
    assert size["symmetric"] == size["symmetric-full"] < size["asymmetric"]
    assert kl["asymmetric"] < kl["symmetric"] and kl["symmetric-full"] < kl["symmetric"]
    # the tied table kept at 8 bits stays symmetric (no zero points); the layers do not
    mixed = quantize(opt, tmp_path / "mixed", bits=4, block_size=16, scheme="asymmetric",
                     keep_8bit=["lm_head"], data=str(corpus_dir))
    readers = [n for n in onnx.load(str(mixed / "model.onnx")).graph.node
               if n.op_type in ("MatMulNBits", "GatherBlockQuantized")]
    table = [n for n in readers if any(i.endswith("weight_q8") or i.endswith("weight_q8_2d")
                                       for i in n.input)]
    assert len(table) == 2 and all(len(n.input) == 3 for n in table)
    assert all(len(n.input) == 4 for n in readers if n not in table)


def test_exclusions_are_mapped_and_reported(lm_onnx, corpus_dir, tmp_path):
    out = quantize(lm_onnx, tmp_path / "x", exclude=["lm_head", "transformer.h.0"],
                   data=str(corpus_dir))
    q = check_manifest(out)["quantization"]
    assert any(e.startswith("lm_head (MatMul, by 'lm_head')") for e in q["excluded"])
    assert sum("by 'transformer.h.0'" in e for e in q["excluded"]) == 4  # qkv, proj, fc, proj
    assert not any("h.0" in name for name in q["quantized"])
    assert q["shared_tables"] == []  # lm_head stays float, so the table is not shared


@pytest.mark.parametrize("kw,needle", [
    (dict(exclude=["transformer.h.7"]), "--exclude transformer.h.7 names no module"),
    (dict(bits=3), "bits=3 is not one of 8, 4"),
    (dict(block_size=48), "block_size=48 must be a power of two"),
    (dict(mode="int2"), "mode='int2' is not one of dynamic, weight-only, static"),
    (dict(bits=4, scheme="q4_k"), "scheme='q4_k' is not one of symmetric, symmetric-full"),
    (dict(bits=8, scheme="asymmetric"), "scheme='asymmetric' is for 4-bit blocks"),
    (dict(scale_search=True, kernel="qgemm"), "shape MatMulNBits' blocks"),
    (dict(scale_search=True, mode="static"), "shape MatMulNBits' blocks"),
])
def test_bad_requests(lm_onnx, tmp_path, kw, needle):
    with pytest.raises(QuantizeError, match=needle):
        quantize(lm_onnx, tmp_path / "out", **kw)
    assert not (tmp_path / "out").exists()


def test_refuses_quantized_or_portable_input(int8, lm_onnx, tmp_path):
    with pytest.raises(QuantizeError, match="already quantized"):
        quantize(int8, tmp_path / "again")
    with pytest.raises(OptimizeError, match="was made by stage 'quantize'"):
        optimize(int8, tmp_path / "opt")
    portable = optimize(lm_onnx, tmp_path / "portable", target="portable", level="basic")
    with pytest.raises(QuantizeError, match="'portable' graph"):
        quantize(portable, tmp_path / "q")


def test_classifier_quantizes(tiny_clf, labelled_dir, tmp_path):
    from tinyt.export import export_onnx
    out = quantize(export_onnx(tiny_clf, tmp_path / "onnx"), tmp_path / "int8",
                   data=str(labelled_dir))
    a = check_manifest(out)["accuracy"]
    assert abs(a["accuracy_change"]) <= 0.1 and a["examples"] > 0


@pytest.mark.slow
def test_demo_shape_int8_is_at_most_30_percent(corpus_dir, tmp_path):
    """The size target is for the default demo model: its shape, untrained (size does not
    depend on the weights' values)."""
    import torch

    from tinyt.checkpoint import save_checkpoint
    from tinyt.config import preset
    from tinyt.export import export_onnx
    from tinyt.model import TinyTransformer
    from tinyt.tokenizer import Tokenizer
    cfg, _ = preset("demo")
    torch.manual_seed(0)
    ck = save_checkpoint(tmp_path / "ck", TinyTransformer(cfg), Tokenizer.byte_level())
    fp32 = export_onnx(ck, tmp_path / "onnx")
    int8 = quantize(fp32, tmp_path / "int8", data=str(corpus_dir))
    ratio = (int8 / "model.onnx").stat().st_size / (fp32 / "model.onnx").stat().st_size
    assert ratio <= 0.30, f"INT8 file is {ratio:.1%} of fp32"


def test_static_qdq_with_each_calibration(lm_onnx, corpus_dir, tmp_path):
    results = {}
    for method in ("minmax", "entropy", "percentile"):
        out = quantize(lm_onnx, tmp_path / method, mode="static", calibration=method,
                       data=str(corpus_dir))
        manifest = check_manifest(out)
        counts = op_counts(onnx.load(str(out / "model.onnx")))
        assert counts["QuantizeLinear"] > 0 and counts["DequantizeLinear"] > 0
        assert not [k for k in counts if "." in k]  # QDQ: standard ONNX ops only
        assert manifest["options"]["calibration"] == method
        assert manifest["quantization"]["shared_tables"] == ["model.lm_head.weight_quantized"]
        results[method] = manifest["accuracy"]
    for method, a in results.items():
        assert a["val_loss_change"] <= INT8_LOSS_BUDGET, method
        assert a["top1_agreement"] >= 0.8, method


def test_static_keeps_attention_matmuls_float(lm_onnx, corpus_dir, tmp_path):
    out = quantize(lm_onnx, tmp_path / "s", mode="static", data=str(corpus_dir),
                   exclude=["transformer.h.1"])
    model = onnx.load(str(out / "model.onnx"))
    dq_outputs = {n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    attention = [n for n in model.graph.node
                 if re.fullmatch(r"/transformer/h\.\d+/attn/MatMul(_\d+)?", n.name)]
    assert len(attention) == 4  # q @ k^T and attn @ v in each of 2 layers
    assert not any(set(n.input) & dq_outputs for n in attention)
    q = check_manifest(out)["quantization"]
    assert sum("by 'transformer.h.1'" in e for e in q["excluded"]) == 4


@pytest.mark.parametrize("kw,needle", [
    (dict(mode="static", bits=4), "static quantization is 8-bit only"),
    (dict(mode="static", calibration="kl"), "calibration='kl' is not one of minmax"),
])
def test_bad_static_requests(lm_onnx, tmp_path, kw, needle):
    with pytest.raises(QuantizeError, match=needle):
        quantize(lm_onnx, tmp_path / "out", **kw)


def test_static_needs_the_plain_export(lm_onnx, tmp_path):
    opt = optimize(lm_onnx, tmp_path / "opt")
    with pytest.raises(QuantizeError, match="takes the plain export"):
        quantize(opt, tmp_path / "q", mode="static")


def test_empty_calibration_corpus(lm_onnx, tmp_path):
    (tmp_path / "tiny.txt").write_text("x = 1\n" * 3)
    from tinyt.errors import DataError
    with pytest.raises(DataError, match="calibration set from .*fewer than block_size"):
        quantize(lm_onnx, tmp_path / "q", mode="static", data=str(tmp_path / "tiny.txt"))
    assert not (tmp_path / "q").exists()


def test_search_keeps_the_fastest_variant_within_budget(lm_onnx, corpus_dir, tmp_path):
    from tinyt.export.search import quantize_search
    out = quantize_search(lm_onnx, tmp_path / "best", max_loss_increase=0.05, data=str(corpus_dir))
    search = check_manifest(out)["search"]
    names = [t["variant"] for t in search["tried"]]
    assert "dynamic-int8" in names and "static-minmax-per-channel" in names  # export: both kinds
    fit = [t for t in search["tried"] if t.get("within_budget")]
    assert fit and all(t["cost"] <= 0.05 for t in fit)
    chosen = min(fit, key=lambda t: t["latency_ms"])
    assert search["chosen"] == chosen["variant"]
    assert check_manifest(out)["options"]["mode"] == chosen["options"]["mode"]


def test_search_with_an_impossible_budget(lm_onnx, corpus_dir, tmp_path, monkeypatch):
    import tinyt.export.search as S
    monkeypatch.setattr(S, "cost", lambda accuracy: 1.0)  # every variant "loses" 100%
    with pytest.raises(QuantizeError, match="no variant is within max_loss_increase=0.01"):
        S.quantize_search(lm_onnx, tmp_path / "none", max_loss_increase=0.01,
                          data=str(corpus_dir))
    assert not (tmp_path / "none").exists()
    with pytest.raises(QuantizeError, match="must be a finite number >= 0"):
        S.quantize_search(lm_onnx, tmp_path / "none", max_loss_increase=-1)


def test_quantize_cli(lm_onnx, corpus_dir, tmp_path):
    from conftest import run_tinyt as tinyt
    proc = tinyt("quantize", lm_onnx, tmp_path / "q", "--data", corpus_dir, "--exclude",
                 "lm_head")
    assert proc.returncode == 0, proc.stderr
    assert "excluded: lm_head (MatMul, by 'lm_head')" in proc.stdout
    assert "val_loss_change" in proc.stdout
    proc = tinyt("quantize", lm_onnx, tmp_path / "x", "--max-loss-increase", "0.02", "--bits", "4")
    assert proc.returncode == 2 and "drop --bits" in proc.stderr
    from tinyt.export.search import quantize_search
    with pytest.raises(QuantizeError, match="drop --no-per-channel, --kernel"):
        quantize_search(lm_onnx, tmp_path / "x", max_loss_increase=0.02, per_channel=False,
                        kernel="qgemm", bits=8, exclude=[])  # defaults passed along are fine
    proc = tinyt("quantize", lm_onnx, tmp_path / "x", "--exclude", "h.9")
    assert proc.returncode == 2 and "--exclude h.9 names no module" in proc.stderr
    assert not (tmp_path / "x").exists()


def test_qgemm_kernel_quantizes_layers_per_channel(lm_onnx, corpus_dir, tmp_path):
    from tinyt.export.blockquant import channel_quantize

    opt = optimize(lm_onnx, tmp_path / "opt")
    q = quantize(opt, tmp_path / "q", kernel="qgemm", data=str(corpus_dir))
    cfg = json.loads((q / "config.json").read_text())["tinyt"]["model"]
    model = onnx.load(str(q / "model.onnx"))
    counts = op_counts(model)
    # the layers: attention's output projection with one activation scale per row
    assert counts["com.microsoft.DynamicQuantizeMatMul"] == 3 * cfg["n_layer"]
    assert counts["MatMulInteger"] == cfg["n_layer"]
    assert counts["com.microsoft.MatMulNBits"] == 1  # the tied lm_head, sharing its table
    manifest = check_manifest(q)
    assert "transformer.h.0.attn.c_proj (MatMul, int8 per channel, activations per row)" in \
        manifest["quantization"]["quantized"]
    assert manifest["quantization"]["shared_tables"] == ["model.lm_head.weight_q8"]
    assert manifest["options"]["kernel"] == "qgemm"
    assert manifest["accuracy"]["val_loss_change"] <= INT8_LOSS_BUDGET
    assert manifest["accuracy"]["top1_agreement"] >= 0.9
    w = np.random.default_rng(0).normal(size=(64, 8)).astype(np.float32)
    for qmax in (127, 63):  # 63: reduce_range, 7-bit weights for x86 without VNNI
        qw, scales = channel_quantize(w, qmax)
        assert qw.dtype == np.int8 and np.abs(qw).max() == qmax
        assert np.abs(qw * scales - w).max() <= scales.max() / 2 + 1e-7
    assert manifest["quantization"]["rows_independent"] is False  # one scale per tensor
    assert manifest["accuracy"]["greedy_batched"] is False  # so its prompts run alone
    for kernel in ("qgemm", "qgemm-rows"):
        with pytest.raises(QuantizeError, match="qgemm ones are for 8-bit dynamic only"):
            quantize(opt, tmp_path / "bad", kernel=kernel, bits=4)
    with pytest.raises(QuantizeError, match="kernels are nbits, qgemm, qgemm-rows"):
        quantize(opt, tmp_path / "bad", kernel="fast")


def test_qgemm_rows_kernel_computes_each_row_as_if_alone(lm_onnx, corpus_dir, tmp_path):
    """Every layer matmul scales its activations per row, so a row's logits are bit-identical
    whatever else runs in its batch — what lets `tinyt serve` admit prompts together."""
    import onnxruntime as ort

    opt = optimize(lm_onnx, tmp_path / "opt")
    q = quantize(opt, tmp_path / "q", kernel="qgemm-rows", data=str(corpus_dir))
    cfg = json.loads((q / "config.json").read_text())["tinyt"]["model"]
    counts = op_counts(onnx.load(str(q / "model.onnx")))
    assert counts["MatMulInteger"] == 4 * cfg["n_layer"]
    assert "com.microsoft.DynamicQuantizeMatMul" not in counts
    manifest = check_manifest(q)
    assert manifest["quantization"]["rows_independent"] is True
    assert manifest["options"]["kernel"] == "qgemm-rows"
    assert manifest["accuracy"]["val_loss_change"] <= INT8_LOSS_BUDGET
    s = ort.InferenceSession(str(q / "model.onnx"), providers=["CPUExecutionProvider"])
    names = [i.name for i in s.get_inputs()]
    rng = np.random.default_rng(1)
    ids = rng.integers(0, cfg["vocab_size"], size=(3, 9))
    ids[1] = ids[1, 0]  # a row unlike the others (one token repeated)

    def run(rows):
        feeds = {"input_ids": rows, "attention_mask": np.ones_like(rows),
                 "position_ids": np.broadcast_to(np.arange(rows.shape[1]), rows.shape).copy()}
        for name in names:
            if name.startswith("past_key_values"):
                feeds[name] = np.zeros((len(rows), cfg["n_head"], 0,
                                        cfg["n_embd"] // cfg["n_head"]), np.float32)
        return s.run(["logits"], {k: v for k, v in feeds.items() if k in names})[0]
    together = run(ids)
    for b in range(3):
        np.testing.assert_array_equal(together[b], run(ids[b:b + 1])[0])


@pytest.mark.parametrize("reduce_range", [False, True])
def test_row_scaled_int8_matmul_is_the_quantized_product(reduce_range):
    """One scale per row: a row of small values keeps its precision next to a huge one (per
    tensor it would round to nothing), and the graph computes exactly the int8 arithmetic this
    CPU does (tests/int8_arith.py): exact products where it adds them in 32 bits, or where the
    weights keep to 7 bits; saturated pair sums with 8-bit weights on x86 with AVX2 only."""
    import onnxruntime as ort
    from int8_arith import u8s8_products
    from onnx import TensorProto, helper

    from tinyt.export.blockquant import _qgemm_nodes, channel_quantize
    from tinyt.hardware import saturates_here

    rng = np.random.default_rng(0)
    K, N = 32, 16
    w = rng.normal(size=(K, N)).astype(np.float32)
    x = rng.normal(size=(1, 3, K)).astype(np.float32)
    x[0, 0] *= 1000.0  # an outlier row
    inits = []
    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="/h.0/attn/c_proj/MatMul")
    nodes = _qgemm_nodes(node, "w", w, reduce_range, True, inits)
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                         [1, 3, K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, N])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    y = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]) \
        .run(["y"], {"x": x})[0]
    qw, ws = channel_quantize(w, 63 if reduce_range else 127)  # [K, N], one scale per output
    s = (np.abs(x).max(-1, keepdims=True) / np.float32(127)).astype(np.float32)
    qx = (np.rint(x / s) + 128).astype(np.uint8)[0]  # as the graph feeds it: zero point 128
    # int32 products exact either way; the float scaling after them: a few float32 roundings
    rtol = 1e-5

    def scaled(saturating: bool) -> np.ndarray:
        return u8s8_products(qx, qw, saturating=saturating, a_zero_point=128) * s * ws

    here = scaled(saturates_here())
    np.testing.assert_allclose(y, here, rtol=rtol, atol=rtol * np.abs(here).max())
    exact = scaled(False)
    if reduce_range:  # 7-bit weights: no pair sum reaches 16 bits' limit, on any CPU
        assert np.array_equal(scaled(True), exact)
    else:  # the outlier row's 8-bit products do: what tinyt refuses to run on such a CPU
        assert not np.allclose(scaled(True), exact, rtol=0.01)
    rel = np.abs(exact - x @ w).max(-1) / np.abs(x @ w).max(-1)
    assert rel.max() < 0.05  # every row, the small ones too, within a few percent of fp32


def test_the_saturation_emulation_is_what_onnx_runtime_computes_here():
    """tests/int8_arith.py against ONNX Runtime's MatMulInteger on this CPU, on products that
    saturate in 16 bits; and tinyt.hardware's probe names the same arithmetic."""
    import onnxruntime as ort
    from int8_arith import u8s8_products
    from onnx import TensorProto, helper, numpy_helper

    from tinyt.hardware import saturates_here, u8s8_exact

    rng = np.random.default_rng(0)
    saturating = saturates_here()
    assert u8s8_exact() is (not saturating)
    for K, M in ((33, 1), (64, 5), (256, 17)):
        a = rng.integers(0, 256, (M, K)).astype(np.uint8)
        b = rng.integers(-128, 128, (K, 8)).astype(np.int8)
        graph = helper.make_graph(
            [helper.make_node("MatMulInteger", ["a", "b", "zp"], ["y"])], "g",
            [helper.make_tensor_value_info("a", TensorProto.UINT8, [None, K])],
            [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
            [numpy_helper.from_array(b, "b"), numpy_helper.from_array(np.array(128, np.uint8),
                                                                      "zp")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        model.ir_version = 7
        y = ort.InferenceSession(model.SerializeToString(),
                                 providers=["CPUExecutionProvider"]).run(None, {"a": a})[0]
        np.testing.assert_array_equal(y, u8s8_products(a, b, saturating=saturating,
                                                       a_zero_point=128))
        assert not np.array_equal(u8s8_products(a, b, saturating=True, a_zero_point=128),
                                  u8s8_products(a, b, saturating=False, a_zero_point=128))


def test_the_manifest_records_the_recipe_its_options_read_back_as(int8):
    """The recipe whole under "quantization", and the options the stage has always written,
    which read back (QuantRecipe.from_manifest) as the same recipe."""
    from tinyt.recipe import QuantRecipe, recorded

    manifest = check_manifest(int8)
    recipe = recorded(manifest["quantization"])
    assert recipe == QuantRecipe.request() == QuantRecipe.from_manifest(manifest["options"])
    assert manifest["quantization"]["rows_independent"] is recipe.rows_independent


def test_every_search_variant_is_a_valid_recipe():
    from tinyt.export.search import DYNAMIC_VARIANTS, STATIC_VARIANTS
    from tinyt.recipe import QuantRecipe

    for name, kw in DYNAMIC_VARIANTS + STATIC_VARIANTS:
        r = QuantRecipe.request(**kw)
        assert r.static == name.startswith("static"), name


def test_an_int8_gemm_graph_without_matmulnbits_is_a_quantized_graph():
    """One definition of "quantized graph" (tinyt.graphio.QUANTIZED_OPS). kernel qgemm-rows on
    an untied head and embedding writes MatMulInteger and GatherBlockQuantized, and no
    MatMulNBits or DynamicQuantizeMatMul: the shared-cache check's own list (those two) took
    such a graph for fp32 and held its rewrite to fp32's bound (tests/export/test_untied_head.py
    shows it end to end)."""
    from onnx import TensorProto, helper, numpy_helper

    from tinyt.export.blockquant import quantize_weights
    from tinyt.graphio import QUANTIZED_OPS, quantized_ops
    from tinyt.recipe import QuantRecipe

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(50, 32)).astype(np.float32),
                                     "transformer.wte.weight"),
             numpy_helper.from_array(rng.normal(size=(32, 50)).astype(np.float32),
                                     "lm_head.weight")]
    nodes = [helper.make_node("Gather", ["transformer.wte.weight", "ids"], ["h"],
                              name="/transformer/wte/Gather"),
             helper.make_node("MatMul", ["h", "lm_head.weight"], ["logits"],
                              name="/lm_head/MatMul")]
    graph = helper.make_graph(
        nodes, "untied", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 4, 50])], inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    fp32_ops = {n.op_type for n in proto.graph.node}
    assert quantized_ops(fp32_ops) == []
    quantize_weights(proto, QuantRecipe.request(kernel="qgemm-rows"))
    ops = {n.op_type for n in proto.graph.node}
    assert quantized_ops(ops) == ["GatherBlockQuantized", "MatMulInteger"]
    assert not {"MatMulNBits", "DynamicQuantizeMatMul"} & ops  # the check's old list: "fp32"
    assert {"MatMulNBits", "DynamicQuantizeMatMul"} < QUANTIZED_OPS
