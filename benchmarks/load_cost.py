"""Load time, first-call latency and peak resident memory of one variant, measured in a fresh
process (so variants never share memory and each pays its own imports):

    python -m benchmarks.load_cost ort artifacts/onnx-int8 --threads 2
    python -m benchmarks.load_cost torch artifacts/checkpoint --threads 2
    python -m benchmarks.load_cost runtime artifacts/onnx-int8-gqa --threads 2

prints one JSON object. `runtime` is `tinyt.runtime.load` as a user calls it (a shared-cache
pair's tuner included: its plan is printed too); every kind reports the resident memory after
the load and the load's own peak, beside the peak after the calls. `measure_in_subprocess`
runs it for the harness.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

FIRST_CALL_TOKENS = 32  # the first call is a prefill of this many tokens, batch 1


def _status_bytes(key: str) -> int | None:
    """A size from /proc/self/status (VmRSS, VmHWM) in bytes; None where there is none."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return None


def _peak_rss_bytes() -> int:
    """This process's peak resident memory. VmHWM belongs to the process's own address space;
    getrusage's ru_maxrss can carry the spawning parent's high-water mark across exec."""
    peak = _status_bytes("VmHWM")
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 if peak is None else peak


def measure(kind: str, path: Path, threads: int) -> dict:
    t0 = time.perf_counter()
    about: dict = {}
    if kind == "runtime":
        sys.modules["torch"] = None  # as a deployment runs it
        import tinyt.runtime as rt
        lm = rt.load(path, threads=threads)
        n = min(FIRST_CALL_TOKENS, lm.config.block_size - 1)  # a token must follow
        ids = [i % lm.tokenizer.vocab_size for i in range(1, n + 1)]
        call = lambda: lm.generate_ids([ids], max_new_tokens=1)  # noqa: E731
        if getattr(lm, "plan", None) is not None:
            about["plan"] = lm.plan.describe()
    elif kind == "ort":
        sys.modules["torch"] = None  # an ONNX Runtime deployment has no torch: prove it
        import numpy as np
        import onnxruntime as ort

        from tinyt.contract import DECODER_WITH_PAST
        from tinyt.manifest import read_model_config
        from tinyt.runtime.feeds import prefill_feeds  # torch-free, as a deployment is
        cfg, _ = read_model_config(path)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        sess = ort.InferenceSession(str(path / "model.onnx"), opts,
                                    providers=["CPUExecutionProvider"])
        ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (1, FIRST_CALL_TOKENS))
        feeds = prefill_feeds(cfg, DECODER_WITH_PAST, ids)
        call = lambda: sess.run(None, feeds)  # noqa: E731
    elif kind == "torch":
        import torch

        from tinyt.checkpoint import load_checkpoint
        torch.set_num_threads(threads)
        ck = load_checkpoint(path)
        ids = torch.randint(0, ck.config.vocab_size, (1, FIRST_CALL_TOKENS))

        def call():
            with torch.inference_mode():
                ck.model(ids)
    else:
        raise ValueError(f"kind={kind!r} is not one of runtime, ort, torch")
    load_s = time.perf_counter() - t0
    about |= {"rss_after_load_bytes": _status_bytes("VmRSS"),
              "load_peak_rss_bytes": _peak_rss_bytes()}
    t1 = time.perf_counter()
    call()
    first_s = time.perf_counter() - t1
    t2 = time.perf_counter()
    for _ in range(5):
        call()
    steady_s = (time.perf_counter() - t2) / 5
    return {"load_s": load_s, "first_call_ms": 1e3 * first_s, "steady_call_ms": 1e3 * steady_s,
            "peak_rss_bytes": _peak_rss_bytes(), **about}


def measure_in_subprocess(kind: str, path: Path, threads: int) -> dict:
    proc = subprocess.run([sys.executable, "-m", "tinyt.benchmarks.load_cost", kind,
                           str(path.resolve()), "--threads", str(threads)],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=["runtime", "ort", "torch"])
    ap.add_argument("path", type=Path)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    print(json.dumps(measure(args.kind, args.path, args.threads)))


if __name__ == "__main__":
    main()
