"""`tinyt batch --ray ADDR`: the parts of batch.py run on Ray Data (the `ray` extra).

    driver: plan (batch.py) ─▶ ray.data.from_items([{"part": k} for the parts to run])
      ─▶ map_batches(PartActor, batch_size=1, ActorPoolStrategy(size=actors)): a pool of
         actors spread over the nodes, each batch.PartActor: Runner(job) once (the artifact
         loaded once), then one part per call: its input rows read from the shared path, the
         answers written to OUT/part-k atomically
      ─▶ iter_rows: on_part(rows) as the parts land (the progress lines)

A part is the unit Ray retries: an actor lost with its node is restarted elsewhere and the
part it held runs again, rewriting the same file whole (never two copies of a row). The
input, the artifact and OUT must be at the same path on every node (a shared file system).
What runs a part comes from batch.py as an argument: this module imports Ray, batch.py not.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


def run_ray(actor: type, job: dict[str, Any], out: Path, todo: list[int], *, address: str,
            actors: int = 1, threads: int | None = 1,
            on_part: Callable[[int], None] = lambda rows: None) -> int:
    """The parts in `todo` on a Ray Data pool of `actors` instances of `actor(job, out,
    threads)` (connecting to `address`, or 'local': a new local cluster, unless this process
    is connected already); the rows written."""
    import ray

    from tinyt.errors import ConfigError
    from tinyt.server.ray_serve import connect

    if not (isinstance(actors, int) and actors >= 1):
        raise ConfigError(f"--actors {actors!r} must be an integer >= 1")
    connect(None if address == "local" else address)
    if not todo:
        return 0
    ray.data.DataContext.get_current().enable_progress_bars = False
    data = ray.data.from_items([{"part": k} for k in todo], override_num_blocks=len(todo))
    results = data.map_batches(actor, batch_size=1,
                               compute=ray.data.ActorPoolStrategy(size=actors),
                               num_cpus=threads or 1, scheduling_strategy="SPREAD",
                               fn_constructor_args=(job, str(out.resolve()), threads))
    rows = 0
    for r in results.iter_rows():
        rows += int(r["rows"])
        on_part(int(r["rows"]))
    return rows
