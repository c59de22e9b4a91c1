"""`python -m tinyt ...` and the `tinyt` command (also what `torchrun -m tinyt train ...` runs).

Ctrl-C is caught from the first instant, before the CLI and its libraries are imported, so it
always ends in exit 130 and one line (see tinyt.cli.run).
"""
import signal
import sys


def entry() -> None:
    interrupted: list[bool] = []
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not if ignored (nohup)
        def on_sigint(signum, frame):
            interrupted.append(True)
            raise KeyboardInterrupt
        signal.signal(signal.SIGINT, on_sigint)
    try:
        from tinyt.cli import run
    except KeyboardInterrupt:
        print("interrupted: nothing was started", file=sys.stderr)
        sys.exit(130)
    run(interrupted)


if __name__ == "__main__":
    entry()
