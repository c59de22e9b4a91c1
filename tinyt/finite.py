"""Non-finite numbers are bad input: weights that hold NaN or +-inf are refused by name, at
load and before any stage writes an artifact (numpy only; torch tensors are checked in
tinyt.checkpoint with the same message)."""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from tinyt.errors import NonFiniteError


def describe(name: str, nan: int, posinf: int, neginf: int, total: int) -> str:
    kinds = ", ".join(f"{n} {k}" for n, k in ((nan, "NaN"), (posinf, "+inf"), (neginf, "-inf"))
                      if n)
    return f"tensor {name!r} has {kinds} among its {total:,} values"


def count_nonfinite(a: np.ndarray) -> tuple[int, int, int] | None:
    """(NaN, +inf, -inf) counts of a float array, or None when every value is finite."""
    if a.dtype.kind != "f" or np.isfinite(a).all():
        return None
    return int(np.isnan(a).sum()), int(np.isposinf(a).sum()), int(np.isneginf(a).sum())


def check_arrays(items: Iterable[tuple[str, np.ndarray]], source: str) -> None:
    """Raise NonFiniteError naming the first tensor of `items` that holds NaN or +-inf."""
    for name, a in items:
        counts = count_nonfinite(np.asarray(a))
        if counts:
            raise NonFiniteError(f"{source}: {describe(name, *counts, a.size)}; weights must "
                                 "be finite (the model diverged in training or the file is "
                                 "damaged)")


def check_onnx_weights(proto, source: str) -> None:
    """Every float initializer and Constant of an ONNX graph (subgraphs included) is finite."""
    from onnx import numpy_helper

    def tensors(graph):
        for t in graph.initializer:
            yield t.name, numpy_helper.to_array(t)
        for node in graph.node:
            for attr in node.attribute:
                if attr.HasField("t"):
                    yield f"{node.name or node.op_type}.{attr.name}", numpy_helper.to_array(attr.t)
                if attr.HasField("g"):
                    yield from tensors(attr.g)

    check_arrays(tensors(proto.graph), source)
