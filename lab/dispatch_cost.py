"""What ONNX Runtime's executor costs per node, apart from any kernel's work: a chain of N
`Add`s on 128 floats (nothing to compute), 1 thread, I/O bound once, median of 2000 runs.

    .venv/bin/python -m lab.dispatch_cost

The slope is the cost of one more node in a decode step; the intercept, of one run call.
"""
from __future__ import annotations

import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper


def chain(n: int) -> bytes:
    nodes = [helper.make_node("Add", [f"y{i - 1}" if i else "x", "b"], [f"y{i}"])
             for i in range(n)] + [helper.make_node("Identity", [f"y{n - 1}"], ["out"])]
    value = [1, 1, 128]
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, value)],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, value)],
        [onnx.numpy_helper.from_array(np.ones(128, np.float32), "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]) \
        .SerializeToString()


def run_us(n: int, runs: int = 2000) -> float:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(chain(n), opts, providers=["CPUExecutionProvider"])
    x, y = np.zeros((1, 1, 128), np.float32), np.zeros((1, 1, 128), np.float32)
    binding = session.io_binding()
    binding.bind_input("x", "cpu", 0, np.float32, list(x.shape), x.ctypes.data)
    binding.bind_output("out", "cpu", 0, np.float32, list(y.shape), y.ctypes.data)
    for _ in range(200):
        session.run_with_iobinding(binding)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        session.run_with_iobinding(binding)
        times.append(time.perf_counter() - t)
    return float(np.median(times)) * 1e6


def main() -> None:
    sizes = (1, 25, 50, 100)
    us = [run_us(n) for n in sizes]
    for n, t in zip(sizes, us):
        print(f"{n:4d} nodes: {t:6.2f} us a run")
    slope, intercept = np.polyfit(sizes, us, 1)
    print(f"per node {slope:.2f} us, per run {intercept:.2f} us (onnxruntime {ort.__version__})")


if __name__ == "__main__":
    main()
