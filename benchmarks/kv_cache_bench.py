"""The int8 KV cache (`tinyt optimize --target gqa --kv-cache int8`) against the float32 one:

    python -m tinyt.benchmarks.kv_cache_bench op OUT.json
        GroupQueryAttention alone, one decode step at Qwen3-0.6B's heads (16 q, 8 kv, head_dim
        128) after 4,096 and 8,192 tokens, 1 thread: float32, int8 per tensor, int8 per
        channel caches, interleaved rounds
    python -m tinyt.benchmarks.kv_cache_bench quality FP32_GQA INT8_GQA OUT.json [--context N]
        perplexity of two shared-cache artifacts of one model on held-out prose (Python's
        pydoc topics, benchmarks.real_quality.heldout_text) in windows of N tokens, run in
        pieces of PIECE tokens through the cache (each piece attends to the cached ones, as
        chunked prefill does), per span of positions
    python -m tinyt.benchmarks.kv_cache_bench decode FP32_GQA INT8_GQA OUT.json
        decode step time after 256, 4,096 and 8,192 tokens, the two artifacts' steps
        interleaved
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

PIECE = 512  # tokens a prompt piece
SPANS = (0, 1024, 2048, 4096, 8192)  # perplexity per span of positions
ROUNDS, RUNS = 15, 20  # op: interleaved rounds, runs a round
PASTS = (4096, 8192)
# decode: a short past too, so that what the cache's length adds to a step shows apart from the
# weights' part (the same at every length)
DECODE_PASTS = (256, *PASTS)


def _op_graph(kind: str, capacity: int):
    """One GroupQueryAttention (rotary in, as Qwen3's) on a cache of `capacity` tokens."""
    import onnxruntime as ort
    from onnx import TensorProto as T
    from onnx import helper as h

    nh, kvh, d = 16, 8, 128
    kvt = T.FLOAT if kind == "float32" else T.INT8
    cache = [1, kvh, capacity, d]
    inputs = [h.make_tensor_value_info(n, t, s) for n, t, s in (
        ("query", T.FLOAT, [1, 1, nh * d]), ("key", T.FLOAT, [1, 1, kvh * d]),
        ("value", T.FLOAT, [1, 1, kvh * d]), ("past_key", kvt, cache),
        ("past_value", kvt, cache), ("seqlens_k", T.INT32, [1]),
        ("total_sequence_length", T.INT32, []), ("cos", T.FLOAT, [capacity, d // 2]),
        ("sin", T.FLOAT, [capacity, d // 2]))]
    names, attrs, init = [i.name for i in inputs], dict(num_heads=nh, kv_num_heads=kvh,
                                                         do_rotary=1), []
    if kind != "float32":
        quant = "PER_TENSOR" if kind == "int8-tensor" else "PER_CHANNEL"
        n = 1 if quant == "PER_TENSOR" else kvh * d
        init = [h.make_tensor("k_scale", T.FLOAT, [n], [0.05] * n),
                h.make_tensor("v_scale", T.FLOAT, [n], [0.02] * n)]
        names += ["", "", "", "k_scale", "v_scale"]
        attrs.update(k_quant_type=quant, v_quant_type=quant, kv_cache_bit_width=8)
    node = h.make_node("GroupQueryAttention", names, ["out", "present_key", "present_value"],
                       domain="com.microsoft", **attrs)
    outputs = [h.make_tensor_value_info("out", T.FLOAT, None),
               h.make_tensor_value_info("present_key", kvt, cache),
               h.make_tensor_value_info("present_value", kvt, cache)]
    model = h.make_model(h.make_graph([node], "gqa", inputs, outputs, initializer=init),
                         opset_imports=[h.make_opsetid("", 21),
                                        h.make_opsetid("com.microsoft", 1)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    dt = np.float32 if kind == "float32" else np.int8
    kv = [(rng.standard_normal(cache) * (1 if kind == "float32" else 30)).astype(dt)
          for _ in range(2)]
    feeds = {"query": rng.standard_normal((1, 1, nh * d), np.float32),
             "key": rng.standard_normal((1, 1, kvh * d), np.float32),
             "value": rng.standard_normal((1, 1, kvh * d), np.float32),
             "seqlens_k": np.zeros(1, np.int32), "total_sequence_length": np.zeros((), np.int32),
             "cos": np.ones((capacity, d // 2), np.float32),
             "sin": np.zeros((capacity, d // 2), np.float32),
             "past_key": kv[0], "past_value": kv[1]}
    b = sess.io_binding()
    for k, v in feeds.items():
        b.bind_input(k, "cpu", 0, v.dtype, list(v.shape), v.ctypes.data)
    for name, buf in zip(("present_key", "present_value"), kv):  # the same memory, in place
        b.bind_output(name, "cpu", 0, buf.dtype, list(buf.shape), buf.ctypes.data)
    b.bind_output("out", "cpu")
    return sess, b, feeds


def op() -> dict:
    kinds = ("float32", "int8-tensor", "int8-channel")
    built = {k: _op_graph(k, 2 * max(PASTS)) for k in kinds}
    res: dict = {"rounds": ROUNDS, "runs_per_round": RUNS, "threads": 1, "ms": {}}
    for past in PASTS:
        times: dict[str, list[float]] = {k: [] for k in kinds}
        for r in range(ROUNDS + 1):  # round 0 warms up
            for k in kinds:
                sess, b, feeds = built[k]
                feeds["seqlens_k"][0], feeds["total_sequence_length"][()] = past, past + 1
                t = time.perf_counter()
                for _ in range(RUNS):
                    sess.run_with_iobinding(b)
                if r:
                    times[k].append((time.perf_counter() - t) / RUNS * 1e3)
        res["ms"][str(past)] = {k: {"median": float(np.median(v)), "min": float(np.min(v))}
                                for k, v in times.items()}
    return res


def _nll(lm, ids: list[int]) -> np.ndarray:
    """-log p of tokens 1.. of `ids` given the ones before, the prompt run in PIECE pieces."""
    cache = lm.new_cache(1, len(ids))
    cache.clear()
    out = []
    for start in range(0, len(ids), PIECE):
        piece = ids[start:start + PIECE]
        cache.extend(piece)
        hidden = cache.prompt_hidden()[0, :len(piece)]
        follow = ids[start + 1:start + 1 + len(piece)]
        lp = lm.logprobs_from_hidden(np.ascontiguousarray(hidden[:len(follow)]), follow)
        out += [-p.logprob for p in lp]
    return np.array(out)


def quality(fp32_dir: Path, int8_dir: Path, context: int, windows: int) -> dict:
    import tinyt.runtime as rt
    from tinyt.benchmarks.real_quality import heldout_text

    lms = {"float32": rt.load(fp32_dir, threads=1, tune=False),
           "int8": rt.load(int8_dir, threads=1, tune=False)}
    ids = lms["float32"].tokenizer.encode(heldout_text())
    step = (len(ids) - context) // max(windows - 1, 1)
    nll = {k: [] for k in lms}
    for w in range(windows):
        row = ids[w * step: w * step + context]
        for k, lm in lms.items():
            t = time.perf_counter()
            nll[k].append(_nll(lm, row))
            print(f"window {w} {k}: {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
    spans = [(a, min(b, context)) for a, b in zip(SPANS, SPANS[1:]) if a < context]
    res = {"context": context, "windows": windows, "held_out_tokens": len(ids), "piece": PIECE,
           "perplexity": {}, "by_position": {}}
    for k in lms:
        all_ = np.concatenate(nll[k])
        res["perplexity"][k] = float(np.exp(all_.mean()))
        res["by_position"][k] = {f"{a}-{b}": float(np.exp(np.concatenate(
            [x[max(a - 1, 0):b - 1] for x in nll[k]]).mean())) for a, b in spans}
    res["change"] = res["perplexity"]["int8"] / res["perplexity"]["float32"] - 1
    res["starts"] = [w * step for w in range(windows)]
    res["change_by_window"] = [float(np.exp(a.mean() - b.mean()) - 1)
                               for a, b in zip(nll["int8"], nll["float32"])]
    res["change_by_position"] = {s: res["by_position"]["int8"][s] /
                                 res["by_position"]["float32"][s] - 1
                                 for s in res["by_position"]["int8"]}
    return res


def decode(fp32_dir: Path, int8_dir: Path, steps: int) -> dict:
    """Each artifact's cache filled to each of DECODE_PASTS tokens, then `steps` decode steps
    of each, alternating one step at a time; "added" is each length's median less the short
    past's (what reading the longer cache costs)."""
    import tinyt.runtime as rt

    lms = {"float32": rt.load(fp32_dir, threads=1, tune=False),
           "int8": rt.load(int8_dir, threads=1, tune=False)}
    caches = {k: lm.new_cache(1, max(DECODE_PASTS) + 2 * steps) for k, lm in lms.items()}
    ids = (np.arange(max(DECODE_PASTS), dtype=np.int64) * 7919 % 8000 + 1).tolist()
    res: dict = {"steps": steps, "ms": {}}
    for past in DECODE_PASTS:
        for c in caches.values():
            while int(c.lens[0]) < past:
                n = int(c.lens[0])
                c.extend(ids[n:min(past, n + PIECE)])
        times: dict[str, list[float]] = {k: [] for k in lms}
        for _ in range(steps):
            for k, c in caches.items():
                t = time.perf_counter()
                c.step(np.array([5]), None)
                times[k].append((time.perf_counter() - t) * 1e3)
        res["ms"][str(past)] = {k: {"median": float(np.median(v)), "min": float(np.min(v))}
                                for k, v in times.items()}
        for c in caches.values():  # back to `past` tokens for the next fill
            c.lens[0] = past
    short = res["ms"][str(DECODE_PASTS[0])]
    res["added_ms"] = {p: {k: v["median"] - short[k]["median"] for k, v in res["ms"][p].items()}
                       for p in map(str, PASTS)}
    return res


def main() -> None:
    from tinyt.benchmarks.environment import environment

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=("op", "quality", "decode"))
    ap.add_argument("paths", nargs="+", type=Path)
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    a = ap.parse_args()
    *dirs, out = a.paths
    if a.what == "op":
        res = op()
    elif a.what == "quality":
        res = quality(dirs[0], dirs[1], a.context, a.windows)
    else:
        res = decode(dirs[0], dirs[1], a.steps)
    res = {"what": a.what, "artifacts": [str(d) for d in dirs],
           "machine": environment(threads=1, note="2 cores shared with other jobs while timed"),
           **res}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
