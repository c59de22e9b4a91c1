"""Which of a Whisper INT8 artifact's three graphs loses fp32's tokens (issue 52): the INT8
artifact's sessions with one graph at a time put back to fp32 (or one at a time quantized),
each combination's greedy and beam tokens on the peer benchmark's windows against tinyt fp32's,
position by position (seq2seq_check's agreement).

    fp32 from ARTIFACTS/onnx-opt (the graphs INT8 is quantized from), the reference tokens from
    ARTIFACTS/onnx (the benchmark's tinyt-fp32); for each INT8 artifact asked:
      all      encoder, decoder, decoder_with_past INT8 (the artifact as it is)
      only X   X INT8, the other two fp32            (what X's quantization costs alone)
      steps S  the encoder and decoder INT8, decoder_with_past from artifact S (--steps-from:
               e.g. a weight-only one, fp32 products a step)
    ──▶ a table of greedy and beam agreement per combination

    .venv/bin/python -m lab.whisper_int8_split ARTIFACTS OUT/features.npy \\
        --int8 onnx-int8 --int8 onnx-int8-qgemm [--steps-from onnx-int8-wo] [--windows 16] \\
        [--new-tokens 64] [--beams 5]

features: the benchmark's OUT/features.npy (log-mel windows [n, 80, 3000]). One thread; the
sessions of each artifact load once. Agreement does not depend on the load.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

ROLES = ("encoder", "decoder", "decoder_with_past")


def tokens(model, windows: np.ndarray, n: int, beams: int) -> list[list[int]]:
    """Each window's tokens alone (as the benchmark's check asks them)."""
    return [model.decode_features(w[None], language="en", max_new_tokens=n,
                                  num_beams=beams)[0] for w in windows]


def split(artifacts: Path, features: Path, int8: list[str], *, windows: int, n: int,
          beams: int, steps_from: tuple[str, ...] = (), log=print) -> dict:
    """{artifact: {combination: {greedy, beams: agreement}}} against ARTIFACTS/onnx's tokens."""
    import tinyt.runtime as rt

    x = np.load(features, allow_pickle=False)[:windows]
    ref_model = rt.load(artifacts / "onnx", threads=1)
    ref = {b: tokens(ref_model, x, n, b) for b in (1, beams)}
    fp32 = rt.load(artifacts / "onnx-opt", threads=1)
    out = {"onnx-opt": {"fp32": _row(fp32, x, n, beams, ref)}}
    steps = {s: rt.load(artifacts / s, threads=1).sessions["decoder_with_past"]
             for s in steps_from}
    for name in int8:
        model = rt.load(artifacts / name, threads=1)
        quantized = dict(model.sessions)
        rows = {}
        for combo in ("all", *(f"only {r}" for r in ROLES), *(f"steps {s}" for s in steps)):
            for role in ROLES:  # the shared dict: Seq2SeqModel reads the same sessions
                keep = combo == "all" or combo == f"only {role}" or combo.startswith("steps")
                model.sessions[role] = quantized[role] if keep else fp32.sessions[role]
            if combo.startswith("steps"):
                model.sessions["decoder_with_past"] = steps[combo.split(" ", 1)[1]]
            rows[combo] = _row(model, x, n, beams, ref)
            log(f"{name} {combo}: {rows[combo]}")
        out[name] = rows
    return out


def _row(model, x, n, beams, ref) -> dict:
    from tinyt.benchmarks.peers.seq2seq_check import agree  # the peer check's own count

    got = {b: tokens(model, x, n, b) for b in (1, beams)}
    return {"greedy": agree(got[1], ref[1]), "beams": agree(got[beams], ref[beams])}


def markdown(result: dict, beams: int) -> str:
    lines = [f"| artifact | graphs INT8 | greedy agreement | {beams}-beam agreement |",
             "|---|---|---|---|"]
    for name, rows in result.items():
        for combo, r in rows.items():
            g, b = r["greedy"], r["beams"]
            lines.append(f"| {name} | {combo} | {g['agreement']:.1%} ({g['matching_tokens']} / "
                         f"{g['tokens']}) | {b['agreement']:.1%} ({b['matching_tokens']} / "
                         f"{b['tokens']}) |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m lab.whisper_int8_split",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("artifacts", type=Path, help="holds onnx/, onnx-opt/ and the INT8 ones")
    ap.add_argument("features", type=Path, help="log-mel windows [n, 80, 3000] (.npy)")
    ap.add_argument("--int8", action="append", required=True,
                    help="an INT8 artifact directory under ARTIFACTS (repeat)")
    ap.add_argument("--steps-from", action="append", default=[],
                    help="an artifact whose decoder_with_past replaces each INT8 one's (repeat)")
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--beams", type=int, default=5)
    ap.add_argument("--out", type=Path, help="write the result's JSON here")
    args = ap.parse_args()
    missing = [d for d in ("onnx", "onnx-opt", *args.int8, *args.steps_from)
               if not (args.artifacts / d / "manifest.json").is_file()]
    if missing:
        raise SystemExit(f"error: no artifact at {', '.join(missing)} under {args.artifacts}")
    r = split(args.artifacts, args.features, args.int8, windows=args.windows,
              n=args.new_tokens, beams=args.beams, steps_from=tuple(args.steps_from))
    if args.out:
        args.out.write_text(json.dumps(r, indent=1) + "\n")
    print(markdown(r, args.beams))


if __name__ == "__main__":
    main()
