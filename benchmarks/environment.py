"""The machine and software a result was measured on, as every benchmark's result file records
it: CPU (model and int8 flags), cores, Python, platform, the versions of the distributions
that did the work, and the time."""
from __future__ import annotations

import importlib.metadata as md
import os
import platform
import time
from collections.abc import Iterable
from typing import Any

from tinyt.hardware import cpu_features, physical_cores


def versions(dists: Iterable[str]) -> dict[str, str | None]:
    """Distribution -> installed version (None where it is not installed), in the order given."""
    out: dict[str, str | None] = {}
    for dist in dists:
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = None
    return out


def environment(dists: Iterable[str] = ("tinyt", "numpy", "onnxruntime"),
                **extra: Any) -> dict[str, Any]:
    """This machine and the versions of `dists`, plus `extra` (threads, providers, ...)."""
    return {"cpu": cpu_features(), "physical_cores": physical_cores(),
            "logical_cores": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "versions": versions(dists),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **extra}
