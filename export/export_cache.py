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
tests/conftest.py gives the suite one directory a run, removed when it ends.

The same model with other weights (another seed, more training steps) traces to the same graph
but for its weight initializers, so a second level keys what the graph's form is a function of
and refills the weights:

    form key = the key above with each parameter's bytes replaced by what the exporter's graph
               rewrites can see of them: which parameters are equal to each other (its
               optimizer merges equal initializers) and the value of a parameter whose elements
               are all one value (a rewrite may drop a multiply by ones)
    recipe   = each initializer of the traced graph as a parameter (itself, transposed or
               reshaped: the exporter folds Transpose(weight) into a new initializer), a
               buffer's elements (in the key), or a constant no parameter can reach (integers;
               float scalars where no parameter is a scalar)

A traced graph one of whose float initializers is none of these (a constant folded from a
parameter by arithmetic, as Gemma's 1 + weight) gets no form entry: only the exact key serves
it. A form hit writes the recipe's arrays from the model's own parameters into the stored
graph's initializers. TINYT_EXPORT_CACHE_VERIFY=1 traces every form hit as well and stops with
an error unless the two serialize to the same bytes (how the suite's form hits were checked)."""
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

import numpy as np
import onnx
import torch
from onnx import numpy_helper

ENV = "TINYT_EXPORT_CACHE"
VERIFY_ENV = "TINYT_EXPORT_CACHE_VERIFY"
# the suite's tiny LMs are 1-4 MB; a Whisper decoder at tiny's vocabulary (85 MB) is not kept
MAX_BYTES = 16 << 20
_SOURCES: dict[str, str] = {}  # package directory -> the hash of its .py files


def export(wrapper: torch.nn.Module, *, kwargs: dict, shapes, opset: int,
           input_names: list[str], output_names: list[str], what: str) -> onnx.ModelProto:
    """torch.onnx.export(dynamo=True) of `wrapper` at `kwargs` -> its ModelProto, read from the
    cache where TINYT_EXPORT_CACHE holds the same export. `what`: what else the wrapper's
    forward reads (the model's config, the graph's role), as text."""
    root = os.environ.get(ENV)
    args = (wrapper, kwargs, shapes, opset, input_names, output_names, what)
    if not root:
        return _trace(*args)[0]
    root_dir = Path(root)
    key, form = _key(*args), _key(*args, form=True)
    path = root_dir / f"{key}.onnx"
    if path.is_file():
        _note(root_dir, key, hit=True)
        return onnx.load(str(path))
    recipe_path = root_dir / f"form-{form}.json"
    if recipe_path.is_file():
        proto = onnx.load(str(root_dir / f"form-{form}.onnx"))
        _refill(proto, json.loads(recipe_path.read_text()), wrapper)
        if os.environ.get(VERIFY_ENV):
            _verify(proto, _trace(*args)[0], what)
        _note(root_dir, f"form-{form}", hit=True)
        return proto
    proto, seconds = _trace(*args)
    if proto.ByteSize() <= MAX_BYTES:
        data = proto.SerializeToString()
        _write(path, data)
        recipe = _recipe(proto, wrapper)
        if recipe is not None:  # the graph first, then the recipe that says it is there
            _write(root_dir / f"form-{form}.onnx", data)
            _write(recipe_path, json.dumps(recipe).encode())
        _note(root_dir, key, hit=False, seconds=seconds,
              form=f"form-{form}" if recipe is not None else None)
    return proto


def _trace(wrapper, kwargs, shapes, opset, input_names, output_names, what
           ) -> tuple[onnx.ModelProto, float]:
    """torch.onnx.export(dynamo=True): the graph and the seconds it took."""
    start = time.perf_counter()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the exporter's progress chatter, not our concern
        proto = torch.onnx.export(
            wrapper, args=(), kwargs=kwargs, dynamo=True, dynamic_shapes=shapes,
            opset_version=opset, input_names=input_names, output_names=output_names,
            external_data=False, verbose=False).model_proto
    return proto, time.perf_counter() - start


def _write(path: Path, data: bytes) -> None:
    """`data` at `path`, whole or not at all (a temporary file, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _note(root: Path, key: str, *, hit: bool, seconds: float | None = None,
          form: str | None = None) -> None:
    """One line of root/log.jsonl: a miss with the seconds its export took (and the form entry
    it made), or a hit (of an exact key or a form)."""
    line = json.dumps({"key": key, "hit": hit, "seconds": seconds, "form": form}) + "\n"
    with open(root / "log.jsonl", "a") as f:  # one short write: whole lines between processes
        f.write(line)


def saved_seconds(root: str | os.PathLike) -> tuple[int, int, float]:
    """(hits, misses, the seconds the hits saved: each its key's or form's export time) of a
    cache directory's log."""
    log = Path(root) / "log.jsonl"
    entries = [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []
    misses = [e for e in entries if not e["hit"]]
    took = {e["key"]: e["seconds"] for e in misses}
    took.update({e["form"]: e["seconds"] for e in misses if e.get("form")})
    hits = [e for e in entries if e["hit"]]
    return len(hits), len(misses), sum(took.get(e["key"], 0.0) for e in hits)


def _key(wrapper, kwargs, shapes, opset, input_names, output_names, what, *,
         form: bool = False) -> str:
    """The exact key, or (form=True) the form key: the parameters' bytes left out but for
    what the graph's rewrites see of them (_form_of)."""
    h = hashlib.sha256()
    text = [type(wrapper).__module__, type(wrapper).__qualname__, repr(wrapper), repr(shapes),
            str(opset), repr(input_names), repr(output_names), what, torch.__version__,
            onnx.__version__, _version("onnxscript"), platform.python_version(),
            *(_source(Path(sys.modules[name].__file__).parent)
              for name in ("tinyt", "tinyt.export"))]
    h.update("\0".join(text).encode())
    if form:
        h.update(b"form\0" + json.dumps(_form_of(wrapper)).encode())
    else:
        for name, tensor in wrapper.named_parameters():
            _tensor(h, name, tensor)
    for name, tensor in wrapper.named_buffers():
        _tensor(h, name, tensor)
    _feed(h, kwargs)
    return h.hexdigest()


def _form_of(wrapper) -> list:
    """Each parameter's name, dtype, shape, the first parameter it equals (its class) and,
    where its elements are all one value, that value."""
    first: dict[bytes, str] = {}
    out = []
    for name, tensor in wrapper.named_parameters():
        t = tensor.detach().cpu().contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        digest = hashlib.sha256(raw + str(t.dtype).encode() + str(tuple(t.shape)).encode()).digest()
        same = first.setdefault(digest, name)
        flat = t.reshape(-1)
        one_value = float(flat[0]) if t.numel() and bool((flat == flat[0]).all()) else None
        out.append([name, str(t.dtype), list(t.shape), same, one_value])
    return out


def _recipe(proto: onnx.ModelProto, wrapper) -> list | None:
    """For each initializer of the traced `proto`: [name, parameter, how] (how: "same",
    "transpose", "reshape") or [name, None, None] (a constant the form key fixes); None where
    one is neither (a value folded from a parameter by arithmetic)."""
    params = {n: t.detach().cpu().numpy() for n, t in wrapper.named_parameters()}
    buffers = [t.detach().cpu().numpy().reshape(-1) for _, t in wrapper.named_buffers()]
    scalar_param = any(a.size <= 1 for a in params.values())
    recipe = []
    for init in proto.graph.initializer:
        arr = numpy_helper.to_array(init)
        found = _as_parameter(arr, params)
        if found is not None:
            if not init.raw_data:  # refilled as raw bytes: only an initializer stored so
                return None
            recipe.append([init.name, *found])
        elif arr.dtype.kind not in "fc" or (arr.size <= 1 and not scalar_param) or any(
                b.dtype == arr.dtype and b.size == arr.size and
                np.array_equal(b, arr.reshape(-1)) for b in buffers):
            recipe.append([init.name, None, None])
        else:
            return None
    return recipe


def _as_parameter(arr: np.ndarray, params: dict[str, np.ndarray]) -> tuple[str, str] | None:
    """(the parameter, how) whose elements `arr` holds, as itself, transposed or reshaped."""
    for name, p in params.items():
        if p.dtype != arr.dtype or p.size != arr.size or p.size <= 1:
            continue
        if p.shape == arr.shape and np.array_equal(p, arr):
            return name, "same"
        if p.ndim == 2 and p.T.shape == arr.shape and np.array_equal(p.T, arr):
            return name, "transpose"
        if np.array_equal(p.reshape(-1), arr.reshape(-1)):
            return name, "reshape"
    return None


def _refill(proto: onnx.ModelProto, recipe: list, wrapper) -> None:
    """The form entry's weight initializers set from `wrapper`'s parameters, by the recipe."""
    params = {n: t.detach().cpu().numpy() for n, t in wrapper.named_parameters()}
    inits = {i.name: i for i in proto.graph.initializer}
    for name, param, how in recipe:
        if param is None:
            continue
        p = params[param]
        arr = p.T if how == "transpose" else p
        inits[name].raw_data = np.ascontiguousarray(arr).reshape(
            tuple(inits[name].dims)).tobytes()


def _verify(proto: onnx.ModelProto, traced: onnx.ModelProto, what: str) -> None:
    if proto.SerializeToString() != traced.SerializeToString():
        raise RuntimeError(f"export cache: the refilled graph of {what[:80]!r} is not the "
                           f"traced one ({VERIFY_ENV}); report this with the model")


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
