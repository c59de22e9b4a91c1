"""llama.cpp's activation rounding before carried GGUF tables (issue 51): `tinyt quantize
--gguf-blocks --mode weight-only --activations q8` (export/gguf_activations.py) against a
numpy reimplementation of what llama.cpp's x86 code does (arch/x86/quants.c
quantize_row_q8_0 / q8_1, ggml_vec_dot_q4_0_q8_0 / q4_1_q8_1 / q8_0_q8_0):

    q = round-half-even(x · fl(127 / amax)),  d = fp16(fl(amax / 127)),  s = fp16(fl(amax / 127) · Σq)
    y = Σ_blocks d_w · d · Σ q_w q  (+ m_w · s for Q4_1),  the Σ q_w q in integers

Bounds: the rounding itself (q, d, s) is compared bit for bit. The product y, here in float64
(exact to 2^-52 for these sizes), against the graph's fp32: MatMulNBits sums K fp32 products
x'·w' (x' = q·d exact in fp32: 7 + 11 bits; w' = d_w·q_w exact, or for Q4_1 with one rounding
of + m), and Q4_1's minimum term adds K/32 more and one Add, each product and partial sum
rounding by at most u = 2^-24 of itself: |y - y_fp32| <= γ_n · Σ|terms| with n = K + K/32 + 3
roundings on any path (Higham's γ_n = n·u / (1 - n·u)), whatever the order of the sums."""
from __future__ import annotations

import json

import numpy as np
import pytest
from cli_run import run_cli
from gguf_fixtures import write_gguf

from tinyt.errors import QuantizeError

gguf = pytest.importorskip("gguf")
U = 2.0 ** -24  # fp32's unit roundoff


def llama_cpp_q8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """quantize_row_q8_1 on x86 (q8_0 is the same without s) of rows x [R, K] fp32: levels q
    [R, K/32, 32] (as float), d and s [R, K/32] (fp16 values as float)."""
    xb = x.reshape(x.shape[0], -1, 32).astype(np.float32)
    amax = np.abs(xb).max(-1)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(xb * inv[..., None])  # fp32 product; rint: half to even, as _mm256_round_ps
    d32 = (amax / np.float32(127)).astype(np.float32)
    s = (d32 * q.sum(-1, dtype=np.float32)).astype(np.float32).astype(np.float16)
    return q, d32.astype(np.float16).astype(np.float32), s.astype(np.float32)


def llama_cpp_product(x: np.ndarray, raw: np.ndarray, kind: str) -> np.ndarray:
    """llama.cpp's x [R, K] times the raw GGUF rows [N, ...] of `kind`, exactly (float64 over
    integer block sums), and the magnitude Σ|terms| the fp32 bound scales with: MatMulNBits
    reads a weight as level·d − zero point·d (its unsigned levels, zero point 8 for Q4_0, 128
    for Q8_0, m for Q4_1), so each of those is a term of its own."""
    q, d, s = llama_cpp_q8(x)
    N = raw.shape[0]
    blocks = raw.reshape(N, q.shape[1], -1)
    dw = blocks[..., :2].copy().view(np.float16)[..., 0].astype(np.float64)
    if kind == "Q8_0":
        qw, zero = blocks[..., 2:].view(np.int8).astype(np.int64), 128
    else:
        nib = blocks[..., 4 if kind == "Q4_1" else 2:]
        qw = np.concatenate([nib & 15, nib >> 4], -1).astype(np.int64) - 8 * (kind == "Q4_0")
        zero = 8 * (kind == "Q4_0")
    isum = np.einsum("rbk,nbk->rnb", q.astype(np.int64), qw)  # the integer dot products
    y = (isum * dw[None] * d[:, None, :]).sum(-1)
    terms = np.einsum("rbk,nbk->rnb", np.abs(q), np.abs(qw + zero) + zero)
    mag = terms * np.abs(dw)[None] * d[:, None, :]  # Q4_0's and Q8_0's d_w carry a sign
    if kind == "Q4_1":
        m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
        y = y + (m[None] * s[:, None, :]).sum(-1)
        mag = mag + np.abs(m[None]) * (np.abs(q).sum(-1) * d)[:, None, :]
    return y, mag.sum(-1)


def _graph(raw: np.ndarray, kind: str, K: int):
    """x [1, R, K] -> MatMulNBits of the carried table, with llama.cpp's rounding before it;
    the chain's q and d as outputs too."""
    from onnx import TensorProto, helper, numpy_helper

    from tinyt.export.gguf_activations import round_activations
    from tinyt.export.gguf_blocks import nbits_table

    t = nbits_table(kind, raw)
    names = [f"W_q{t.bits}", "W_scales", *(["W_zero_points"] if t.zero_points is not None else [])]
    inits = [numpy_helper.from_array(a, n) for a, n in zip(
        (t.packed, t.scales, t.zero_points), names)]
    node = helper.make_node("MatMulNBits", ["x", *names], ["y"], name="mm",
                            domain="com.microsoft", K=K, N=raw.shape[0], bits=t.bits,
                            block_size=32, accuracy_level=0)
    graph = helper.make_graph(
        [node], "one", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, None, K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, None, raw.shape[0]])], inits)
    done = round_activations(graph, {"W": kind})
    assert done == [f"mm ({'q8_1' if kind == 'Q4_1' else 'q8_0'})"]
    graph.output.extend(helper.make_tensor_value_info(f"/gguf_q8/x/{o}", TensorProto.FLOAT, None)
                        for o in ("q", "d"))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                   helper.make_opsetid("com.microsoft", 1)])


def _activations(R: int, K: int, seed: int) -> np.ndarray:
    """Rows with the cases rounding can get wrong: a block of zeros, exact halves of both
    signs (amax 127: the multiplier 1, x·1 = k + 0.5), a block far smaller than the rest, one
    far larger, and values from 1e-6 to 1e3."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((R, K)) * np.exp(rng.uniform(-3, 3, (R, 1)))).astype(np.float32)
    x[0, :32] = 0
    x[1, :32] = np.array([127, -127] + [k + 0.5 for k in range(-15, 15)], np.float32)
    x[2, 32:64] *= 1e-6
    x[3, 64:96] *= 1e3
    return x


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
def test_the_graph_rounds_and_multiplies_as_llama_cpp(kind):
    import onnxruntime as ort

    N, K, R = 40, 160, 9
    w = (np.random.default_rng(1).standard_normal((N, K)) * 0.05).astype(np.float32)
    raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType[kind])
    x = _activations(R, K, seed=2)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL  # as loaded
    session = ort.InferenceSession(_graph(raw, kind, K).SerializeToString(), opts,
                                   providers=["CPUExecutionProvider"])
    y, q, d = session.run(None, {"x": x[None]})
    want_q, want_d, _ = llama_cpp_q8(x)
    assert q.shape == (R * K // 32, 32) and d.shape == (R * K // 32, 1)
    assert np.array_equal(q, want_q.reshape(-1, 32)), "levels differ"
    assert np.array_equal(d[:, 0], want_d.reshape(-1)), "fp16 scales differ"
    assert np.array_equal(q[K // 32, :2], [127, -127]) and q[K // 32, 2] == -14  # -14.5: even
    want, magnitude = llama_cpp_product(x, raw, kind)
    assert y.shape == (1, R, N) and y.dtype == np.float32
    n = K + K // 32 + 3
    bound = n * U / (1 - n * U) * magnitude
    worst = np.abs(y[0] - want) - bound
    assert (worst <= 0).all(), f"beyond the fp32 bound by {worst.max():.3g}"


def test_q8_1s_fp16_sum_is_emulated():
    """Without the m · s term's own fp16 rounding the Q4_1 product is further from llama.cpp's
    than the fp32 bound: the term is needed (measured on the tiny GGUF against llama.cpp:
    1.1e-2 of the largest logit without it, 2.9e-7 with it)."""
    import onnxruntime as ort

    N, K = 40, 160
    w = (np.random.default_rng(3).standard_normal((N, K)) * 0.05 + 0.03).astype(np.float32)
    raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_1)
    x = _activations(9, K, seed=4)
    model = _graph(raw, "Q4_1", K)
    plain = [n for n in model.graph.node if n.name.startswith("mm/q8_1")]
    assert plain, "no minimum term"
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want, magnitude = llama_cpp_product(x, raw, "Q4_1")
    q, d, s = llama_cpp_q8(x)
    without = want - np.einsum("rb,nb->rn", s - d * q.sum(-1), raw.reshape(N, K // 32, 20)[
        ..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64))
    got = session.run(["y"], {"x": x[None]})[0][0]
    bound = (K + K // 32 + 3) * U * magnitude
    assert (np.abs(got - want) <= bound).all()
    assert (np.abs(without - want) > bound).any()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from tinyt.export import export_onnx
    from tinyt.hf import import_hf

    work = tmp_path_factory.mktemp("gguf_q8")
    ck = import_hf(write_gguf(work / "tiny.gguf"), work / "ck")
    return export_onnx(ck, work / "onnx")


def test_the_artifact_records_and_runs(exported, tmp_path, monkeypatch, capsys):
    """The stage: every carried product rounded (q8_0 before Q4_0 / Q8_0 tables, q8_1 before
    Q4_1), the recipe in the manifest; tinyt's runtime generates from it, and ONNX Runtime
    GenAI (where installed) loads it as it is and computes the same logits (the same graph
    on the same kernels: measured equal; bound compare.reorder_bound)."""
    import importlib.util

    import onnx

    import tinyt.runtime as rt
    from tinyt.checkpoint import load_checkpoint
    from tinyt.export.compare import reorder_bound
    from tinyt.recipe import QuantRecipe

    out = tmp_path / "q8"
    code, said, err = run_cli(monkeypatch, capsys, "quantize", exported, out, "--bits", 4,
                              "--block-size", 32, "--gguf-blocks", "--mode", "weight-only",
                              "--activations", "q8")
    assert code == 0, err
    assert "activations rounded as llama.cpp's: 9 products" in said
    manifest = json.loads((out / "manifest.json").read_text())
    q = manifest["quantization"]
    assert QuantRecipe.from_json(q["recipe"]).activations == "q8"
    assert manifest["options"]["activations"] == "q8"
    rounded = q["gguf_blocks"]["activations_rounded"]
    assert len(rounded) == len(q["gguf_blocks"]["carried"]) == 9
    assert sum(r.endswith("(q8_1)") for r in rounded) == 4  # the MLP's Q4_1 (gate+up, down) x 2
    assert q["gguf_blocks"]["norms_in_double"] == 5  # ln_1, ln_2 of 2 layers, the final norm
    graph = onnx.load(out / "model.onnx")
    doubles = [n for n in graph.graph.node if n.op_type == "ReduceMean"
               and n.input[0].endswith("/f64")]
    assert len(doubles) == 5
    lm = rt.load(out, threads=1)
    ids = [5, 70, 200, 3, 9, 261, 33, 140, 7, 99, 12, 250]
    greedy = lm.generate_ids([ids], max_new_tokens=6, min_new_tokens=6)[0].token_ids
    assert len(greedy) == 6
    if importlib.util.find_spec("onnxruntime_genai"):
        import onnxruntime_genai as og

        from tinyt.benchmarks.gguf_llama_cpp import tinyt_logits
        from tinyt.benchmarks.peers.adapters import genai_greedy, genai_logits

        config = og.Config(str(out))
        config.clear_providers()
        model = og.Model(config)
        ck = json.loads((exported / "manifest.json").read_text())["source"]["path"]
        want = tinyt_logits(out, ck, [ids], 1)[0][0][-1]
        got = genai_logits(model, ids)
        assert got.shape == want.shape and got.dtype == want.dtype
        top = float(np.abs(want).max())
        assert float(np.abs(got - want).max()) <= reorder_bound(load_checkpoint(ck).config, top)
        assert genai_greedy(model, ids, 6) == list(greedy)


def test_refusals(exported, tmp_path):
    from tinyt.export.quantize import quantize

    with pytest.raises(QuantizeError, match="needs gguf_blocks"):
        quantize(exported, tmp_path / "a", bits=4, block_size=32, mode="weight-only",
                 activations="q8")
    with pytest.raises(QuantizeError, match="mode weight-only"):
        quantize(exported, tmp_path / "b", bits=4, block_size=32, gguf_blocks=True,
                 activations="q8")
    with pytest.raises(QuantizeError, match="activations='q4' is not one of float, q8"):
        quantize(exported, tmp_path / "c", bits=4, block_size=32, mode="weight-only",
                 gguf_blocks=True, activations="q4")


def test_the_recipe_records_the_rounding():
    """activations rides in both of the manifest's forms, and older manifests read as float."""
    from tinyt.recipe import QuantRecipe

    recipe = QuantRecipe.request(mode="weight-only", bits=4, block_size=32, activations="q8")
    assert recipe.options()["activations"] == "q8" and recipe.rows_independent
    assert QuantRecipe.from_manifest(recipe.options()) == recipe
    assert QuantRecipe.from_json(recipe.to_json()) == recipe
    older = {k: v for k, v in recipe.options().items() if k != "activations"}
    assert QuantRecipe.from_manifest(older).activations == "float"
    assert "activations" not in QuantRecipe.request(mode="weight-only").options()
