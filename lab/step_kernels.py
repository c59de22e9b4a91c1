"""Which weight-matmul kernel reaches the memory floor of a decode step on this CPU.

A decode step at batch 1 multiplies one row by every weight matrix of the model once: at the
GPT-2-small shape that is ~92 MB of int8 weights, more than any cache holds, so a step cannot
run faster than one core reads those bytes from memory. This probe builds, per candidate
kernel, one graph holding every weight matmul of a model shape (each layer's qkv, attention
output, MLP in and out, and the lm_head), all fed one row, with random weights; times
`session.run` at 1 thread (or --threads) with the candidates interleaved round by round; and
reports each as ms per step, GB/s of weight bytes and its ratio to the floor:

    floor = bytes read per step / the cores' read bandwidth (numpy summing a buffer larger than
            the last-level cache, one part per thread, interleaved with the rest)

    .venv/bin/python -m lab.step_kernels --n-layer 12 --n-embd 768 --vocab 8192 \
        --out benchmarks/results/step-kernels-xeon-amx
    # Llama-3.2-1B's matmuls, the 4-bit kernel's block sizes and zero points, 2 threads:
    .venv/bin/python -m lab.step_kernels --n-layer 16 --n-embd 2048 --kv-width 512 \
        --n-inner 8192 --gated --vocab 128256 --threads 2 --kinds nbits-b4-k32-a4,...

Candidates: MatMulNBits 8-bit at several block sizes (accuracy_level 4: int8 activations,
products on the CPU's int8 dot-product units; and 0: fp32 products), DynamicQuantizeMatMul
(int8 per channel, MLAS's int8 GEMM: AMX / VNNI / AVX2 by CPU), 4-bit MatMulNBits and fp32
MatMul for reference. A kind names MatMulNBits' bits, block and accuracy_level
(nbits-b4-k32-a4), with -z for a zero point per block (asymmetric).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from tinyt.benchmarks.environment import environment
from tinyt.export.blockquant import block_quantize, channel_quantize, pick_block

MS = "com.microsoft"


def shapes(n_layer: int, n_embd: int, vocab: int, n_inner: int | None = None,
           kv_width: int | None = None, gated: bool = False) -> list[tuple[str, int, int]]:
    """(name, K, N) of every weight matmul of a decoder step, lm_head last: GPT-2's by default;
    a Llama's with kv_width (grouped-query keys and values: q + 2 kv_width outputs) and gated
    (the gate and up projections as one matmul of 2 n_inner outputs)."""
    C, inner, kv = n_embd, n_inner or 4 * n_embd, kv_width or n_embd
    per_layer = [("qkv", C, C + 2 * kv), ("attn_out", C, C),
                 ("mlp_in", C, (2 if gated else 1) * inner), ("mlp_out", inner, C)]
    return [(f"h{i}.{n}", k, m) for i in range(n_layer) for n, k, m in per_layer] + \
        [("lm_head", C, vocab)]


def _node(kind: str, name: str, x: str, w: np.ndarray, inits: list) -> onnx.NodeProto:
    """One weight matmul y = x @ w (w [K, N]) in the candidate's kernel."""
    K, N = w.shape
    if kind == "fp32":
        inits.append(numpy_helper.from_array(w, f"{name}.w"))
        return helper.make_node("MatMul", [x, f"{name}.w"], [name], name=name)
    if kind == "qgemm":
        q, s = channel_quantize(w)
        inits += [numpy_helper.from_array(q, f"{name}.q"), numpy_helper.from_array(s, f"{name}.s"),
                  numpy_helper.from_array(np.zeros(N, np.int8), f"{name}.z")]
        return helper.make_node("DynamicQuantizeMatMul", [x, f"{name}.q", f"{name}.s",
                                                          f"{name}.z"], [name], domain=MS)
    parts = kind.split("-")  # nbits-b8-k64-a4, and -z: a zero point per block (asymmetric)
    bits, asked, level = (int(v[1:]) for v in parts[1:4])
    block = pick_block(K, asked)  # the quantizer's rule: the block, or a smaller one dividing K
    if block is None:
        raise ValueError(f"K={K} has no power-of-two block >= 16 for {kind}")
    q, s, z = block_quantize(np.ascontiguousarray(w.T), bits, block,
                             "asymmetric" if parts[4:] == ["z"] else "symmetric")
    inits += [numpy_helper.from_array(q, f"{name}.q"), numpy_helper.from_array(s, f"{name}.s")]
    zero = []
    if z is not None:
        inits.append(numpy_helper.from_array(z, f"{name}.z"))
        zero = [f"{name}.z"]
    return helper.make_node("MatMulNBits", [x, f"{name}.q", f"{name}.s", *zero], [name], domain=MS,
                            K=K, N=N, bits=bits, block_size=block, accuracy_level=level)


def build(kind: str, layout: list[tuple[str, int, int]], seed: int = 0) -> tuple[bytes, int]:
    """(serialized graph, bytes of weights a run reads) for one candidate kernel."""
    rng = np.random.default_rng(seed)
    inputs = sorted({k for _, k, _ in layout})
    nodes, inits, outputs = [], [], []
    for name, K, N in layout:
        w = (rng.standard_normal((K, N)) * 0.02).astype(np.float32)
        nodes.append(_node(kind, name, f"x{K}", w, inits))
        outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, N]))
    graph = helper.make_graph(nodes, kind, [helper.make_tensor_value_info(
        f"x{k}", TensorProto.FLOAT, [1, k]) for k in inputs], outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                   helper.make_opsetid(MS, 1)])
    weight_bytes = sum(len(i.raw_data) or numpy_helper.to_array(i).nbytes for i in inits)
    return model.SerializeToString(), weight_bytes


def read_bandwidth_probe(nbytes: int, threads: int = 1):
    """A closure that reads `nbytes` once (numpy sums of a buffer viewed as int64, one part per
    thread, all at once: numpy's reduction lets go of the GIL)."""
    buf = np.ones(max(nbytes // 8, threads), dtype=np.int64)
    if threads == 1:
        return lambda: int(buf.sum())
    parts = np.array_split(buf, threads)
    pool = ThreadPoolExecutor(threads)
    return lambda: sum(pool.map(np.sum, parts))


KINDS = ("nbits-b8-k32-a4", "nbits-b8-k64-a4", "nbits-b8-k128-a4", "nbits-b8-k256-a4",
         "nbits-b8-k64-a0", "qgemm", "nbits-b4-k32-a4", "fp32")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n-layer", type=int, default=12)
    ap.add_argument("--n-embd", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--n-inner", type=int, help="MLP width (default 4 x n-embd)")
    ap.add_argument("--kv-width", type=int, help="keys' (and values') width: grouped-query "
                    "attention (default n-embd)")
    ap.add_argument("--gated", action="store_true", help="a gated MLP (SwiGLU: gate and up "
                    "as one matmul of 2 x n-inner)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--out", type=Path, help="write results.json and results.md here")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    layout = shapes(args.n_layer, args.n_embd, args.vocab, args.n_inner, args.kv_width,
                    args.gated)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = args.threads, 1
    # no pool thread spins after its run: the candidates take turns, and a spinning pool would
    # hold the cores the next candidate runs on (as tinyt's runtime, runtime/session.py)
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.log_severity_level = 3
    closures, weight_bytes = {}, {}
    feeds = {f"x{k}": np.random.default_rng(1).standard_normal((1, k)).astype(np.float32)
             for k in sorted({k for _, k, _ in layout})}
    for kind in args.kinds.split(","):
        graph, weight_bytes[kind] = build(kind, layout)
        sess = ort.InferenceSession(graph, opts, providers=["CPUExecutionProvider"])
        closures[kind] = lambda s=sess: s.run(None, feeds)
    int8_bytes = sum(k * n for _, k, n in layout)
    closures["read"] = read_bandwidth_probe(int8_bytes, args.threads)
    weight_bytes["read"] = int8_bytes
    for fn in closures.values():  # warm-up (first runs pack weights, fault pages in)
        fn(), fn()
    times: dict[str, list[float]] = {k: [] for k in closures}
    for _ in range(args.rounds):
        for name, fn in closures.items():
            fn()  # untimed: the previous candidate's bytes left the cache
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    ms = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    bandwidth = int8_bytes / (ms["read"] / 1e3)  # bytes/s, `threads` cores
    env = environment(("tinyt", "onnxruntime", "onnx", "numpy"))
    cpu = env["cpu"]
    lines = [f"CPU: {cpu['model']} (avx512_vnni={cpu['avx512_vnni']}, "
             f"avx_vnni={cpu['avx_vnni']}, amx_int8={cpu['amx_int8']}); onnxruntime "
             f"{ort.__version__}; {args.threads} thread(s); {args.rounds} interleaved rounds, "
             f"medians; shape {args.n_layer} layers x {args.n_embd}, vocab {args.vocab}, "
             f"matmuls (name, K, N) {sorted(set(layout[:4]) | {layout[-1]})}", "",
             f"{args.threads} core(s) read {bandwidth / 1e9:.1f} GB/s "
             f"({int8_bytes / 1e6:.1f} MB in "
             f"{ms['read']:.2f} ms); floor = a kernel's weight bytes / that.", "",
             "| kernel | MB of weights | ms / step | GB/s | × floor |", "|---|---|---|---|---|"]
    rows = []
    for k in closures:
        if k == "read":
            continue
        floor_ms = weight_bytes[k] / bandwidth * 1e3
        rows.append({"kernel": k, "weight_mb": weight_bytes[k] / 1e6, "ms": ms[k],
                     "gb_per_s": weight_bytes[k] / ms[k] / 1e6, "x_floor": ms[k] / floor_ms})
        r = rows[-1]
        lines.append(f"| {k} | {r['weight_mb']:.1f} | {r['ms']:.2f} | {r['gb_per_s']:.1f} | "
                     f"{r['x_floor']:.2f} |")
    print("\n".join(lines))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.md").write_text("\n".join(lines) + "\n")
        (args.out / "results.json").write_text(json.dumps(
            {"environment": env, "read_gb_per_s": bandwidth / 1e9,
             "shape": {k: v for k, v in vars(args).items() if k != "out"}, "kernels": rows},
            indent=2) + "\n")


if __name__ == "__main__":
    main()
