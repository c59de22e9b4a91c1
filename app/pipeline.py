"""The main job: every stage, one output directory, re-runs skip what has not changed.

    OUT/checkpoint ──export──▶ OUT/onnx ──optimize──▶ OUT/onnx-opt ──quantize──▶ OUT/onnx-int8
         (train)                                                                  │
      OUT/onnx-opt ──quantize --kernel qgemm──▶ OUT/onnx-int8-qgemm ─┐ (prompts)
      OUT/onnx-int8 ──optimize --target gqa --prefill-from ─────────┴─▶ OUT/onnx-int8-gqa
                 (the shared-KV-cache pair: the fastest to generate with)
      OUT/onnx-opt ──quantize --kernel qgemm-rows──▶ OUT/onnx-int8-rows ──optimize --target
                 gqa──▶ OUT/onnx-int8-rows-gqa (one graph, every row as if alone: the one
                 `tinyt serve` batches prompts and steps with)
    verify (onnx, onnx-opt) ─▶ OUT/*-verify.json      bench --quick ─▶ OUT/bench/
    report ─▶ OUT/report.md (summary table per variant, plots)

The stages are tinyt.artifacts' rows made by the pipeline, in that catalogue's order. A row
marked gated is held to INT8_PERPLEXITY_BUDGET by its own accuracy report: beyond it, it is made
again with its fallback options (onnx-int8: fp32 products) or set aside under OUT/rejected (the
per-tensor int8-GEMM graph; the pair then runs prompts on its step graph). Static INT8 is not
built (its catalogue row says why; the report repeats it). A stage
is skipped when its output's manifest records exactly the input it would read now
(sha256 of the checkpoint's files, or the input artifact's manifest) and the same tinyt code
(manifest "toolkit"); training resumes an
interrupted run and is skipped when finished.
"""
from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from tinyt.artifacts import INT8_PERPLEXITY_BUDGET, REJECTED, Variant, arguments, made_by
from tinyt.contract import DECODER_WITH_PAST, SHARED_CACHE_KIND
from tinyt.errors import ConfigError
from tinyt.fsutil import write_text
from tinyt.manifest import fresh, manifest_of, same_prefill


@dataclass
class Record:
    """What a run did, for its report: each stage's seconds (or why it was skipped), and the
    rows not kept and the rows made with their fallback options, each with why."""
    log: Callable[[str], None]
    timings: dict[str, Any] = field(default_factory=dict)
    # row -> why the pipeline did not keep it; row -> why it was made with its fallback options
    dropped: dict[str, str] = field(default_factory=dict)
    fell_back: dict[str, str] = field(default_factory=dict)

    def stage(self, name: str, target: Path, src: Path | None, run: Callable[[], Any],
              prefill: Path | None = None) -> None:
        """Run one stage into `target`, unless its manifest records `src` (and the prompt
        graph `prefill`) as they are now; src None: run it whatever is there."""
        if src is not None and fresh(target, src) and same_prefill(target, prefill):
            self.log(f"[{name}] up to date: {target}")
            self.timings[name] = "skipped"
            return
        self.log(f"[{name}] running -> {target}")
        t = time.perf_counter()
        run()
        self.timings[name] = round(time.perf_counter() - t, 1)
        self.log(f"[{name}] done in {self.timings[name]} s")


TASKS = ("causal_lm", "seq2seq")  # what the pipeline trains (--task); a checkpoint given with
# --skip-train may also be a sentence encoder (app/encoder_pipeline.py)
DEFAULT_PRESETS = {"causal_lm": "demo", "seq2seq": "seq2seq-demo"}


def pipeline(out: str | Path, *, preset: str | None = None, task: str | None = None,
             data: str | None = None, skip_train: str | Path | None = None, bench: bool = True,
             log: Callable[[str], None] = print) -> Path:
    """Run (or bring up to date) every stage into `out`; returns the report's path. task:
    what to train (TASKS; default the preset's, causal_lm for none); preset: default
    DEFAULT_PRESETS[task]."""
    from tinyt.checkpoint import read_config
    from tinyt.export import export_onnx, verify
    from tinyt.export.optimize import optimize
    from tinyt.export.quantize import quantize

    out = Path(out)
    record = Record(log)
    ckpt = Path(skip_train) if skip_train else out / "checkpoint"
    if skip_train:
        if preset is not None:
            raise ConfigError(f"--preset {preset} picks what to train; --skip-train uses "
                              f"{skip_train} as it is: drop --preset")
        ckpt = _imported(ckpt, out, record)  # a Hugging Face directory: imported first
        cfg, _ = read_config(ckpt)  # a clear error now if it is not a checkpoint
        if task is not None and task != cfg.task:
            raise ConfigError(f"--task {task}, but {ckpt} is a {cfg.task} checkpoint: drop "
                              "--task (the checkpoint's task decides)")
        record.timings["train"] = "skipped (--skip-train)"
        if cfg.task == "seq2seq":  # three graphs a row (app/seq2seq_pipeline.py)
            from tinyt.app.seq2seq_pipeline import seq2seq_pipeline
            return seq2seq_pipeline(out, ckpt, cfg, data=data, bench=bench, log=log,
                                    timings=record.timings)
        if cfg.task != "causal_lm":  # an encoder's rows and report (app/encoder_pipeline.py)
            from tinyt.app.encoder_pipeline import encoder_pipeline
            return encoder_pipeline(out, ckpt, cfg, data=data, bench=bench, log=log)
    else:
        task = _task_of(preset, task)
        _train(ckpt, preset or DEFAULT_PRESETS[task], task, data, record)
        if task == "seq2seq":
            from tinyt.app.seq2seq_pipeline import seq2seq_pipeline
            cfg, _ = read_config(ckpt)
            return seq2seq_pipeline(out, ckpt, cfg, data=data, bench=bench, log=log,
                                    timings=record.timings)
    stages = {"export": export_onnx, "optimize": optimize, "quantize": quantize}
    for v in made_by("pipeline"):  # the catalogue's rows, in making order
        _make_row(v, stages[v.stage], out, ckpt, data, record)
    checks = {}
    for name in (v.dir for v in made_by("pipeline") if v.verify):
        report = verify(ckpt, out / name, report_path=out / f"{name}-verify.json")
        checks[name] = report["passed"]
        log(f"[verify] {name}: {'passed' if report['passed'] else 'FAILED'}")
    result, peers = _bench(out, ckpt, log) if bench else (None, None)
    notes = [f"{d}: made with {dict(v.fallback or {})} — with its first options it was {why}"
             for v in made_by("pipeline") for d, why in record.fell_back.items() if v.dir == d]
    return write_report(out, ckpt, checks, result, record.timings, peers, record.dropped, notes)


def _imported(given: Path, out: Path, record: Record) -> Path:
    """The checkpoint --skip-train names, or, where it names a Hugging Face model directory
    (config.json with a model_type), that model imported to OUT/checkpoint by import-hf
    (again only where the directory or a file in it changed since)."""
    try:
        said = json.loads((given / "config.json").read_text())
    except (OSError, ValueError):
        return given  # read_config names what is wrong
    if not isinstance(said, dict) or said.get("format") is not None or "model_type" not in said:
        return given
    from tinyt.hf import import_hf

    ckpt = out / "checkpoint"
    made = ckpt / "config.json"
    source = str(given.resolve())
    metrics: dict = {}
    try:
        metrics = json.loads(made.read_text()).get("metrics") or {}
        newest = max(f.stat().st_mtime for f in given.iterdir() if f.is_file())
        if metrics.get("source_dir") == source and newest <= made.stat().st_mtime:
            record.log(f"[import] up to date: {ckpt}")
            record.timings["import"] = "skipped"
            return ckpt
    except (OSError, ValueError, AttributeError):
        pass  # none made yet, or unreadable: import again
    if ckpt.exists():
        if metrics.get("imported_from") != "huggingface":
            raise ConfigError(f"--skip-train {given} is a Hugging Face directory, imported to "
                              f"{ckpt}, but {ckpt} holds something else (a trained "
                              "checkpoint?): choose another --out, or move it")
        shutil.rmtree(ckpt)  # imported from an older directory
    record.log(f"[import] {given} -> {ckpt}")
    t = time.perf_counter()
    import_hf(given, ckpt)
    record.timings["import"] = round(time.perf_counter() - t, 1)
    return ckpt


def _task_of(preset: str | None, task: str | None) -> str:
    """What the pipeline trains: `task` (TASKS), else the preset's, else a causal LM."""
    from tinyt.config import PRESETS

    if task is not None and task not in TASKS:
        raise ConfigError(f"--task {task!r}: the pipeline trains one of {', '.join(TASKS)} "
                          "(a classifier: tinyt train --task classifier, then each stage)")
    said = PRESETS.get(preset or "", {}).get("model", {}).get("task", "causal_lm")
    return task or (said if said in TASKS else "causal_lm")


def _train(ckpt: Path, preset: str, task: str, data: str | None, record: Record) -> None:
    """Train `preset` (as a `task` model) into `ckpt`: an interrupted run resumed, a finished
    one skipped."""
    from tinyt.checkpoint import has_train_state
    from tinyt.config import preset as get_preset
    from tinyt.train import train

    model_cfg, train_cfg = get_preset(preset, task=task)
    done = (ckpt / "config.json").is_file() and json.loads(
        (ckpt / "config.json").read_text()).get("metrics", {}).get("step") == \
        train_cfg.max_steps
    if done:
        record.log(f"[train] finished run in {ckpt}")
        record.timings["train"] = "skipped"
        return
    resume = has_train_state(ckpt)
    record.log(f"[train] {'resuming' if resume else 'running'} -> {ckpt}")
    t = time.perf_counter()
    train(model_cfg, train_cfg, ckpt, data=data, resume=resume, log=record.log)
    record.timings["train"] = round(time.perf_counter() - t, 1)


def _make_row(v: Variant, make: Callable[..., Any], out: Path, ckpt: Path, data: str | None,
              record: Record) -> None:
    """Make (or bring up to date) the catalogue's row `v` with the stage function `make`. A
    gated row beyond the budget is made again with its fallback options, or set aside under
    OUT/rejected and recorded as not kept."""
    log, dropped, fell_back = record.log, record.dropped, record.fell_back
    source, target, options = arguments(v, out, checkpoint=ckpt, data=data)
    if v.source in dropped:
        dropped[v.dir] = f"made from {v.source}, which was not kept"
        _set_aside(out, v.dir)
        log(f"[{v.step}] not made: {dropped[v.dir]}")
        return
    if v.prefill_from in dropped:  # the pair then runs prompts on its step graph
        options.pop("prefill_from")
        log(f"[{v.step}] without a prompt graph: {v.prefill_from} was not kept")
    rejected = out / REJECTED / v.dir  # a gated row's first options, beyond the budget
    first = partial(make, source, target, **options)
    if v.gated and fresh(rejected, source):
        why = beyond_budget(rejected)
        if why and v.fallback is None:
            dropped[v.dir] = why
            log(f"[{v.step}] up to date, not kept: {why}")
            record.timings[v.step] = "skipped"
            return
        if why:  # the fallback is what is kept: made now unless it is there, up to date
            fell_back[v.dir] = why
            if target.exists() and not _made_with(target, v.fallback):
                shutil.rmtree(target)
            record.stage(v.step, target, source, partial(
                _made_or_copied, make, source, target, {**options, **v.fallback},
                out, v.dir, log))
            return
        if target.exists():  # within the budget now (another budget): back in its place
            shutil.rmtree(target)
        rejected.rename(target)
    record.stage(v.step, target, source, first, prefill=options.get("prefill_from"))
    why = beyond_budget(target) if v.gated else None
    if why:
        _set_aside(out, v.dir)  # kept under OUT/rejected: its report says why, next time too
        if v.fallback is None:
            dropped[v.dir] = why
            log(f"[{v.step}] not kept: {why} (set aside in {rejected})")
            return
        log(f"[{v.step}] beyond the budget: {why}; made again with {dict(v.fallback)}")
        fell_back[v.dir] = why
        record.stage(v.step, target, None, partial(
            _made_or_copied, make, source, target, {**options, **v.fallback},
            out, v.dir, log))


def _bench(out: Path, ckpt: Path, log: Callable[[str], None]) -> tuple[dict, dict]:
    """The quick benchmark of every row, and tinyt against the peers on the same weights."""
    from tinyt.benchmarks.harness import run
    from tinyt.benchmarks.peers import PIPELINE_ENGINES
    from tinyt.benchmarks.peers import run as run_peers

    result = run(_bench_view(out, ckpt), out / "bench", mode="quick")
    log("[bench] peers: tinyt against CTranslate2, ONNX Runtime GenAI, PyTorch")
    peers = run_peers(out, out / "peers", rounds=3, engines=list(PIPELINE_ENGINES))
    return result, peers


def _made_or_copied(run: Callable[..., Any], source: Path, target: Path, options: dict,
                    out: Path, name: str, log: Callable[[str], None]) -> None:
    """Make `target` from `source` with `options`, or copy a row of this run made from the
    same source with the same options (onnx-int8-rows' fallback is onnx-int8's: MatMulNBits
    weights with fp32 products; on real SmolLM2 a quantize stage is minutes)."""
    for v in made_by("pipeline"):
        twin = out / v.dir
        if v.dir != name and fresh(twin, source) and _made_with(twin, options):
            shutil.copytree(twin, target)
            log(f"[{name}] the same stage as {v.dir}: copied")
            return
    run(source, target, **options)


def _made_with(target: Path, options) -> bool:
    """Whether the artifact at `target` was made with these options (its manifest's)."""
    made = (manifest_of(target) or {}).get("options", {})
    return bool(made) and all(made.get(k) == v for k, v in options.items())


def perplexity_change(report: dict) -> float:
    """exp(loss change) - 1 of a causal-LM accuracy report (older reports lack the key)."""
    if "perplexity_change" in report:
        return report["perplexity_change"]
    return math.expm1(report["val_loss"] - report["val_loss_reference"])


def beyond_budget(path: Path) -> str | None:
    """Why the artifact at `path` is beyond INT8_PERPLEXITY_BUDGET (its accuracy report's
    perplexity change), or None when within it."""
    report = (manifest_of(path) or {}).get("accuracy") or {}
    if "val_loss" not in report:
        return "its manifest has no accuracy report to hold to the budget"
    change = perplexity_change(report)
    if change <= INT8_PERPLEXITY_BUDGET:
        return None
    return (f"perplexity {100 * change:+.2f}% over its source on held-out text, beyond the "
            f"+{100 * INT8_PERPLEXITY_BUDGET:.1f}% an INT8 artifact may cost (greedy agreement "
            f"{100 * report.get('greedy_agreement', float('nan')):.1f}%, KL "
            f"{report.get('kl_divergence', float('nan')):.2g})")


def _set_aside(out: Path, name: str) -> None:
    """Move OUT/name (a row not kept) under OUT/rejected, replacing an older one."""
    target, aside = out / name, out / REJECTED / name
    if aside.exists() and target.exists():
        shutil.rmtree(aside)
    if target.exists():
        aside.parent.mkdir(exist_ok=True)
        target.rename(aside)


def _bench_view(out: Path, ckpt: Path) -> Path:
    """The harness reads ARTIFACTS/checkpoint; with --skip-train the checkpoint lives
    elsewhere, so link it in."""
    link = out / "checkpoint"
    if not link.exists():
        link.symlink_to(ckpt.resolve(), target_is_directory=True)
    return out


def write_report(out: Path, ckpt: Path, checks: dict, bench: dict | None,
                 timings: dict, peers: dict | None = None,
                 dropped: dict[str, str] | None = None, notes: list[str] | None = None) -> Path:
    from tinyt.app.footprint import edge_footprint, summary

    meta = json.loads((ckpt / "config.json").read_text())
    rows = ["| variant | bytes | perplexity change | decode tokens/s | prefill ms | "
            "equivalence |",
            "|---|---|---|---|---|---|"]
    for v in made_by("pipeline"):
        if v.bench is None:  # not reported (onnx-int8-rows: only the source of its pair)
            continue
        sub, name = v.dir, v.bench
        if dropped and sub in dropped:
            rows.append(f"| {sub} | — | — | — | — | not kept: {dropped[sub]} |")
            continue
        manifest = manifest_of(out / sub) or {}
        size = sum((out / sub / f).stat().st_size for f in ("model.onnx", "prefill.onnx")
                   if (out / sub / f).is_file())  # a shared-cache pair holds two graphs
        report = manifest.get("accuracy", {})
        change = perplexity_change(report) if "val_loss" in report else 0.0
        decode = prefill = "—"
        if bench:
            for r in bench["rows"]:
                if r["variant"].split("@")[0] == name and r["kind"] == "decode":
                    decode = f"{r['tokens_per_s']:,.0f}"
                if r["variant"].split("@")[0] == name and r["kind"] == "prefill":
                    prefill = f"{r['p50_ms']:.2f}"
        equal = {True: "verified vs PyTorch", False: "FAILED"}.get(
            checks.get(sub), f"checked vs {v.source}" if v.kind == SHARED_CACHE_KIND
            else "accuracy report")
        rows.append(f"| {sub} | {size:,} | {100 * change:+.2f}% | {decode} | {prefill} | "
                    f"{equal} |")
    m = meta.get("metrics") or {}  # a checkpoint saved by hand may have none

    def said(key: str, spec: str, unit: str) -> str:
        value = m.get(key)
        return f"{value:{spec}} {unit}" if isinstance(value, (int, float)) else f"? {unit}"
    lines = ["# tinyt pipeline report", "",
             f"Checkpoint: {ckpt} — {said('parameters', ',', 'parameters')}, validation "
             f"{said('val_loss', '.3f', 'nats/token')}, "
             f"{said('val_nats_per_byte', '.3f', 'nats/byte')}, "
             f"{said('tokens_per_s', ',.0f', 'tokens/s')} in training.", "", *rows, "",
             *(f"- {n}" for n in notes or ()),
             *(f"- {v.dir}: {v.note}" for v in made_by("hand") if v.kind == DECODER_WITH_PAST),
             "",
             "Stage times (s): " + ", ".join(f"{k} {v}" for k, v in timings.items()), "",
             summary(edge_footprint()) + " (tinyt.app.footprint; a wheel-install test checks it)",
             ""]
    if peers:
        lines += ["Targets, tinyt against the fastest peer on the same weights (ratio of times, "
                  "< 1: tinyt faster; peers/peers.md has every engine): " + ", ".join(
                      f"{k} {t['ratio']:.2f} vs {t['fastest_peer']} (goal ≤ {t['target_max']}, "
                      f"{'met' if t['met'] else 'not met'})"
                      for k, t in peers["targets"].items() if "ratio" in t), "",
                  "Loop cost outside ONNX Runtime's run, µs per token: " + ", ".join(
                      f"{k.split(' ', 1)[1]} {t['measured']:.1f}"
                      for k, t in peers["targets"].items() if "measured" in t), "",
                  "![peers](peers/peers.png)", ""]
    if bench:
        lines += ["![decode](bench/decode_tokens_per_s.png)", "",
            "![prefill](bench/latency_vs_prompt.png)", "", "![size](bench/size_vs_loss.png)", ""]
    path = out / "report.md"
    write_text(path, "\n".join(lines))
    return path
