"""The code checks CI runs with the suite: ruff's lint over the tree and mypy over the torch-free
modules (both configured in pyproject.toml; the dev extra installs them)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def test_ruff_finds_nothing():
    proc = check("ruff", "check", ".")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_mypy_passes_on_the_torch_free_modules():
    proc = check("mypy")
    assert proc.returncode == 0 and "Success" in proc.stdout, proc.stdout[-4000:] + proc.stderr
