"""The main job on an encoder-decoder checkpoint (`tinyt pipeline --task seq2seq`, which trains
one on the built-in code-summarization task first, or `--skip-train SEQ2SEQ_CKPT`;
app/pipeline.py hands it here by the checkpoint's task):

    CKPT ──export──▶ OUT/onnx ──optimize──▶ OUT/onnx-opt ──quantize──▶ OUT/onnx-int8
                                                        ──quantize --bits 4──▶ OUT/onnx-int4
    verify (onnx, onnx-opt): the three graphs vs PyTorch, greedy tokens ─▶ OUT/*-verify.json
    each quantization's report: chrF / BLEU of its greedy outputs against fp32's on held-out
    pairs, token agreement (export/seq2seq_accuracy.py); a Whisper's: token agreement, WER
    and CER of its transcripts against fp32's on speech (export/speech_accuracy.py)
    report ─▶ OUT/report.md

The rows are tinyt.artifacts.SEQ2SEQ_VARIANTS (rows_for); a stage is skipped when its
output's manifest records exactly the input it would read now, as for the decoder. No bench:
the quick benchmark times decoder-only graphs, and the encoder-decoder's peers (CTranslate2,
Optimum) are the seq2seq peer benchmark's; the report says so.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tinyt.app.stage_rows import run_rows
from tinyt.artifacts import SEQ2SEQ_VARIANTS, rows_for
from tinyt.config import ModelConfig
from tinyt.contract import SEQ2SEQ, SEQ2SEQ_FILES
from tinyt.fsutil import write_text
from tinyt.manifest import manifest_of

BENCH_NOTE = ("not measured: `tinyt bench` times decoder-only graphs; an encoder-decoder's "
              "speed against its peers (CTranslate2, Optimum's ORTModelForSeq2SeqLM) is the "
              "seq2seq peer benchmark's")


def seq2seq_pipeline(out: Path, ckpt: Path, cfg: ModelConfig, *, data: str | None = None,
                     bench: bool = True, log: Callable[[str], None] = print,
                     timings: dict[str, Any] | None = None) -> Path:
    """Run (or bring up to date) an encoder-decoder's stages into `out`; returns the report's
    path. timings: what ran before (training's seconds, or why it was skipped)."""
    rows = rows_for(SEQ2SEQ)
    timings = dict(timings or {})
    checks = run_rows(rows, out, ckpt, timings, log, data=data)
    log(f"[bench] skipped for an encoder-decoder: {BENCH_NOTE}" if bench
        else "[bench] skipped (--no-bench)")
    return write_report(out, ckpt, rows, checks, timings)


def _bytes(directory: Path) -> int:
    return sum((directory / f).stat().st_size for f in SEQ2SEQ_FILES.values()
               if (directory / f).is_file())


def write_report(out: Path, ckpt: Path, rows, checks: dict, timings: dict) -> Path:
    """OUT/report.md: a line per row (bytes of its three graphs, the quantizations' chrF /
    BLEU against fp32, token agreement, chrF against the references, perplexity change; a
    Whisper's: token agreement, WER and CER against fp32's transcripts), the rows made by
    hand, the stage times."""
    metrics = _checkpoint_metrics(ckpt)
    head = [f"Checkpoint: {ckpt}" + (f" — {metrics}" if metrics else "") + ".", ""]
    speech = any(((manifest_of(out / v.dir) or {}).get("accuracy") or {}).get("clips")
                 for v in rows)  # a speech model's reports
    if speech:
        lines = ["# tinyt pipeline report (speech: Whisper)", "", *head,
                 *speech_rows(out, rows, checks)]
    else:
        lines = ["# tinyt pipeline report (encoder-decoder)", "", *head,
                 *_text_rows(out, rows, checks)]
    lines += [f"- {v.dir}: {v.note}" for v in SEQ2SEQ_VARIANTS if v.made_by == "hand"
              and not (speech and v.options.get("mode") == "static")]  # text pairs calibrate it
    lines += ["", f"Speed: {BENCH_NOTE}.", "",
              "Stage times (s): " + ", ".join(f"{k} {t}" for k, t in timings.items()), ""]
    path = out / "report.md"
    write_text(path, "\n".join(lines))
    return path


def _equivalence(v, checks: dict) -> str:
    return {True: "verified vs PyTorch", False: "FAILED"}.get(checks.get(v.dir),
                                                               f"report vs {v.source}")


def speech_rows(out: Path, rows, checks: dict) -> list[str]:
    """A Whisper's table: each quantization's transcripts against fp32's (export/
    speech_accuracy.py)."""
    lines = ["| variant | bytes | token agreement | WER vs fp32 | CER vs fp32 | language "
             "agreement | top-1 agreement | perplexity change | equivalence |",
             "|---|---|---|---|---|---|---|---|---|"]
    measured = None
    for v in rows:
        a = (manifest_of(out / v.dir) or {}).get("accuracy") or {}
        if a:
            measured = a
            lines.append(
                f"| {v.dir} | {_bytes(out / v.dir):,} | {100 * a['token_agreement']:.1f}% | "
                f"{100 * a['wer_vs_fp32']:.1f}% | {100 * a['cer_vs_fp32']:.1f}% | "
                f"{100 * a['language_agreement']:.0f}% | {100 * a['top1_agreement']:.1f}% | "
                f"{100 * a['perplexity_change']:+.2f}% | {_equivalence(v, checks)} |")
        else:
            lines.append(f"| {v.dir} | {_bytes(out / v.dir):,} | — | — | — | — | — | — | "
                         f"{_equivalence(v, checks)} |")
    lines.append("")
    if measured:
        lines += [f"Quantizations measured on {measured['clips']} clips ({measured['data']}): "
                  f"greedy, the language detected, up to {measured['max_new_tokens']} tokens a "
                  "clip, through tinyt.runtime; WER / CER: word / character edit distance of "
                  "the quantized transcript to fp32's (not to what was said); top-1 agreement "
                  "and perplexity change along fp32's transcripts. On a model that has not "
                  "learnt speech (random weights) the transcripts are noise: the figures then "
                  "say how far quantization moves that noise (docs/speech.md).", ""]
    return lines


def _text_rows(out: Path, rows, checks: dict) -> list[str]:
    """The text encoder-decoder's table (chrF / BLEU against fp32 and the references)."""
    lines = ["| variant | bytes | chrF vs fp32 | BLEU vs fp32 | token agreement | chrF vs "
             "references (fp32) | perplexity change | equivalence |",
             "|---|---|---|---|---|---|---|---|"]
    measured = None
    for v in rows:
        a = (manifest_of(out / v.dir) or {}).get("accuracy") or {}
        equal = _equivalence(v, checks)
        if a:
            measured = a
            lines.append(
                f"| {v.dir} | {_bytes(out / v.dir):,} | {a['chrf_vs_fp32']:.1f} | "
                f"{a['bleu_vs_fp32']:.1f} | {100 * a['token_agreement']:.1f}% | "
                f"{a['chrf']:.1f} ({a['chrf_reference']:.1f}) | "
                f"{100 * a['perplexity_change']:+.2f}% | {equal} |")
        else:
            lines.append(f"| {v.dir} | {_bytes(out / v.dir):,} | — | — | — | — | — | {equal} |")
    lines.append("")
    if measured:
        lines += [f"Quantizations measured on {measured['pairs']} held-out pairs of "
                  f"{measured['data']}: greedy, up to {measured['max_new_tokens']} tokens a "
                  "source, through tinyt.runtime; chrF and BLEU by sacrebleu (0-100), token "
                  "agreement position by position with fp32's outputs; perplexity along the "
                  "references' targets.", ""]
    return lines


def _checkpoint_metrics(ckpt: Path) -> str:
    """What the checkpoint's own record says of it: parameters, and its training's last
    evaluation (validation loss, chrF, BLEU) where it was trained by tinyt."""
    import json

    m = (json.loads((ckpt / "config.json").read_text()).get("metrics") or {})
    said = []
    if isinstance(m.get("parameters"), int):
        said.append(f"{m['parameters']:,} parameters")
    for key, name, spec in (("val_loss", "validation loss", ".3f"), ("val_chrf", "chrF", ".1f"),
                            ("val_bleu", "BLEU", ".1f")):
        if isinstance(m.get(key), (int, float)):
            said.append(f"{name} {m[key]:{spec}}")
    if m.get("architecture"):
        said.append(f"imported from {m['architecture']}")
    return ", ".join(said)
