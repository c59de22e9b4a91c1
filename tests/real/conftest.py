"""The real models (scripts/setup-real.sh builds them): SmolLM2-135M-Instruct as a Llama
directory from its Q4_1 GGUF, and the all-MiniLM-L6-v2 sentence-transformers directory. Tests
here are marked `real`; without the directories they skip, naming the command that makes them
(CI runs it: .ci/run)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REAL_MODELS = Path(os.environ.get("TINYT_REAL_MODELS", Path.home() / ".cache/tinyt/real"))


def _real(name: str, marker: str) -> Path:
    path = REAL_MODELS / name
    if not (path / marker).is_file():
        pytest.skip(f"{path} is missing: run `bash scripts/setup-real.sh` (TINYT_REAL_MODELS "
                    "names another cache)")
    return path


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.real)


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    return _real("smollm2", "config.json")


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    return _real("minilm", "modules.json")
