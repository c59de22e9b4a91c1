"""`tinyt ...` run in-process, as a user types it: (exit code, stdout, stderr)."""
import sys

import pytest


def run_cli(monkeypatch, capsys, *args):
    from tinyt.app import cli
    monkeypatch.setattr(sys, "argv", ["tinyt", *map(str, args)])
    with pytest.raises(SystemExit) as e:
        cli.run([])
    out = capsys.readouterr()
    return e.value.code, out.out, out.err
