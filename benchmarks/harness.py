"""Latency and throughput of every variant, side by side, in one run.

    artifacts/ (checkpoint/, onnx/, onnx-opt/, onnx-int8/, ...) ──▶ variants (PyTorch + ORT)
      for each shape: build inputs ─▶ warm up each variant ─▶ rounds interleaved across
      variants (a noisy machine slows them alike); in a round each variant runs `settle`
      untimed calls, then `block` timed ones ─▶ p50 / p90 / p99, tokens/s

Why blocks: a call right after another library's call is slower than one in a run of its own
(caches refilled, the other library's worker threads still spinning; benchmarks/
interleave_probe.py measured ONNX Runtime INT8 decode at 0.88 ms on the first call after a
PyTorch step, 0.56 on the second, and as alone (~0.48) from the third on). An application
decodes with one model, so the settled figure is the real one.
    ──▶ results.json (environment + every raw time), results.md, PNG plots, target ratios

    .venv/bin/python -m benchmarks.harness artifacts --out benchmarks/results/cpu --quick
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import onnxruntime as ort

from tinyt.artifacts import CHECKPOINT, CLASSIFIER_CHECKPOINT, VARIANTS
from tinyt.contract import CLASSIFIER
from tinyt.errors import BenchError
from tinyt.hardware import physical_cores
from tinyt.manifest import check_manifest, read_model_config
from tinyt.runtime.timing import measure

from .environment import environment
from .load_cost import measure_in_subprocess
from .plots import write_plots
from .variants import OrtVariant, plain_int8_baseline, torch_classifier, torch_variants

# The catalogue's variants the harness times (tinyt.artifacts), and the names they are
# reported under; the classifier's when ARTIFACTS/clf (a checkpoint) exists
ORT_VARIANTS = {v.dir: str(v.bench) for v in VARIANTS if v.timed and v.kind != CLASSIFIER}
CLF_VARIANTS = {v.dir: str(v.bench) for v in VARIANTS if v.timed and v.kind == CLASSIFIER}
BASELINE = "ort-plain-export+quantize_dynamic"
BASELINE_DIR = "bench-baseline"  # under ARTIFACTS: the baseline graph, reused while current
SUFFIX = {"CPUExecutionProvider": "", "CUDAExecutionProvider": "-cuda",
          "TensorrtExecutionProvider": "-tensorrt"}  # variant name per ORT provider
MODES = {
    # quick: one decode and one prefill shape, all cores, for CI and the main job (< 1 min)
    "quick": dict(batches=[1], pasts="last", prompts="block", threads="all", rounds=6,
                  block=5, settle=3, warmup=3, clf_batches=[8], clf_tokens="block"),
    "full": dict(batches=[1, 8], pasts=[32, 64, "last"], prompts=[1, 32, 128, "block"],
                 threads="both", rounds=20, block=5, settle=3, warmup=5, clf_batches=[1, 8],
                 clf_tokens=[32, "block"]),
}
VERSIONS = ("torch", "onnxruntime", "onnx", "onnxscript", "numpy", "tinyt")
TARGETS = {"decode_int8_vs_torch_kv": 4.0, "decode_int8_vs_plain_int8": 2.0,
           "prefill_best_ort_vs_torch": 2.0, "int8_size_vs_fp32_max": 0.30}


def percentiles(times: list[float]) -> dict[str, float]:
    ms = sorted(1e3 * t for t in times)
    pick = lambda q: ms[min(len(ms) - 1, int(q * len(ms)))]  # noqa: E731
    return {"p50_ms": statistics.median(ms), "p90_ms": pick(0.90), "p99_ms": pick(0.99)}


# The longest sequence the harness times, whatever the context: a model's whole 131,072 tokens
# would make the bench cost what the context does (every preset's block is within it).
BENCH_CONTEXT = 1024


def bench_block(cfg) -> int:
    """The context the harness times at: block_size, up to BENCH_CONTEXT."""
    return min(cfg.block_size, BENCH_CONTEXT)


def resolve_sizes(values, cfg, limit: int | None = None) -> list[int]:
    """Sizes from a mode's spec ('last' = bench_block - 1, 'block' = bench_block), those that
    fit the model kept (at most `limit`, default bench_block)."""
    values = [values] if isinstance(values, str) else values
    block = bench_block(cfg)
    limit = block if limit is None else limit
    out = []
    for v in values:
        v = {"last": block - 1, "block": block}.get(v, v)
        if isinstance(v, int) and 1 <= v <= limit and v not in out:
            out.append(v)
    return out


def check_device(device: str) -> list[str]:
    """The ORT providers to benchmark on `device`; a clear error when the device is absent."""
    if device == "cpu":
        return ["CPUExecutionProvider"]
    if device != "cuda":
        raise BenchError(f"device={device!r} is not one of cpu, cuda")
    import torch

    if not torch.cuda.is_available():
        raise BenchError("device='cuda' needs a GPU that torch can see; this machine has none "
                           f"(torch {torch.__version__}, CUDA build: {torch.version.cuda})")
    # ORT GPU variants only where onnxruntime-gpu offers them (they are skipped, and recorded
    # as skipped, on a machine whose onnxruntime is the CPU build).
    return [p for p in ("CUDAExecutionProvider", "TensorrtExecutionProvider")
            if p in ort.get_available_providers()]


def run(artifacts: Path, out: Path, *, mode: str = "quick", device: str = "cpu",
        rounds: int | None = None) -> dict[str, Any]:
    """Benchmark every variant found under `artifacts`; write results.json and results.md.
    `rounds` overrides the mode's number of interleaved rounds per shape."""
    if mode not in MODES:
        raise BenchError(f"mode={mode!r} is not one of {', '.join(MODES)}")
    if rounds is not None and not (isinstance(rounds, int) and rounds >= 1):
        raise BenchError(f"rounds={rounds!r} must be an integer >= 1")
    providers = check_device(device)
    spec = MODES[mode] if rounds is None else {**MODES[mode], "rounds": rounds}
    cfg, _ = read_model_config(artifacts / "onnx")
    all_cores = physical_cores()
    threads = {"all": [all_cores], "both": sorted({1, all_cores})}[spec["threads"]]
    baseline = plain_int8_baseline(artifacts / CHECKPOINT, artifacts / BASELINE_DIR)
    result = _measure_all(artifacts, baseline, cfg, spec, threads, all_cores, mode, device,
                          providers)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "results.md").write_text(markdown(result))
    write_plots(result, out)
    return result


def accuracy_change(artifacts: Path) -> dict[str, float | None]:
    """Validation-loss change vs fp32 of each ORT variant: a quantized artifact's own report;
    0 for the fp32 export and graphs checked equal to it; None where unmeasured."""
    out: dict[str, float | None] = {BASELINE: None}
    for sub, name in ORT_VARIANTS.items():
        path = artifacts / sub / "manifest.json"
        if path.is_file():
            manifest = json.loads(path.read_text())
            out[name] = manifest.get("accuracy", {}).get("val_loss_change", 0.0)
    return out


def _measure_all(artifacts, baseline, cfg, spec, threads, all_cores, mode, device,
                 providers) -> dict[str, Any]:
    variants, skipped = [], []
    for n in threads:
        variants += torch_variants(artifacts / CHECKPOINT, n, device)
        dirs = [(artifacts / sub, name) for sub, name in ORT_VARIANTS.items()
                if (artifacts / sub / "manifest.json").is_file()] + [(baseline, BASELINE)]
        for path, name in dirs:
            if path != baseline:
                check_manifest(path)
            for provider in providers:
                label = f"{name}{SUFFIX[provider]}@{n}t"
                try:
                    variants.append(OrtVariant(label, path, cfg, n, provider=provider).open())
                except Exception as e:  # e.g. contrib ops a provider lacks: record, go on
                    skipped.append({"variant": label, "why": str(e).splitlines()[0][:200]})
    if device != "cpu" and not providers:
        skipped.append({"variant": "ort-*", "why": "this onnxruntime has no GPU provider "
                        f"({ort.get_available_providers()}); install onnxruntime-gpu"})
    shapes = [("decode", b, p) for b in spec["batches"]  # past + the new token fit the model
              for p in resolve_sizes(spec["pasts"], cfg, bench_block(cfg) - 1)]
    shapes += [("prefill", b, t) for b in spec["batches"]
               for t in resolve_sizes(spec["prompts"], cfg)]
    rows = _rows(variants, shapes, spec)
    clf = _classifier_variants(artifacts, threads, device, providers, skipped)
    if clf:
        clf_cfg = clf[0].cfg
        rows += _rows(clf, [("classify", b, t) for b in spec["clf_batches"]
                            for t in resolve_sizes(spec["clf_tokens"], clf_cfg)], spec)
    sizes = {v.name.split("@")[0]: (v.path / "model.onnx").stat().st_size
             for v in variants + clf if isinstance(v, OrtVariant)}
    # Footprint: each variant alone in a fresh process (imports, session, first call, memory).
    footprint = {}
    if device == "cpu":  # the footprint probe runs on CPU
        footprint["torch-fp32"] = measure_in_subprocess("torch", artifacts / CHECKPOINT,
                                                        all_cores)
        for v in variants:
            name = v.name.split("@")[0]
            if isinstance(v, OrtVariant) and name not in footprint:
                footprint[name] = measure_in_subprocess("ort", v.path, all_cores)
    return {"mode": mode, "device": device, "skipped": skipped,
            "environment": environment(VERSIONS, providers=ort.get_available_providers(),
                                       threads=threads, spinning=False),
            "model": cfg.to_dict(),
            "sizes_bytes": sizes, "accuracy_change": accuracy_change(artifacts),
            "footprint": footprint, "rows": rows,
            "targets": targets(rows, sizes, cfg, all_cores)}


def _rows(variants, shapes, spec) -> list[dict[str, Any]]:
    rows = []
    for kind, b, n in shapes:
        closures = {v.name: getattr(v, kind)(b, n) for v in variants}
        for name, times in measure(closures, spec["rounds"], spec["warmup"], spec["block"],
                                   spec["settle"]).items():
            stats = percentiles(times)
            tokens = b if kind == "decode" else b * n
            row = {"variant": name, "kind": kind, "batch": b,
                   ("past" if kind == "decode" else "tokens"): n, **stats,
                   "tokens_per_s": tokens / (stats["p50_ms"] / 1e3), "times_s": times}
            if kind == "classify":
                row["sequences_per_s"] = b / (stats["p50_ms"] / 1e3)
            rows.append(row)
    return rows


def _classifier_variants(artifacts, threads, device, providers, skipped) -> list:
    """PyTorch and ORT classifier variants, when ARTIFACTS/clf holds a classifier checkpoint."""
    if not (artifacts / CLASSIFIER_CHECKPOINT / "config.json").is_file():
        return []
    out = []
    for n in threads:
        torch_clf = torch_classifier(artifacts / CLASSIFIER_CHECKPOINT, n, device)
        out.append(torch_clf)
        for sub, name in CLF_VARIANTS.items():
            if not (artifacts / sub / "manifest.json").is_file():
                continue
            for provider in providers:
                label = f"{name}{SUFFIX[provider]}@{n}t"
                try:
                    out.append(OrtVariant(label, artifacts / sub, torch_clf.cfg, n,
                                          provider=provider).open())
                except Exception as e:
                    skipped.append({"variant": label, "why": str(e).splitlines()[0][:200]})
    return out


def _p50(rows, variant, kind, batch, n) -> float | None:
    key = "past" if kind == "decode" else "tokens"
    hit = [r["p50_ms"] for r in rows if r["variant"] == variant and r["kind"] == kind
           and r["batch"] == batch and r[key] == n]
    return hit[0] if hit else None


def targets(rows, sizes, cfg, cores: int) -> dict[str, Any]:
    """The issue's targets, as ratios measured in this run (None where a variant is absent)."""
    t, past, block = f"@{cores}t", bench_block(cfg) - 1, bench_block(cfg)
    prompt = 128 if 128 <= block else block
    int8 = _p50(rows, f"ort-int8-dynamic{t}", "decode", 1, past)
    torch_kv = _p50(rows, f"torch-fp32-kv{t}", "decode", 1, past)
    plain = _p50(rows, f"{BASELINE}{t}", "decode", 1, past)
    torch_prefill = _p50(rows, f"torch-fp32-kv{t}", "prefill", 1, prompt)
    ort_prefill = [p for p in (_p50(rows, f"{v}{t}", "prefill", 1, prompt)
                               for v in [*ORT_VARIANTS.values()]) if p is not None]
    ratio = lambda a, b: None if a is None or b is None else a / b  # noqa: E731
    found = {
        "decode_int8_vs_torch_kv": ratio(torch_kv, int8),
        "decode_int8_vs_plain_int8": ratio(plain, int8),
        "prefill_best_ort_vs_torch": ratio(torch_prefill, min(ort_prefill, default=None)),
        "int8_size_vs_fp32_max": ratio(sizes.get("ort-int8-dynamic"), sizes.get("ort-fp32")),
    }
    out = {}
    for name, value in found.items():
        goal = TARGETS[name]
        met = None if value is None else (value <= goal if name.endswith("_max") else value >= goal)
        out[name] = {"measured": value, "target": goal, "met": met}
    out["shape"] = {"decode_past": past, "prefill_tokens": prompt, "batch": 1, "threads": cores}
    return out


def markdown(result: dict[str, Any]) -> str:
    env = result["environment"]
    lines = [f"# tinyt benchmark ({result['mode']})", "",
             f"{env['cpu']['model'] or env['cpu']['machine']}, {env['physical_cores']} physical "
             f"cores; torch {env['versions']['torch']}, "
             f"onnxruntime {env['versions']['onnxruntime']}"
             f"; spinning off; {env['time']}", "",
             "| variant | shape | p50 ms | p90 ms | p99 ms | tokens/s |",
             "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if r["kind"] == "classify":
            continue
        shape = (f"decode b{r['batch']} past {r['past']}" if r["kind"] == "decode"
                 else f"prefill b{r['batch']} × {r['tokens']}")
        lines.append(f"| {r['variant']} | {shape} | {r['p50_ms']:.3f} | {r['p90_ms']:.3f} | "
                     f"{r['p99_ms']:.3f} | {r['tokens_per_s']:,.0f} |")
    clf = [r for r in result["rows"] if r["kind"] == "classify"]
    if clf:
        lines += ["", "Classifier (one pass over a batch of full-length sequences):", "",
                  "| variant | shape | p50 ms | p90 ms | p99 ms | sequences/s |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {r['variant']} | classify b{r['batch']} × {r['tokens']} | "
                  f"{r['p50_ms']:.3f} | {r['p90_ms']:.3f} | {r['p99_ms']:.3f} | "
                  f"{r['sequences_per_s']:,.0f} |" for r in clf]
    lines += ["", "| target | measured | goal | met |", "|---|---|---|---|"]
    for name, t in result["targets"].items():
        if name == "shape":
            continue
        measured = "—" if t["measured"] is None else f"{t['measured']:.2f}"
        lines.append(f"| {name} | {measured} | {'≤' if name.endswith('_max') else '≥'} "
                     f"{t['target']} | {t['met']} |")
    lines += ["", "Each variant alone in a fresh process (imports included; first call = "
              "prefill of 32 tokens):", "",
              "| variant | file bytes | load s | first call ms | steady call ms | peak RSS MiB |",
              "|---|---|---|---|---|---|"]
    for name, f in result["footprint"].items():
        size = result["sizes_bytes"].get(name)
        if "error" in f:
            lines.append(f"| {name} | {size or '—'} | failed: {f['error']} | | | |")
            continue
        lines.append(f"| {name} | {'—' if size is None else f'{size:,}'} | {f['load_s']:.2f} | "
                     f"{f['first_call_ms']:.1f} | {f['steady_call_ms']:.2f} | "
                     f"{f['peak_rss_bytes'] / 2**20:.0f} |")
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifacts", type=Path)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/cpu"))
    ap.add_argument("--mode", choices=list(MODES), default="quick")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--rounds", type=int, default=None, help="override the mode's rounds")
    args = ap.parse_args()
    try:
        result = run(args.artifacts, args.out, mode=args.mode, device=args.device,
                     rounds=args.rounds)
    except (ValueError, RuntimeError) as e:  # missing GPU, bad artifacts: one line, status 2
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    for name, t in result["targets"].items():
        if name != "shape":
            print(f"{name:32s} measured {t['measured']}  target {t['target']}  met {t['met']}")
    print(f"results: {args.out / 'results.json'}, {args.out / 'results.md'}")


if __name__ == "__main__":
    main()
