"""Where a Whisper window's time goes, greedy against beams (issue 52): the process time of one
SpeechModel.decode_features call, split by wrapping what it calls,

    encoder        encoder_model.onnx on the window
    first          decoder_model.onnx on the prompt (it makes the cross keys / values)
    step graph     decoder_with_past_model.onnx, once a new token (all the rows together)
    step, rest     DecoderSteps' own work around it: the self-attention cache gathered by
                   parent (the beams' reorder), the feeds
    head           BeamHead: LogSoftmax, the rules' mask and TopK (beams only)
    loop           what is left: beam_search's choice and Whisper's rules in numpy, greedy's
                   choice

with and without timestamps (their rules read each row's history: numpy applies them), and
ONNX Runtime's profile of the step graph per op type at 1 row and at `beams` rows (the cross
keys / values of one source, as the beams feed them).

    .venv/bin/python -m lab.whisper_beam_split ARTIFACTS/onnx-int8 OUT/features.npy \\
        [--threads 1] [--beams 5] [--new-tokens 64] [--reps 5] [--before CHECKOUT]

features: a .npy of log-mel windows [n, 80, 3000] (whisper_peers writes OUT/features.npy);
the first is decoded. --before: a checkout whose runtime/beam.py and runtime/whisper_rules.py
(the loop's modules) run alternately with this one's, in this process, on the same sessions:
their times side by side and whether their tokens are the same. Process time (the CPU this
process used) is steadier than the wall clock on a shared machine, but not immune to it.
"""
from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

CLOCK = time.process_time


def _module(name: str, path: Path):
    """runtime/<name>.py of another checkout, imported beside this one's."""
    spec = importlib.util.spec_from_file_location(f"tinyt.runtime.{name}_before", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def split(model, window: np.ndarray, *, beams: int, timestamps: bool, n: int, reps: int,
          loops: dict) -> dict:
    """Milliseconds a call of each part (the median call's total), for each of `loops`
    (name -> (beam module, whisper_rules module)), the calls of each interleaved; and the
    tokens of each."""
    from tinyt.runtime import encoder_decoder, heads, transcribe

    spent: collections.Counter = collections.Counter()
    sessions = {id(s): role for role, s in model.sessions.items()}

    def timed(name, f):
        def g(*a, **kw):
            t = CLOCK()
            try:
                return f(*a, **kw)
            finally:
                spent[name(a) if callable(name) else name] += CLOCK() - t
        return g
    ort_run = type(model.sessions["encoder"]).run
    patches = [(type(model.sessions["encoder"]), "run",
                timed(lambda a: sessions.get(id(a[0]), "head"), ort_run)),
               (encoder_decoder.DecoderSteps, "__call__",
                timed("steps", encoder_decoder.DecoderSteps.__call__)),
               (heads.BeamHead, "__call__", timed("head call", heads.BeamHead.__call__)),
               (heads.BeamHead, "top", timed("head call", heads.BeamHead.top))]
    saved = [(o, a, getattr(o, a)) for o, a, _ in patches]
    for o, a, f in patches:
        setattr(o, a, f)
    out: dict = {}
    try:
        calls = {name: [] for name in loops}
        for _ in range(reps + 1):  # the first round untimed
            for name, (beam, rules) in loops.items():
                transcribe.beam_search, transcribe.WhisperRules = beam.beam_search, \
                    rules.WhisperRules
                spent.clear()
                t = CLOCK()
                tokens = model.decode_features(window[None], language="en", max_new_tokens=n,
                                               num_beams=beams, timestamps=timestamps)[0]
                calls[name].append((CLOCK() - t, dict(spent)))
                out.setdefault(name, {})["tokens"] = tokens
        for name, rows in calls.items():
            total, parts = sorted(rows[1:], key=lambda r: r[0])[len(rows[1:]) // 2]
            out[name]["ms"] = _parts(total, parts)
    finally:
        for o, a, f in saved:
            setattr(o, a, f)
    return out


def _parts(total: float, parts: dict) -> dict:
    ms = {k: 1e3 * v for k, v in parts.items()}
    graph, steps = ms.get("decoder_with_past", 0.0), ms.get("steps", 0.0)
    head = ms.get("head call", 0.0)
    known = {"encoder": ms.get("encoder", 0.0), "first": ms.get("decoder", 0.0),
             "step graph": graph, "step, rest": steps - graph, "head": head}
    known["loop"] = 1e3 * total - sum(known.values())
    return {"total": round(1e3 * total, 1), **{k: round(v, 1) for k, v in known.items()}}


def op_profile(artifact: Path, rows: int, past: int, threads: int, runs: int = 20) -> dict:
    """Microseconds a run of decoder_with_past_model.onnx per op type, `rows` rows after
    `past` tokens, the cross keys / values of one source (as grouped beams feed them)."""
    import onnxruntime as ort

    from tinyt.runtime.session import UNFUSED, ort_options

    with tempfile.TemporaryDirectory() as tmp:
        opts = ort_options(level="extended", threads=threads)
        opts.enable_profiling, opts.profile_file_prefix = True, str(Path(tmp) / "p")
        s = ort.InferenceSession(str(artifact / "decoder_with_past_model.onnx"), opts,
                                 providers=["CPUExecutionProvider"],
                                 disabled_optimizers=UNFUSED)
        rng = np.random.default_rng(0)
        feeds = {}
        for i in s.get_inputs():
            heads, dim = i.shape[1], i.shape[3] if len(i.shape) == 4 else 0
            if i.name == "input_ids":
                feeds[i.name] = np.full((rows, 1), 1000, np.int64)
            elif ".decoder." in i.name:
                feeds[i.name] = rng.random((rows, heads, past, dim), dtype=np.float32)
            else:
                feeds[i.name] = rng.random((1, heads, 1500, dim), dtype=np.float32)
        for _ in range(runs):
            s.run(None, feeds)
        events = json.loads(Path(s.end_profiling()).read_text())
    per_op: collections.Counter = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per_op[e["args"]["op_name"]] += e["dur"] / runs
    whole = sorted(e["dur"] for e in events if e.get("name") == "model_run")
    return {"run_us": whole[len(whole) // 2],
            **{k: round(v) for k, v in per_op.most_common(6)}}


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m lab.whisper_beam_split",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("artifact", type=Path)
    ap.add_argument("features", type=Path)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--beams", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--before", type=Path, help="a checkout: its loop modules beside these")
    args = ap.parse_args()
    import tinyt.runtime as rt
    from tinyt.runtime import beam, whisper_rules

    model = rt.load(args.artifact, threads=args.threads)
    window = np.load(args.features, allow_pickle=False)[0]
    loops = {"this": (beam, whisper_rules)}
    if args.before:
        loops["before"] = (_module("beam", args.before / "runtime" / "beam.py"),
                           _module("whisper_rules", args.before / "runtime" / "whisper_rules.py"))
    print(f"{args.artifact}, {args.threads} thread(s), {args.new_tokens} new tokens, median of "
          f"{args.reps}, process ms; load average {os.getloadavg()[0]:.1f}")
    for timestamps in (False, True):
        for k in (1, args.beams):
            got = split(model, window, beams=k, timestamps=timestamps, n=args.new_tokens,
                        reps=args.reps, loops=loops if k > 1 else {"this": loops["this"]})
            same = "" if len(got) == 1 else \
                f"  same tokens: {got['this']['tokens'] == got['before']['tokens']}"
            for name, r in got.items():
                print(f"timestamps={timestamps} beams={k} {name}: {r['ms']}" +
                      (same if name == "before" else ""))
    for rows in (1, args.beams):
        profile = op_profile(args.artifact, rows, 32, args.threads)
        print(f"step graph, {rows} row(s), past 32, us a run: {profile}")
    print(f"load average after {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
