"""tinyt's Whisper before and after a change to its runtime, interleaved in one peer run: the
Whisper peer benchmark (benchmarks/peers/whisper_peers.py, its check, rounds and report) with one
more engine, tinyt-int8-before, whose worker imports tinyt from another checkout (the commit
before the change, e.g. `git archive BASE | tar -x -C /tmp/before`) on the same artifact.

    .venv/bin/python -m lab.whisper_before_after ARTIFACTS --before /tmp/before \\
        --rounds 3 --block 1 --check-windows 4 --engine ct2-int8 --out OUT

ARTIFACTS as whisper_peers takes it (--make tiny there makes one). The before worker runs with
a sitecustomize that puts the checkout first on sys.path and points the editable install's
subpackages (tinyt.runtime, tinyt.benchmarks, ...) at it, from a working directory of its own
(python -m reads the working directory first), so every module it imports is the old one.
Both tinyt rows run onnx-int8; their tokens are told beside the others' (the same agreement
means the same tokens on the check's windows).
"""
from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from tinyt.benchmarks.peers import seq2seq_peers, whisper_peers
from tinyt.benchmarks.peers.engines import PeerEngine

BEFORE = "tinyt-int8-before"
SITE = '''import sys
sys.path.insert(0, {root!r})
try:
    import importlib
    from pathlib import Path
    f = importlib.import_module("__editable___tinyt_0_1_0_finder")
    old = Path(f.MAPPING["tinyt"]).parent
    for k, v in list(f.MAPPING.items()):
        f.MAPPING[k] = str(Path({root!r}) / Path(v).relative_to(old))
except Exception:
    pass
'''


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m lab.whisper_before_after",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("artifacts", type=Path)
    ap.add_argument("--before", type=Path, required=True, help="the checkout before the change")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--engine", action="append", default=[], help="peers beside them (repeat)")
    ap.add_argument("--threads", type=int, action="append")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--block", type=int, default=1)
    ap.add_argument("--check-windows", type=int, default=4)
    args = ap.parse_args()
    if not (args.before / "runtime" / "beam.py").is_file():
        raise SystemExit(f"--before {args.before}: not a tinyt checkout (no runtime/beam.py)")
    after = whisper_peers.WHISPER_ENGINES["tinyt-int8"]
    before = PeerEngine(
        BEFORE, after.about + f", tinyt's code from {args.before}", after.package,
        after.install, after.load, after.artifact, ours=True, modules=after.modules)
    start = seq2seq_peers.start
    with tempfile.TemporaryDirectory() as site:
        root = str(args.before.resolve())
        (Path(site) / "sitecustomize.py").write_text(SITE.format(root=root))

        def started(e, *a, **kw):  # the before engine's worker on the old checkout
            if e.name != BEFORE:
                return start(e, *a, **kw)
            saved, here = os.environ.get("PYTHONPATH"), os.getcwd()
            os.environ["PYTHONPATH"] = site
            os.chdir(site)  # python -m puts the working directory first: not this checkout
            try:
                return start(e, *a, **kw)
            finally:
                os.chdir(here)
                if saved is None:
                    del os.environ["PYTHONPATH"]
                else:
                    os.environ["PYTHONPATH"] = saved
        seq2seq_peers.start = started
        whisper_peers.run(args.artifacts.resolve(), args.out, threads=args.threads,
                          rounds=args.rounds, block=args.block,
                          check_windows=args.check_windows,
                          engines=["tinyt-int8", before, *args.engine])
    print((args.out / "results.md").read_text())


if __name__ == "__main__":
    main()
