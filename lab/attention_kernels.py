"""Which attention kernel of ONNX Runtime's CPU provider decodes fastest over a long past.

One decode step's attention for one layer at batch 1: one query token against `past` cached
keys and values, in a buffer of `capacity` tokens as tinyt's runtime binds it (past and present
one buffer: the kernel writes the new token in place). Candidates:

- gqa-fp32: `GroupQueryAttention` on an fp32 cache (what tinyt's shared-cache pair and ONNX
  Runtime GenAI's builder run on CPU);
- gqa-fp16: the same kernel on an fp16 cache (half the bytes; llama.cpp keeps its cache in f16);
- matmul-fp32: the attention in standard operators, every query head of a KV group in one
  product: `FusedMatMul` (q × Kᵀ over the buffer) -> Add (mask) -> Softmax -> MatMul (× V).
  The new token's key and value are placed in the buffer before timing: this form's cost of
  writing them is not counted (it can only be slower than timed).

Each candidate is first checked against a float64 numpy reference on the same inputs (gqa-fp16
on the inputs rounded to fp16; the bound is fp16's rounding of the output, 2^-11 of its
largest value; the fp32 forms within fp32 summation over `past` terms). Then the candidates
take turns, round by round, with a numpy read of the fp32 cache's bytes (the read floor), and
each prints ms per layer-step, × the floor and ms for all `--n-layer` layers.

    .venv/bin/python -m lab.attention_kernels --heads 16 --kv-heads 8 --head-dim 128 \
        --past 4096 --n-layer 28 --threads 2 \
        --out benchmarks/results/attention-kernels-qwen3-2t-epyc-vnni

Rotary is off in every candidate (the kernels' rotary rotates one token: not what a long past
costs).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from lab.step_kernels import read_bandwidth_probe
from tinyt.benchmarks.environment import environment

MS = "com.microsoft"
KINDS = ("gqa-fp32", "gqa-fp16", "matmul-fp32")


def _model(nodes, inputs, outputs):
    graph = helper.make_graph(nodes, "attention", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                   helper.make_opsetid(MS, 1)]).SerializeToString()


def build(kind: str, heads: int, kv_heads: int, head_dim: int, capacity: int) -> bytes:
    """One layer's decode attention in the candidate's form."""
    if kind.startswith("gqa-"):
        t = TensorProto.FLOAT16 if kind == "gqa-fp16" else TensorProto.FLOAT
        cache = [1, kv_heads, capacity, head_dim]
        inputs = [helper.make_tensor_value_info("q", t, [1, 1, heads * head_dim]),
                  helper.make_tensor_value_info("k", t, [1, 1, kv_heads * head_dim]),
                  helper.make_tensor_value_info("v", t, [1, 1, kv_heads * head_dim]),
                  helper.make_tensor_value_info("past_key", t, cache),
                  helper.make_tensor_value_info("past_value", t, cache),
                  helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
                  helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, [])]
        node = helper.make_node("GroupQueryAttention", [i.name for i in inputs],
                                ["out", "present_key", "present_value"], domain=MS,
                                num_heads=heads, kv_num_heads=kv_heads)
        outputs = [helper.make_tensor_value_info(n, t, s) for n, s in
                   (("out", [1, 1, heads * head_dim]), ("present_key", cache),
                    ("present_value", cache))]
        return _model([node], inputs, outputs)
    if kind != "matmul-fp32":
        raise ValueError(f"unknown kind {kind!r}: one of {', '.join(KINDS)}")
    group = heads // kv_heads
    f = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("q", f, [1, kv_heads, group, head_dim]),
              helper.make_tensor_value_info("key", f, [1, kv_heads, capacity, head_dim]),
              helper.make_tensor_value_info("value", f, [1, kv_heads, capacity, head_dim]),
              helper.make_tensor_value_info("mask", f, [1, 1, 1, capacity])]
    nodes = [helper.make_node("FusedMatMul", ["q", "key"], ["scores"], domain=MS, transB=1,
                              alpha=float(head_dim ** -0.5)),
             helper.make_node("Add", ["scores", "mask"], ["masked"]),
             helper.make_node("Softmax", ["masked"], ["probs"], axis=-1),
             helper.make_node("MatMul", ["probs", "value"], ["out"])]
    return _model(nodes, inputs, [helper.make_tensor_value_info(
        "out", f, [1, kv_heads, group, head_dim])])


def reference(q, key, value, past: int) -> np.ndarray:
    """softmax(q Kᵀ / √d) V over the first past + 1 tokens, in float64: out [heads, head_dim]
    (q [heads, d]; key, value [kv_heads, capacity, d]; query head h reads KV head h // group)."""
    heads, d = q.shape
    group = heads // key.shape[0]
    k = np.repeat(key[:, :past + 1].astype(np.float64), group, axis=0)
    v = np.repeat(value[:, :past + 1].astype(np.float64), group, axis=0)
    s = np.einsum("hd,htd->ht", q.astype(np.float64), k) / np.sqrt(d)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("ht,htd->hd", p, v)


def candidate(kind: str, args, opts, rng) -> tuple:
    """(closure running one step, its output as [heads, head_dim], the reference, the bound)."""
    H, KV, D, cap, past = args.heads, args.kv_heads, args.head_dim, args.capacity, args.past
    dt = np.float16 if kind == "gqa-fp16" else np.float32
    q = rng.standard_normal((H, D)).astype(dt)
    key = rng.standard_normal((KV, cap, D)).astype(dt)
    value = rng.standard_normal((KV, cap, D)).astype(dt)
    sess = ort.InferenceSession(build(kind, H, KV, D, cap), opts,
                                providers=["CPUExecutionProvider"])
    io = sess.io_binding()
    io.bind_output("out")  # first: copy_outputs_to_cpu gives outputs in binding order
    if kind.startswith("gqa-"):
        new_k, new_v = key[:, past].copy(), value[:, past].copy()
        buffers = [ort.OrtValue.ortvalue_from_numpy(x[None].copy()) for x in (key, value)]
        io.bind_cpu_input("q", q.reshape(1, 1, -1))
        io.bind_cpu_input("k", new_k.reshape(1, 1, -1))
        io.bind_cpu_input("v", new_v.reshape(1, 1, -1))
        for name, buf in zip(("key", "value"), buffers):
            io.bind_ortvalue_input(f"past_{name}", buf)
            io.bind_ortvalue_output(f"present_{name}", buf)  # one buffer: written in place
        io.bind_cpu_input("seqlens_k", np.array([past], np.int32))
        io.bind_cpu_input("total_sequence_length", np.array(past + 1, np.int32))
    else:
        mask = np.zeros((1, 1, 1, cap), np.float32)
        mask[..., past + 1:] = -np.inf
        buffers = [ort.OrtValue.ortvalue_from_numpy(x[None].copy()) for x in (key, value)]
        io.bind_cpu_input("q", q.reshape(1, KV, H // KV, D))
        io.bind_ortvalue_input("key", buffers[0])
        io.bind_ortvalue_input("value", buffers[1])
        io.bind_cpu_input("mask", mask)
    sess.run_with_iobinding(io)
    out = io.copy_outputs_to_cpu()[0].reshape(H, D).astype(np.float64)
    ref = reference(q, key, value, past)
    if dt == np.float16:  # the kernel's output is rounded to fp16 once
        bound = 2.0 ** -11 * np.abs(ref).max() + 1e-5
    else:  # fp32 sums of past + 1 terms, in any order
        bound = (past + 1) * np.finfo(np.float32).eps * np.abs(value).max()
    return (lambda: sess.run_with_iobinding(io)), out, ref, bound


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--past", type=int, default=4096)
    ap.add_argument("--capacity", type=int, help="the buffer's tokens (default past + 64)")
    ap.add_argument("--n-layer", type=int, default=28, help="layers a step runs (for ms/step)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--out", type=Path, help="write results.json and results.md here")
    args = ap.parse_args()
    args.capacity = args.capacity or args.past + 64
    if args.heads % args.kv_heads or args.past < 1 or args.capacity <= args.past \
            or args.rounds < 1:
        ap.error("heads must be a multiple of kv-heads, past >= 1, capacity > past, rounds >= 1")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = args.threads, 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.log_severity_level = 3
    rng = np.random.default_rng(0)
    closures, errors = {}, {}
    for kind in args.kinds.split(","):
        fn, out, ref, bound = candidate(kind, args, opts, rng)
        err = float(np.abs(out - ref).max())
        if not err <= bound:
            raise SystemExit(f"{kind} differs from the reference by {err:.3g} (bound {bound:.3g})"
                             ": not the same attention; nothing timed")
        closures[kind], errors[kind] = fn, (err, float(bound))
    kv_bytes = 2 * args.kv_heads * (args.past + 1) * args.head_dim * 4  # fp32 keys and values
    closures["read"] = read_bandwidth_probe(kv_bytes, args.threads)
    for fn in closures.values():
        fn(), fn()
    times: dict[str, list[float]] = {k: [] for k in closures}
    for _ in range(args.rounds):
        for name, fn in closures.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    ms = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    env = environment(("tinyt", "onnxruntime", "numpy"))
    cpu = env["cpu"]
    lines = [f"CPU: {cpu['model']} (avx512_vnni={cpu['avx512_vnni']}, amx_int8="
             f"{cpu['amx_int8']}); onnxruntime {ort.__version__}; {args.threads} thread(s); "
             f"{args.rounds} interleaved rounds, medians; {args.heads} heads / {args.kv_heads} "
             f"KV heads x {args.head_dim}, one token after {args.past} in a buffer of "
             f"{args.capacity}", "",
             f"read floor: the fp32 cache's {kv_bytes / 1e6:.1f} MB a layer read in "
             f"{ms['read']:.3f} ms ({kv_bytes / ms['read'] / 1e6:.1f} GB/s)", "",
             f"| kernel | ms / layer | × fp32 read floor | ms / step ({args.n_layer} layers) | "
             "max error vs float64 (bound) |", "|---|---|---|---|---|"]
    rows = []
    for k in closures:
        if k == "read":
            continue
        rows.append({"kernel": k, "ms_layer": ms[k], "x_floor": ms[k] / ms["read"],
                     "ms_step": ms[k] * args.n_layer, "error": errors[k][0],
                     "bound": errors[k][1]})
        r = rows[-1]
        lines.append(f"| {k} | {r['ms_layer']:.3f} | {r['x_floor']:.2f} | {r['ms_step']:.1f} | "
                     f"{r['error']:.2g} ({r['bound']:.2g}) |")
    print("\n".join(lines))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.md").write_text("\n".join(lines) + "\n")
        (args.out / "results.json").write_text(json.dumps(
            {"environment": env, "read_ms": ms["read"], "kv_bytes_layer": kv_bytes,
             "shape": {k: v for k, v in vars(args).items() if k != "out"}, "kernels": rows},
            indent=2) + "\n")


if __name__ == "__main__":
    main()
