"""The int8 KV cache of the shared-cache graph (`optimize --target gqa --kv-cache int8`,
export/kv_int8.py): its logits against the float32 cache's within the bound its quantization
step gives, the same greedy tokens through generate and the engine in every batch row, the
manifest's record, and the named refusals."""
import json

import numpy as np
import onnx
import pytest

import tinyt.runtime as rt
from tinyt.errors import OptimizeError, QuantizeError, SharedCacheError
from tinyt.export import kv_int8
from tinyt.export.optimize import optimize
from tinyt.recipe import KVCacheRecipe

PROMPTS = ["def alpha(beta", "import os\n", "    return ", "class A:\n    x = 1\n"]


def _gqa_int8(nh, kvh, d, past):
    """One GroupQueryAttention with rotary on int8 caches, per channel, as kv_int8 writes it."""
    from onnx import TensorProto as T
    from onnx import helper as h

    shapes = {"query": [1, 1, nh * d], "key": [1, 1, kvh * d], "value": [1, 1, kvh * d],
              "past_key": [1, kvh, past, d], "past_value": [1, kvh, past, d],
              "seqlens_k": [1], "total_sequence_length": [], "cos": [past, d // 2],
              "sin": [past, d // 2], "k_scale": [kvh * d], "v_scale": [kvh * d]}
    types = {"past_key": T.INT8, "past_value": T.INT8, "seqlens_k": T.INT32,
             "total_sequence_length": T.INT32}
    names = [*list(shapes)[:9], "", "", "", "k_scale", "v_scale"]
    node = h.make_node("GroupQueryAttention", names, ["out", "present_key", "present_value"],
                       domain="com.microsoft", num_heads=nh, kv_num_heads=kvh, do_rotary=1,
                       k_quant_type="PER_CHANNEL", v_quant_type="PER_CHANNEL",
                       kv_cache_bit_width=8)
    graph = h.make_graph([node], "g", [h.make_tensor_value_info(n, types.get(n, T.FLOAT), s)
                                       for n, s in shapes.items()],
                         [h.make_tensor_value_info(o, T.INT8 if o != "out" else T.FLOAT, None)
                          for o in node.output])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 21),
                                              h.make_opsetid("com.microsoft", 1)])


def test_onnx_runtime_quantizes_rotated_keys_per_kv_head_and_channel():
    """What the int8 cache rests on (ONNX Runtime's CPU kernel): the new token's key, after its
    rotary, and value are written as clip(round(x / scale)) with scale[kv head * head_dim +
    channel], and attention reads every cached token as int8 x scale. Against float64 numpy:
    sums of head_dim products and of the past's terms, within a few fp32 roundings of them."""
    import onnxruntime as ort

    from tinyt.export.compare import FP32_U

    nh, kvh, d, past, n = 4, 2, 16, 8, 4  # n tokens cached, the new one at position n
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, h * d)).astype(np.float32) for h in (nh, kvh, kvh))
    pk, pv = (rng.integers(-100, 100, (1, kvh, past, d)).astype(np.int8) for _ in range(2))
    ks, vs = ((0.01 + 0.03 * rng.random(kvh * d)).astype(np.float32) for _ in range(2))
    angle = np.arange(past)[:, None] / 10000 ** (np.arange(0, d, 2) / d)
    cos, sin = np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)
    sess = ort.InferenceSession(_gqa_int8(nh, kvh, d, past).SerializeToString(),
                                providers=["CPUExecutionProvider"])
    out, pk2, pv2 = sess.run(None, dict(
        query=q, key=k, value=v, past_key=pk, past_value=pv, seqlens_k=np.array([n], np.int32),
        total_sequence_length=np.array(n + 1, np.int32), cos=cos, sin=sin, k_scale=ks,
        v_scale=vs))

    def turn(x):  # [heads, d] at position n, halves (GroupQueryAttention's non-interleaved)
        a, b = x[:, : d // 2], x[:, d // 2:]
        return np.concatenate([a * cos[n] - b * sin[n], b * cos[n] + a * sin[n]], axis=1)
    ks2, vs2 = ks.reshape(kvh, d), vs.reshape(kvh, d)
    want_k = np.clip(np.round(turn(k.reshape(kvh, d).astype(np.float64)) / ks2), -128, 127)
    want_v = np.clip(np.round(v.reshape(kvh, d) / vs2), -128, 127)
    assert (pk2[0, :, n] == want_k).all() and (pv2[0, :, n] == want_v).all()
    assert (pk2[0, :, :n] == pk[0, :, :n]).all()  # the cached tokens stay as they were
    keys = pk2[0, :, : n + 1].astype(np.float64) * ks2[:, None]
    values = pv2[0, :, : n + 1].astype(np.float64) * vs2[:, None]
    qs = turn(q.reshape(nh, d).astype(np.float64))
    want = []
    for head in range(nh):
        g = head // (nh // kvh)
        p = np.exp(qs[head] @ keys[g].T / np.sqrt(d))
        want.append(p / p.sum() @ values[g])
    size = float(np.abs(values).max())
    assert np.abs(out.ravel() - np.concatenate(want)).max() <= 8 * FP32_U * (d + n + 1) * size


@pytest.fixture(scope="module")
def qwen3_like(tmp_path_factory, corpus_dir):
    """Qwen3's settings at a test size (grouped kv heads, rotary, q/k norms per head, RMSNorm,
    SwiGLU, no biases) on random weights of std 0.2 (logits of size), exported and optimized;
    its float32-cache and int8-cache shared-cache graphs."""
    import torch
    from hf_fixtures import tokenizer

    from tinyt.checkpoint import save_checkpoint
    from tinyt.config import ModelConfig
    from tinyt.export import export_onnx
    from tinyt.model import build_model

    root = tmp_path_factory.mktemp("kv8")
    tok = tokenizer()
    cfg = ModelConfig(block_size=256, vocab_size=tok.vocab_size, n_layer=2, n_head=4,
                      n_kv_head=2, head_size=32, n_embd=64, n_inner=96, bias=False,
                      qk_norm="head", pos_encoding="rotary", rope_theta=1e6, norm="rmsnorm",
                      norm_eps=1e-6, activation="swiglu")
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    ck = save_checkpoint(root / "ck", model, tok)
    opt = optimize(export_onnx(ck, root / "onnx"), root / "opt")
    return {"opt": opt, "gqa": optimize(opt, root / "gqa", target="gqa"),
            "int8": optimize(opt, root / "int8", target="gqa", kv_cache="int8",
                             kv_data=str(corpus_dir))}


def test_graph_and_manifest_record_the_int8_cache(qwen3_like):
    proto = onnx.load(str(qwen3_like["int8"] / "model.onnx"))
    cfg = rt.load(qwen3_like["gqa"]).config
    kinds = {v.name: v.type.tensor_type.elem_type for v in [*proto.graph.input,
                                                             *proto.graph.output]}
    assert kinds["past_key_values.0.key"] == kinds["present.1.value"] == onnx.TensorProto.INT8
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
    for node in (n for n in proto.graph.node if n.op_type == "GroupQueryAttention"):
        attrs = {a.name: a for a in node.attribute}
        assert attrs["k_quant_type"].s == attrs["v_quant_type"].s == b"PER_CHANNEL"
        assert attrs["kv_cache_bit_width"].i == 8
        for at in (kv_int8.K_SCALE_INPUT, kv_int8.V_SCALE_INPUT):
            scale = inits[node.input[at]]  # a scale per kv head and channel, all positive
            assert scale.shape == (cfg.kv_heads * cfg.head_dim,) and (scale > 0).all()
        # a key channel's range (clip "mse") is at most its rotary pair's largest norm (c,
        # c + head_dim / 2), which every position's key is within, and at least half of it
        k = inits[node.input[kv_int8.K_SCALE_INPUT]].reshape(cfg.kv_heads, cfg.head_dim)
        half = cfg.head_dim // 2
        pair = np.maximum(k[:, :half], k[:, half:])
        assert (np.minimum(k[:, :half], k[:, half:]) >= kv_int8.CLIP_GRID[0] * pair - 1e-9).all()
        v = inits[node.input[kv_int8.V_SCALE_INPUT]].reshape(cfg.kv_heads, cfg.head_dim)
        assert not np.array_equal(v[:, :half], v[:, half:])  # values: each channel its own
    m = json.loads((qwen3_like["int8"] / "manifest.json").read_text())
    assert m["options"]["kv_cache"] == {"dtype": "int8", "scales": "per-channel",
                                        "margin": 1.25, "clip": "mse"}
    assert KVCacheRecipe.from_json(m["options"]["kv_cache"]) == KVCacheRecipe("int8")
    assert KVCacheRecipe.from_json(None) == KVCacheRecipe()  # made before --kv-cache
    # a record made before --kv-clip: its rule was max |x| x margin
    assert KVCacheRecipe.from_json({"dtype": "int8", "scales": "per-channel", "margin": 1.25}
                                   ) == KVCacheRecipe("int8", clip="max")
    kv = m["kv_cache"]
    assert kv["calibration"]["split"] == "train" and kv["calibration"]["tokens"] > 0
    assert "least squared int8 error" in kv["calibration"]["rule"]
    # clip "mse" clips: the largest move is a clipped element's, beyond half a level
    assert 1 / 254 < kv["calibration"]["largest_step"] <= 1 - kv_int8.CLIP_GRID[0]
    assert kv["check"]["logits_max_abs"] <= kv["check"]["tolerance"]
    assert kv["check"]["tolerance"] == pytest.approx(kv_int8.kv_bound(
        cfg, kv["calibration"]["largest_step"], kv["check"]["logits_magnitude"]), rel=1e-12)
    plain = json.loads((qwen3_like["gqa"] / "manifest.json").read_text())
    assert plain["options"]["kv_cache"]["dtype"] == "float32" and "kv_cache" not in plain
    assert rt.load(qwen3_like["int8"]).kv_dtype is np.int8


def test_logits_within_the_quantization_steps_bound_over_a_whole_sequence(qwen3_like):
    """A prompt of 100 tokens, then greedy steps to 240 tokens: every step's logits of the
    int8 cache against the float32 cache's, within kv_bound (half a level of each channel's
    range, through the layers); a wrong scale axis or layout misses it by the logits' size."""
    ref, lm = (rt.load(qwen3_like[k], threads=1) for k in ("gqa", "int8"))
    cfg = ref.config
    prompt = ref.tokenizer.encode("def alpha(beta, n=3):\n    return beta * n\n" * 8)[:100]
    a, b = (m.new_cache(1, 256) for m in (ref, lm))
    la, lb = a.prefill([prompt], ref.pad_id)[0, 0].copy(), b.prefill([prompt], 0)[0, 0].copy()
    worst = size = 0.0
    while int(a.lens[0]) < 240:
        worst, size = max(worst, float(np.abs(la - lb).max())), max(size, float(np.abs(la).max()))
        nxt = np.array([la.argmax()])
        la, lb = a.step(nxt, None)[0, 0].copy(), b.step(nxt, None)[0, 0].copy()
    step = json.loads((qwen3_like["int8"] / "manifest.json").read_text()
                      )["kv_cache"]["calibration"]["largest_step"]
    bound = kv_int8.kv_bound(cfg, step, size)
    assert 0 < worst <= bound, (worst, bound)  # 0: the cache would not be int8


def test_greedy_tokens_equal_through_generate_and_the_engine_in_every_row(qwen3_like):
    from tinyt.runtime.engine import Engine
    from tinyt.runtime.sampling import SamplingParams

    lm = rt.load(qwen3_like["int8"], threads=1)
    alone = [lm.generate_ids([p], max_new_tokens=24)[0].token_ids
             for p in map(lm.tokenizer.encode, PROMPTS)]
    batch = [r.token_ids for r in lm.generate_ids([lm.tokenizer.encode(p) for p in PROMPTS],
                                                  max_new_tokens=24)]
    assert batch == alone
    engine = Engine(lm, max_batch=4, prefix_cache_bytes=0).start()
    try:  # submitted together: the rows share the engine's steps
        got = [engine.submit(lm.tokenizer.encode(p), SamplingParams(max_new_tokens=24))
               for p in PROMPTS]
        outs = [(r.wait(60), r.out)[1] for r in got]
    finally:
        engine.stop()
    assert outs == alone and engine.steps_run < sum(map(len, alone))


def test_bad_values_and_graphs_it_cannot_apply_to_are_named(qwen3_like, tmp_path):
    with pytest.raises(QuantizeError, match="kv_cache='int4' is not one of float32, int8"):
        optimize(qwen3_like["opt"], tmp_path / "a", target="gqa", kv_cache="int4")
    with pytest.raises(QuantizeError, match="kv_scales='per-row'"):
        optimize(qwen3_like["opt"], tmp_path / "b", target="gqa", kv_cache="int8",
                 kv_scales="per-row")
    with pytest.raises(QuantizeError, match="kv_clip='p99' is not one of mse, max"):
        optimize(qwen3_like["opt"], tmp_path / "e", target="gqa", kv_cache="int8",
                 kv_clip="p99")
    with pytest.raises(QuantizeError, match="kv_margin=0.5"):
        KVCacheRecipe("int8", margin=0.5)
    with pytest.raises(QuantizeError, match=r"kv_cache keys \['bits'\]"):
        KVCacheRecipe.from_json({"dtype": "int8", "bits": 8})
    with pytest.raises(OptimizeError, match="target 'cpu' keeps its source's float cache"):
        optimize(qwen3_like["opt"], tmp_path / "c", kv_cache="int8")
    with pytest.raises(SharedCacheError, match="KV-cache decoder"):  # a graph without a cache
        optimize(qwen3_like["gqa"], tmp_path / "d", target="gqa", kv_cache="int8")


def test_keys_turned_to_other_positions_are_the_rotary_of_those_positions():
    """at_positions undoes a key's rotary at its own position and applies the drawn one's:
    against tinyt.rope's table applied to the unturned key (float32 rotations, two of them:
    a few ulps of the key's size)."""
    from tinyt.config import ModelConfig
    from tinyt.rope import rope_frequencies, rope_table

    cfg = ModelConfig(block_size=512, vocab_size=64, n_layer=1, n_head=2, n_kv_head=1,
                      head_size=16, n_embd=32, pos_encoding="rotary", rope_theta=1e4,
                      rotary_dim=12)
    rng = np.random.default_rng(1)
    raw = rng.standard_normal((1, 5, 16)).astype(np.float32)  # [kvh, T, hd], unturned
    pos, drawn = np.array([0, 3, 7, 100, 400]), np.array([511, 0, 250, 100, 9])
    cos, sin = rope_table(cfg, 512, scaled=False)

    def turn(x, p):
        c, s = cos[p], sin[p]
        a, b = x[..., :6], x[..., 6:12]
        return np.concatenate([a * c - b * s, b * c + a * s, x[..., 12:]], axis=-1)

    got = kv_int8.at_positions(turn(raw, pos), pos, rope_frequencies(cfg)[0], drawn)
    np.testing.assert_allclose(got, turn(raw, drawn), rtol=0, atol=1e-5)
    assert np.array_equal(got[..., 12:], raw[..., 12:])  # the unturned channels kept


def test_least_error_ranges_clip_a_lone_high_value_and_keep_a_uniform_channel():
    """squared_errors is ONNX Runtime's int8 rounding's error per channel and candidate range;
    the least of it keeps a uniform channel's whole range (clipping its edge costs more than
    the finer step saves) and clips a channel whose max is one value 4% past all the others:
    4,096 values' rounding error shrinks by 4,096 / 12 x ((1.04 / 127)^2 - (1.02 / 127)^2)
    = 9e-4, the one clipped value costs 0.02^2 = 4e-4."""
    rng = np.random.default_rng(2)
    t = 4096
    x = rng.uniform(-1, 1, (2, t)).astype(np.float32)
    x[:, 0], x[1, 1] = 1.0, 1.04
    cand = np.abs(x).max(axis=1)[:, None] * kv_int8.CLIP_GRID[None]
    err = kv_int8.squared_errors(x.reshape(1, 2, t).transpose(0, 2, 1), cand)
    scale = (cand[0, -1] / kv_int8.LEVELS).astype(np.float32)
    direct = np.square(x[0] - np.clip(np.round(x[0] / scale), -128, 127) * scale,
                       dtype=np.float64).sum()
    assert err[0, -1] == pytest.approx(direct, rel=1e-6)  # float32 rounding, summed in float64
    best = kv_int8.CLIP_GRID[err.argmin(axis=1)]
    assert best[0] == 1.0 and 0.94 <= best[1] < 1.0, best


def test_largest_step_is_half_a_level_unclipped_and_the_clipped_part_beyond():
    maxima = {0: [np.array([[2.0, 4.0]]), np.array([[1.0, 1.0]])]}
    kept = {0: [m * 1.25 for m in maxima[0]]}
    assert kv_int8.largest_step(kept, maxima) == pytest.approx(1.25 / 254)
    clipped = {0: [np.array([[2.0, 3.0]]), np.array([[1.0, 1.0]])]}  # 4 clipped to 3
    assert kv_int8.largest_step(clipped, maxima) == pytest.approx(0.25)


def test_per_tensor_least_error_ranges_give_one_scale_a_tensor(qwen3_like, corpus_dir, tmp_path):
    """kv_scales per-tensor with clip mse: one fraction of the tensor's max for all its
    channels, one scale a tensor, within [CLIP_GRID[0], 1] x the per-channel cache's largest
    channel range (the same calibration's max); its logits within the check's bound."""
    out = optimize(qwen3_like["opt"], tmp_path / "t", target="gqa", kv_cache="int8",
                   kv_scales="per-tensor", kv_data=str(corpus_dir))
    proto, chan = (onnx.load(str(d / "model.onnx")) for d in (out, qwen3_like["int8"]))
    inits, chan_inits = ({t.name: onnx.numpy_helper.to_array(t) for t in p.graph.initializer}
                         for p in (proto, chan))
    names = [n for n in inits if n.endswith("_cache_scale")]
    assert len(names) == 2 * 2  # 2 layers x keys, values
    for n in names:
        assert inits[n].shape == (1,)
        top = float(inits[n][0])
        # the per-channel artifact's largest range is at most its channel's max, at least half
        assert top <= chan_inits[n].max() / kv_int8.CLIP_GRID[0] * (1 + 1e-6)
    kv = json.loads((out / "manifest.json").read_text())["kv_cache"]
    assert kv["check"]["logits_max_abs"] <= kv["check"]["tolerance"]
