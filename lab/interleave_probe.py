"""Why the harness settles before it times: the n-th ONNX Runtime call after a PyTorch step.

ORT INT8 decode (batch 1, past block_size - 1, 2 threads) timed as the 1st, 2nd, ... 16th call
right after one PyTorch eager KV-cache step, 200 repetitions, and alone (a run of calls with no
PyTorch in between, in the same period); medians in ms.

    .venv/bin/python -m lab.interleave_probe artifacts
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from tinyt.benchmarks.variants import OrtVariant, torch_variants
from tinyt.manifest import read_model_config


def main() -> None:
    artifacts = Path(sys.argv[1] if len(sys.argv) > 1 else "artifacts")
    cfg, _ = read_model_config(artifacts / "onnx-int8")
    past = cfg.block_size - 1
    torch_step = torch_variants(artifacts / "checkpoint", 2)[0].decode(1, past)
    ort_step = OrtVariant("int8", artifacts / "onnx-int8", cfg, 2).open().decode(1, past)
    for _ in range(50):
        ort_step()
        torch_step()
    alone, after = [], [[] for _ in range(16)]
    for _ in range(200):
        for _ in range(8):  # alone: the previous call was ORT's too
            start = time.perf_counter()
            ort_step()
            alone.append(time.perf_counter() - start)
        torch_step()
        for times in after:
            start = time.perf_counter()
            ort_step()
            times.append(time.perf_counter() - start)
    ms = lambda v: round(1e3 * statistics.median(v), 3)  # noqa: E731
    print({"alone": ms(alone), "nth_call_after_torch": [ms(v) for v in after]})


if __name__ == "__main__":
    main()
