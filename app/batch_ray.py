"""`tinyt batch --ray ADDR`: the parts of batch.py run on Ray Data (the `ray` extra).

    driver: plan (batch.py) ─▶ ray.data.from_items([{"part": k} for the parts to run])
      ─▶ map_batches(PartActor, batch_size=1, concurrency=actors): a pool of actors, each
         Runner(job) once (the artifact loaded once), each batch one part: its input rows
         read from the shared path, the answers written to OUT/part-k atomically
      ─▶ iter_rows: progress as the parts land

A part is the unit Ray retries: an actor lost with its node is restarted elsewhere and the
part it held runs again, rewriting the same file whole (never two copies of a row). The
input, the artifact and OUT must be at the same path on every node (a shared file system).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .batch import Job, Runner, progress


class PartActor:
    """One actor of the pool: the artifact loaded once, then one part per call."""

    def __init__(self, job: dict[str, Any], out: str, threads: int | None):
        self.runner, self.out = Runner(Job(**job), threads=threads), Path(out)

    def __call__(self, batch: dict[str, Any]) -> dict[str, list]:
        parts = [int(k) for k in batch["part"]]
        rows = [self.runner.run_part(self.out, k) for k in parts]
        return {"part": parts, "rows": rows}


def run_ray(job: Job, out: Path, todo: list[int], *, address: str, actors: int = 1,
            threads: int | None = 1, log: Callable[[str], None] = print) -> int:
    """The parts in `todo` on a Ray Data actor pool of `actors` (connecting to `address`, or
    'local': a new local cluster, unless Ray is already initialised); rows written."""
    import ray

    from tinyt.errors import ConfigError
    from tinyt.server.ray_serve import connect

    if not (isinstance(actors, int) and actors >= 1):
        raise ConfigError(f"--actors {actors!r} must be an integer >= 1")
    if not ray.is_initialized():
        connect(None if address == "local" else address)
    if not todo:
        return 0
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    data = ray.data.from_items([{"part": k} for k in todo], override_num_blocks=len(todo))
    results = data.map_batches(PartActor, batch_size=1,
                               compute=ray.data.ActorPoolStrategy(size=actors),
                               num_cpus=threads or 1, scheduling_strategy="SPREAD",
                               fn_constructor_args=(asdict(job), str(out.resolve()), threads))
    done, rows, t0 = job.parts - len(todo), 0, time.perf_counter()
    for r in results.iter_rows():
        rows += int(r["rows"])
        done += 1
        progress(job, done, rows, t0, log)
    return rows
