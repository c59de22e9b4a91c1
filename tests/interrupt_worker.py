"""`python tests/interrupt_worker.py POINT export CKPT OUT`: `tinyt export` as a user runs it,
with a Ctrl-C (a real SIGINT, sent to itself) at a fixed point of the work instead of after
some seconds, so what the test sees does not depend on how fast the machine is:

    import   when the verb starts importing torch (the CLI has only its own modules loaded)
    trace    when torch.onnx's exporter calls torch.export.export: deep inside torch, which
             wraps what its internals raise in errors of its own
    write    when the exporter starts writing the graph into its temporary directory

The signal goes to the thread that raises it (the main one), and Python runs its handler at
the next function call, in the frame that raised it (`interrupt`).
"""
import importlib.abc
import os
import signal
import sys

os.environ.pop("TINYT_EXPORT_CACHE", None)  # "trace" needs the exporter to trace

point, argv = sys.argv[1], sys.argv[2:]


def interrupt() -> None:
    """SIGINT to this very thread (raise(3)), then a Python call: the interpreter runs the
    handler at that call's entry, so the KeyboardInterrupt starts here, at this point of the
    work, however busy the machine is. Reaching the line after it is a failure, said as one."""
    signal.raise_signal(signal.SIGINT)
    _handled_here()
    sys.exit(f"worker: the SIGINT handler did not run at point {point!r}")


def _handled_here() -> None:
    pass


class _OnTorchImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            sys.meta_path.remove(self)
            interrupt()
        return None


if point == "import":
    sys.meta_path.insert(0, _OnTorchImport())
elif point == "trace":
    import torch

    _export = torch.export.export

    def export(*args, **kwargs):
        interrupt()
        return _export(*args, **kwargs)

    torch.export.export = export
elif point == "write":
    import tinyt.export.exporter as exporter

    _save = exporter.save_graph

    def save_graph(*args, **kwargs):
        interrupt()
        return _save(*args, **kwargs)

    exporter.save_graph = save_graph
else:
    sys.exit(f"unknown point {point!r}: import, trace or write")

sys.argv = ["tinyt", *argv]
from tinyt.__main__ import entry  # noqa: E402

entry()
