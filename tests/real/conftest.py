"""The real models (scripts/setup-real.sh builds them): SmolLM2-135M-Instruct as a Llama
directory from its Q4_1 GGUF, and the all-MiniLM-L6-v2 sentence-transformers directory. Tests
here are marked `real`; without the directories they skip, naming the command that makes them
(CI runs it: .ci/run)."""
from __future__ import annotations

import os
import subprocess
import sys
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


def _main_job(model_dir: Path, work: Path) -> subprocess.CompletedProcess:
    """`tinyt import-hf MODEL WORK/checkpoint`, then `tinyt pipeline --skip-train
    WORK/checkpoint --out WORK/out --no-bench`, each as a user runs it: the pipeline's run."""
    tinyt = [sys.executable, "-m", "tinyt"]
    done = subprocess.run([*tinyt, "import-hf", model_dir, work / "checkpoint"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return subprocess.run([*tinyt, "pipeline", "--skip-train", work / "checkpoint", "--out",
                           work / "out", "--no-bench"], capture_output=True, text=True)


@pytest.fixture(scope="session")
def main_job():
    """The function that runs import-hf and the main job on a model directory."""
    return _main_job


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    return _real("smollm2", "config.json")


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The Q4_1 GGUF file itself (what smollm2_dir was made from)."""
    from tests.real.build import GGUF

    return _real("gguf", GGUF) / GGUF


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    return _real("minilm", "modules.json")
