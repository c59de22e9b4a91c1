"""`python -m tinyt ...` and the `tinyt` command (also what `torchrun -m tinyt train ...` runs).

Ctrl-C is caught from the first instant, before the CLI and its libraries are imported, so it
always ends in exit 130 and one line (see tinyt.app.cli.run).
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
        from tinyt.app.cli import run
    except KeyboardInterrupt:
        print("interrupted: nothing was started", file=sys.stderr)
        sys.exit(130)
    try:
        run(interrupted)
    finally:
        # The work is done (or refused): a Ctrl-C during interpreter teardown (torch's can take
        # a while) must not turn the exit status into death by SIGINT with no word said.
        signal.signal(signal.SIGINT, signal.SIG_IGN)


if __name__ == "__main__":
    entry()
