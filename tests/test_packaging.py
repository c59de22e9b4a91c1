"""Distribution layout, and README / CI agreement."""
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import tinyt

ROOT = Path(__file__).resolve().parents[1]


def readme_command(label: str) -> str:
    """The one-line shell command under README's '<!-- label -->' marker."""
    text = (ROOT / "README.md").read_text()
    m = re.search(rf"<!-- {label} -->\s*```(?:bash|sh)?\n(.+?)\n```", text, re.S)
    assert m, f"README.md has no '<!-- {label} -->' command block"
    return m.group(1).strip()


def test_ci_runs_the_readme_test_command():
    command = readme_command("test-command")
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert command in ci, f".ci/run does not run README's test command: {command}"


def test_readme_main_job_runs_the_pipeline_and_the_runtime():
    command = readme_command("main-job")
    for verb in ("scripts/setup.sh", "tinyt pipeline --out artifacts", "tinyt generate"):
        assert verb in command


def test_wheel_holds_the_three_packages(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "-q", "-w", str(tmp_path), str(ROOT)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = tmp_path.glob("tinyt-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for must in ("tinyt/__init__.py", "tinyt/model.py", "tinyt/export/__init__.py",
                 "tinyt/runtime/__init__.py"):
        assert must in names, f"{must} missing from the wheel"
    assert not [n for n in names if n.startswith(("export/", "runtime/", "tests/"))]
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert f"Version: {tinyt.__version__}" in meta
    assert "Provides-Extra: gpu" in meta and "Provides-Extra: cpu" in meta
    entry = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt")))
    assert b"tinyt = tinyt.cli:main" in entry
