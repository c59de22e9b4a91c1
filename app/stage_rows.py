"""A variants table's stages run in order (the encoder's and the encoder-decoder's main job):
each row's stage from its source to its directory, skipped where the output's manifest records
exactly the input it would read now; then PyTorch's verify on the rows that ask for it."""
from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from tinyt.artifacts import arguments
from tinyt.manifest import fresh


def run_rows(rows, out: Path, ckpt: Path, timings: dict[str, Any],
             log: Callable[[str], None], **given: Any) -> dict[str, bool]:
    """Run each row's stage (timings[step]: seconds, or 'skipped' where up to date), then
    verify the rows marked so against the checkpoint (OUT/DIR-verify.json); returns
    {directory: passed}. `given`: what arguments() passes on (data)."""
    from tinyt.export import export_onnx, verify
    from tinyt.export.optimize import optimize
    from tinyt.export.quantize import quantize

    stages = {"export": export_onnx, "optimize": optimize, "quantize": quantize}
    for v in rows:
        source, target, options = arguments(v, out, checkpoint=ckpt, **given)
        if fresh(target, source):
            log(f"[{v.step}] up to date: {target}")
            timings[v.step] = "skipped"
            continue
        log(f"[{v.step}] running -> {target}")
        t = time.perf_counter()
        partial(stages[v.stage], source, target, **options)()
        timings[v.step] = round(time.perf_counter() - t, 1)
        log(f"[{v.step}] done in {timings[v.step]} s")
    checks = {}
    for v in (v for v in rows if v.verify):
        report = verify(ckpt, out / v.dir, report_path=out / f"{v.dir}-verify.json")
        checks[v.dir] = report["passed"]
        log(f"[verify] {v.dir}: {'passed' if report['passed'] else 'FAILED'}")
    return checks
