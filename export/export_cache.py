"""torch.onnx's exporter behind a content-addressed cache (opt-in: TINYT_EXPORT_CACHE=DIR).

torch's dynamo exporter takes ~8 s for even a two-layer graph (torch.export's capture, the
decomposition re-trace, symbolic shapes), and the test suite exports the same tiny checkpoints
in many files and processes. With TINYT_EXPORT_CACHE naming a directory, an export whose every
input is one seen before is read back instead of traced again:

    key = sha256(wrapper class and module tree, every parameter's and buffer's bytes, the
                 example inputs' bytes, the dynamic axes, names, opset, the caller's `what`
                 (the config and graph role), the source of tinyt's core and export packages,
                 torch / onnx / onnxscript / Python versions)

Nothing the graph is a function of is left out of the key, so a hit is the graph the exporter
would write. Unset (the default), `export` is torch.onnx.export and nothing is written. Entries
are written atomically (a temporary file, then a rename), so processes may share a directory;
graphs over MAX_BYTES (16 MB) are not kept (the cache is for many small exports, not one big one).
tests/conftest.py gives the suite one directory a run, removed when it ends."""
from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import tempfile
import time
import warnings
from pathlib import Path

import onnx
import torch

ENV = "TINYT_EXPORT_CACHE"
# the suite's tiny LMs are 1-4 MB; a Whisper decoder at tiny's vocabulary (85 MB) is not kept
MAX_BYTES = 16 << 20
_SOURCES: dict[str, str] = {}  # package directory -> the hash of its .py files


def export(wrapper: torch.nn.Module, *, kwargs: dict, shapes, opset: int,
           input_names: list[str], output_names: list[str], what: str) -> onnx.ModelProto:
    """torch.onnx.export(dynamo=True) of `wrapper` at `kwargs` -> its ModelProto, read from the
    cache where TINYT_EXPORT_CACHE holds the same export. `what`: what else the wrapper's
    forward reads (the model's config, the graph's role), as text."""
    root = os.environ.get(ENV)
    path = None
    if root:
        key = _key(wrapper, kwargs, shapes, opset, input_names, output_names, what)
        path = Path(root) / f"{key}.onnx"
        if path.is_file():
            _note(path.parent, path.stem, hit=True)
            return onnx.load(str(path))
    start = time.perf_counter()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the exporter's progress chatter, not our concern
        proto = torch.onnx.export(
            wrapper, args=(), kwargs=kwargs, dynamo=True, dynamic_shapes=shapes,
            opset_version=opset, input_names=input_names, output_names=output_names,
            external_data=False, verbose=False).model_proto
    if path is not None and proto.ByteSize() <= MAX_BYTES:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(proto.SerializeToString())
        os.replace(tmp, path)
        _note(path.parent, path.stem, hit=False, seconds=time.perf_counter() - start)
    return proto


def _note(root: Path, key: str, *, hit: bool, seconds: float | None = None) -> None:
    """One line of root/log.jsonl: a miss with the seconds its export took, or a hit."""
    line = json.dumps({"key": key, "hit": hit, "seconds": seconds}) + "\n"
    with open(root / "log.jsonl", "a") as f:  # one short write: whole lines between processes
        f.write(line)


def saved_seconds(root: str | os.PathLike) -> tuple[int, int, float]:
    """(hits, misses, the seconds the hits saved: each its key's export time) of a cache
    directory's log."""
    log = Path(root) / "log.jsonl"
    entries = [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []
    took = {e["key"]: e["seconds"] for e in entries if not e["hit"]}
    hits = [e for e in entries if e["hit"]]
    return len(hits), len(took), sum(took.get(e["key"], 0.0) for e in hits)


def _key(wrapper, kwargs, shapes, opset, input_names, output_names, what) -> str:
    h = hashlib.sha256()
    text = [type(wrapper).__module__, type(wrapper).__qualname__, repr(wrapper), repr(shapes),
            str(opset), repr(input_names), repr(output_names), what, torch.__version__,
            onnx.__version__, _version("onnxscript"), platform.python_version(),
            *(_source(Path(sys.modules[name].__file__).parent)
              for name in ("tinyt", "tinyt.export"))]
    h.update("\0".join(text).encode())
    for name, tensor in [*wrapper.named_parameters(), *wrapper.named_buffers()]:
        _tensor(h, name, tensor)
    _feed(h, kwargs)
    return h.hexdigest()


def _feed(h, obj, name: str = "") -> None:
    """The example inputs (tensors, and the lists / dicts of them that caches are) into h."""
    if isinstance(obj, torch.Tensor):
        _tensor(h, name, obj)
    elif isinstance(obj, dict):
        for k in sorted(obj):
            _feed(h, obj[k], f"{name}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _feed(h, v, f"{name}[{i}]")
    else:
        h.update(f"{name}={obj!r}".encode())


def _tensor(h, name: str, tensor: torch.Tensor) -> None:
    t = tensor.detach().cpu().contiguous()
    h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")


def _source(package: Path) -> str:
    """The hash of a package directory's Python files (its subpackages' too)."""
    if str(package) not in _SOURCES:
        h = hashlib.sha256()
        for file in sorted(package.rglob("*.py")):
            h.update(str(file.relative_to(package)).encode() + b"\0" + file.read_bytes())
        _SOURCES[str(package)] = h.hexdigest()
    return _SOURCES[str(package)]


def _version(module: str) -> str:
    try:
        from importlib.metadata import version
        return version(module)
    except Exception:  # noqa: BLE001 - not installed: part of the key as such
        return "none"
