"""What an edge install pulls: `pip install tinyt[cpu]` (the torch-free runtime, ONNX Runtime,
numpy, tokenizers, and the CLI's typer), measured from the distributions installed here
(torch-free).

Each distribution's size is the sum of the files its RECORD lists, so it is what pip puts on
disk for it; tinyt itself counts its three packages' sources (an editable install records
almost nothing).
"""
from __future__ import annotations

import importlib.metadata as md
import importlib.util
from pathlib import Path

from packaging.requirements import Requirement

EDGE_EXTRA = "cpu"


def _closure(root: str, extra: str) -> list[str]:
    """Distribution names needed by root[extra], recursively (markers evaluated here)."""
    seen: dict[str, None] = {}
    todo = [(root, extra)]
    while todo:
        name, ext = todo.pop()
        key = name.lower().replace("_", "-")
        if key in seen:
            continue
        seen[key] = None
        for line in md.requires(name) or []:
            req = Requirement(line)
            env = {"extra": ext or ""}
            if req.marker is None or req.marker.evaluate(env):
                try:
                    md.distribution(req.name)
                except md.PackageNotFoundError:
                    continue  # not installed here (a platform-only dependency)
                todo.append((req.name, ""))
    return list(seen)


def _dist_bytes(name: str) -> int:
    if name == "tinyt":
        total = 0
        for pkg in ("tinyt", "tinyt.export", "tinyt.runtime"):
            for root in importlib.util.find_spec(pkg).submodule_search_locations or []:
                total += sum(p.stat().st_size for p in Path(root).glob("*.py"))
        return total
    total = 0
    for f in md.distribution(name).files or []:
        path = Path(f.locate())
        if path.is_file():
            total += path.stat().st_size
    return total


def edge_footprint() -> dict[str, int]:
    """Bytes on disk per distribution of tinyt[cpu], largest first, plus 'total'."""
    sizes = {name: _dist_bytes(name) for name in _closure("tinyt", EDGE_EXTRA)}
    out = dict(sorted(sizes.items(), key=lambda kv: -kv[1]))
    out["total"] = sum(sizes.values())
    return out


def summary(sizes: dict[str, int], top: int = 4) -> str:
    """One line: total and the largest distributions, in MiB."""
    parts = [f"{name} {b / 2**20:.1f}" for name, b in list(sizes.items())[:top] if name != "total"]
    return (f"edge install (tinyt[{EDGE_EXTRA}], no torch): {sizes['total'] / 2**20:.0f} MiB on "
            f"disk in {len(sizes) - 1} distributions; largest (MiB): {', '.join(parts)}")
