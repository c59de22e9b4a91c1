"""The main job on a sentence-encoder checkpoint (`tinyt pipeline --skip-train ENCODER_CKPT`;
app/pipeline.py hands it here by the checkpoint's task):

    CKPT ──export──▶ OUT/onnx ──optimize──▶ OUT/onnx-opt ──quantize ENCODER_INT8──▶ OUT/onnx-int8
    verify (onnx, onnx-opt) vs PyTorch ─▶ OUT/*-verify.json
    onnx-int8's report: cosine and recall@10 against onnx-opt on the docstring set
    bench: texts/s and one text's latency of each row (benchmarks/encoder_quick.py) ─▶ OUT/bench/
    report ─▶ OUT/report.md

The rows are tinyt.artifacts.ENCODER_VARIANTS (rows_for); a stage is skipped when its output's
manifest records exactly the input it would read now, as for the decoder. onnx-int8 is
ENCODER_INT8: the tables at 8 bits, the layers' matmuls fp32, the recipe that holds recall@10
on the real all-MiniLM-L6-v2 (docs/quantization.md). No static INT8: it keeps recall@10 at
0.79 of fp32's there (STATIC_NOTE), so it is not built; `tinyt quantize --mode static` still
makes it by hand.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tinyt.app.stage_rows import run_rows
from tinyt.artifacts import ENCODER_INT8, rows_for
from tinyt.config import ModelConfig
from tinyt.contract import ENCODER
from tinyt.errors import CheckpointError, DataError
from tinyt.fsutil import write_text
from tinyt.manifest import manifest_of

TASK_KINDS = {"encoder": ENCODER}  # a checkpoint's task -> the graph kind its rows make
INT8_RECIPE = ("the word, position and token-type tables at 8 bits, the layers' matmuls fp32 "
               "(8-bit weights there moved query-passage scores by 2-4e-3 on the real "
               "all-MiniLM-L6-v2, and its 10th and 11th passages sit 6.7e-3 apart: recall@10 "
               "0.988; docs/quantization.md)")
STATIC_NOTE = ("static INT8 (QDQ, activations and tables per tensor) is not built for encoders: "
               "on the real all-MiniLM-L6-v2 it kept cosine 0.93 mean / 0.86 min and recall@10 "
               "0.79 of fp32's on the docstring set (minmax, entropy and percentile "
               "calibration alike; onnx-int8: 0.99998 / 0.99994, 0.996); make it by hand with "
               "`tinyt quantize OUT/onnx OUT/onnx-int8-static --mode static` (docs/encoders.md)")


def encoder_pipeline(out: Path, ckpt: Path, cfg: ModelConfig, *, data: str | None = None,
                     bench: bool = True, log: Callable[[str], None] = print) -> Path:
    """Run (or bring up to date) an encoder's stages into `out`; returns the report's path."""
    if data is not None:
        raise DataError(f"--data {data}: {ckpt} is a sentence encoder, whose INT8 report reads "
                        "queries and passages drawn from the standard library's docstrings "
                        "(tinyt.export.retrieval_set); leave --data out")
    if cfg.task not in TASK_KINDS:
        raise CheckpointError(f"{ckpt} is a {cfg.task} checkpoint: the pipeline takes a language "
                              "model, a sentence encoder or an encoder-decoder; run export, "
                              "optimize and quantize on it one by one (docs/encoders.md)")
    rows = rows_for(TASK_KINDS[cfg.task])
    timings: dict[str, Any] = {"train": "skipped (--skip-train)"}
    checks = run_rows(rows, out, ckpt, timings, log)
    timed = None
    if bench:
        from tinyt.benchmarks.encoder_quick import run

        log("[bench] encoder: texts/s at a batch, one text's latency (tinyt.runtime)")
        timed = run(out, [v.dir for v in rows if v.timed], out / "bench")
    else:
        log("[bench] skipped (--no-bench)")
    return write_report(out, ckpt, rows, checks, timed, timings)


def flags(options) -> str:
    """Stage keywords as `tinyt quantize` flags (a tuple: the flag once per value)."""
    return " ".join(f"--{k.replace('_', '-')} {x}" for k, v in options.items()
                    for x in (v if isinstance(v, tuple) else (v,)))


def write_report(out: Path, ckpt: Path, rows, checks: dict, timed: dict | None,
                 timings: dict) -> Path:
    """OUT/report.md: a line per row (bytes, the INT8 report's cosine and recall@10, speed,
    equivalence), the INT8 recipe and targets, why static INT8 is not built."""
    speed = {r["variant"]: r for r in (timed or {}).get("rows", [])}
    lines = ["# tinyt pipeline report (sentence encoder)", "", f"Checkpoint: {ckpt}", "",
             "| variant | bytes | cosine to fp32 (mean / min) | recall@10 vs fp32 | texts/s | "
             "1 text ms | equivalence |", "|---|---|---|---|---|---|---|"]
    targets = None
    for v in rows:
        manifest = manifest_of(out / v.dir) or {}
        size = (out / v.dir / "model.onnx").stat().st_size
        a = manifest.get("accuracy") or {}
        cosine = f"{a['cosine_mean']:.5f} / {a['cosine_min']:.5f}" if a else "—"
        recall = f"{a['recall_at_10']:.3f}" if "recall_at_10" in a else "—"
        s = speed.get(v.dir)
        rate, one = (f"{s['texts_per_s']:.1f}", f"{s['one_text_ms']:.2f}") if s else ("—", "—")
        equal = {True: "verified vs PyTorch", False: "FAILED"}.get(checks.get(v.dir),
                                                                    f"report vs {v.source}")
        lines.append(f"| {v.dir} | {size:,} | {cosine} | {recall} | {rate} | {one} | {equal} |")
        if "targets" in a:
            targets = a
    lines += [""]
    if targets:
        lines += [f"INT8 recipe (`tinyt quantize {flags(ENCODER_INT8)}`): {INT8_RECIPE}. "
                  "Measured on "
                  f"{targets['texts']} texts ({targets['data']}, digest {targets['set_digest']}): "
                  "targets " + ", ".join(f"{k} >= {t}" for k, t in targets["targets"].items())
                  + f" {'met' if targets['meets_targets'] else 'NOT met'}; fp32 finds a "
                  f"query's own passage in its top 10 for {targets['hit_rate_at_10_reference']:.0%}"
                  f" of queries, INT8 for {targets['hit_rate_at_10']:.0%}.", ""]
    if timed:
        lines += [f"Speed: {timed['batch']} texts of {timed['tokens']} tokens in one batch, one "
                  f"text of {timed['latency_tokens']} tokens; medians of {timed['rounds']} "
                  "interleaved rounds, the runtime's default threads (bench/encoder.json; "
                  "against the peers: benchmarks/peers/encoders.py).", ""]
    else:
        lines += ["Speed: not measured (--no-bench).", ""]
    lines += [f"Not built: {STATIC_NOTE}.", "",
              "Stage times (s): " + ", ".join(f"{k} {v}" for k, v in timings.items()), ""]
    path = out / "report.md"
    write_text(path, "\n".join(lines))
    return path
