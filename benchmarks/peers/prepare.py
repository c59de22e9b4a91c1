"""Before a run: which engines can run here (the others are skipped, with the reason), and
every engine's model brought up to date under ARTIFACTS:

    tinyt's on-demand variants (the catalogue's rows made_by "peers": onnx-int4, onnx-int4-gqa)
        made by their stage while not fresh
    peers/hf and each peer's conversion (formats.py), kept while the checkpoint (and the shim
    its tool runs under) is unchanged
"""
from __future__ import annotations

import importlib.metadata as md
import json
import os
import shutil
from pathlib import Path

from tinyt.artifacts import BY_DIR, REJECTED, VARIANTS, arguments, variant
from tinyt.errors import BenchError

from . import formats
from .engines import ENGINES


def prepare(artifacts: Path, engines: list[str]) -> dict[str, str]:
    """Convert the checkpoint for the peers that need it (kept under ARTIFACTS/peers while the
    checkpoint is unchanged). Returns the engines skipped, with the reason.

    In a child process: what the stages and converters allocate (a quantize of a 1.2B model
    holds 16 GB; to_hf and CTranslate2's converter hold the model in torch) is the child's,
    and goes with it. In this process it stayed with the parent (4.6 GB kept after the
    conversions at the Llama-3.2-1B shape) while every worker needed the memory."""
    import concurrent.futures as cf
    import multiprocessing as mp

    with cf.ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"),
                                initializer=exit_with_parent, initargs=(os.getpid(),)) as child:
        return child.submit(prepare_here, artifacts, engines).result()


def exit_with_parent(parent: int, poll_s: float = 0.5) -> None:
    """A child's initializer: a thread that ends the child once its parent is gone. A run
    killed during its conversions left them running (a spawned child is not told its parent
    died), holding gigabytes and both cores through the next run's timings."""
    import threading
    import time

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(1)
    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


def prepare_here(artifacts: Path, engines: list[str]) -> dict[str, str]:
    """prepare() in this process."""
    skipped = {}
    for name in engines:
        row = ENGINES[name]
        try:
            md.version(row.package)
        except md.PackageNotFoundError:
            skipped[name] = f"{row.package} is not installed ({row.install})"
    make_on_demand(artifacts, [n for n in engines if n not in skipped], skipped)
    llama = bool(json.loads((artifacts / "onnx-opt" / "config.json").read_text())
                 .get("tinyt", {}).get("model", {}).get("norm") == "rmsnorm")
    for name in engines:
        row = ENGINES[name]
        if name in skipped:
            continue
        if row.ours and not (artifacts / row.artifact / "manifest.json").is_file():
            skipped[name] = f"{artifacts / row.artifact} is missing (`tinyt pipeline` makes it)"
        elif row.missing is not None and (why := row.missing(llama)):
            skipped[name] = why
    need = [n for n in engines if ENGINES[n].convert is not None and n not in skipped]
    if need:
        _convert(artifacts, need, skipped)
    return skipped


_GENAI_BUILDER = formats.genai_builder  # its builds of one model run in one process


def _convert(artifacts: Path, names: list[str], skipped: dict[str, str]) -> None:
    from tinyt.fsutil import sha256_file

    stamp = sha256_file(artifacts / "checkpoint" / "model.safetensors")
    hf = artifacts / "peers" / "hf"
    if formats.stamp(hf) != stamp:
        from tinyt.hf import to_hf  # (torch: imported only where a conversion runs)
        to_hf(artifacts / "checkpoint", hf)
        (hf / formats.STAMP).write_text(stamp)
    todo = {}  # name -> (its directory, its stamp) where not fresh
    for name in names:
        out = artifacts / ENGINES[name].artifact
        made = stamp + formats.recipe(ENGINES[name].convert)
        if formats.stamp(out) != made:
            shutil.rmtree(out, ignore_errors=True)
            todo[name] = out, made
    built = [n for n in todo if ENGINES[n].convert is _GENAI_BUILDER]  # one process for them
    errors = dict(zip(built, formats.genai_builds(hf, [(todo[n][0], ENGINES[n].option)
                                                       for n in built]))) if built else {}
    for name, (out, made) in todo.items():
        error = errors.get(name)
        if name not in errors:
            try:
                ENGINES[name].convert(hf, out, ENGINES[name].option)
            except Exception as e:  # a peer's converter failing is that peer's result
                error = f"{type(e).__name__}: {e}"
        if error is not None:
            skipped[name] = f"conversion failed: {error}".splitlines()[0][:300]
            continue
        (out / formats.STAMP).write_text(made)


def make_on_demand(artifacts: Path, engines: list[str], skipped: dict[str, str]) -> None:
    """tinyt's variants that only the peer benchmark uses (onnx-int4 and its shared-cache
    pair), made from their sources for the engines asked for, and kept while fresh."""
    on = {n: variant(ENGINES[n].artifact) for n in engines if ENGINES[n].ours}
    wanted = {n: v for n, v in on.items() if v.made_by == "peers"}
    todo: set[str] = set()

    def need(d: str) -> None:  # a row and the on-demand rows it is made from
        if d in BY_DIR and BY_DIR[d].made_by == "peers" and d not in todo:
            todo.add(d)
            for src in BY_DIR[d].inputs:
                need(src)
    for v in wanted.values():
        need(v.dir)
    if not todo:
        return
    from tinyt.manifest import fresh, same_prefill

    blocked: dict[str, str] = {}  # dir -> why it could not be made
    for v in VARIANTS:  # in making order: a source before what is made from it
        if v.dir not in todo:
            continue
        source, out, options = arguments(v, artifacts)
        if v.prefill_from is not None and v.prefill_from not in blocked and (
                artifacts / REJECTED / v.prefill_from / "manifest.json").is_file() and not (
                artifacts / v.prefill_from / "manifest.json").is_file():
            options.pop("prefill_from")  # set aside by the pipeline (its accuracy budget): the
            inputs = (v.source,)  # pair runs prompts on its step graph
        else:
            inputs = v.inputs
        if fresh(out, source) and same_prefill(out, options.get("prefill_from")):
            continue
        why = next((blocked[d] for d in inputs if d in blocked), None) or next(
            (f"{artifacts / d} is missing" for d in inputs
             if not (artifacts / d / "manifest.json").is_file()), None)
        if why:
            blocked[v.dir] = why
            continue
        _stage(v.stage)(source, out, **options)
    for name, v in wanted.items():
        if v.dir in blocked:
            skipped[name] = blocked[v.dir]


def _stage(name: str):
    """The tinyt.export stage called `name` (the ONNX-only ones: no torch)."""
    from tinyt.export.optimize import optimize
    from tinyt.export.quantize import quantize

    stages = {"optimize": optimize, "quantize": quantize}
    if name not in stages:
        raise BenchError(f"the peer benchmark makes no {name!r} variant (only {', '.join(stages)})")
    return stages[name]
