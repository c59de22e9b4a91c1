"""Distribution layout, and README / CI agreement."""
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

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


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of the working tree's files (tracked, and untracked ones git does not
    ignore), built from a copy: a checkout's own build/ (setuptools' cache, which keeps
    modules since deleted) never reaches it."""
    import shutil

    out, src = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("src")
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard",
                             "-z"], capture_output=True, check=True, timeout=60).stdout
    for rel in filter(None, listed.decode().split("\0")):
        if (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "-q", "-w", str(out), str(src)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (path,) = out.glob("tinyt-*.whl")
    return path


def test_wheel_holds_every_floor(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    for must in ("tinyt/__init__.py", "tinyt/model.py", "tinyt/hf/catalogue.py",
                 "tinyt/export/__init__.py", "tinyt/export/web/__init__.py",
                 "tinyt/export/web/tinyt.mjs", "tinyt/export/web/tokenizer.mjs",
                 "tinyt/export/web/index.html",
                 "tinyt/runtime/__init__.py", "tinyt/benchmarks/harness.py",
                 "tinyt/benchmarks/peers/__init__.py", "tinyt/server/handlers.py", "tinyt/app/cli.py"):
        assert must in names, f"{must} missing from the wheel"
    top = ("export/", "runtime/", "tests/", "benchmarks/", "server/", "app/")
    assert not [n for n in names if n.startswith(top)]
    assert not [n for n in names if "/results/" in n]  # the evidence stays in the checkout
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert f"Version: {tinyt.__version__}" in meta
    assert "Provides-Extra: gpu" in meta and "Provides-Extra: cpu" in meta
    entry = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt")))
    assert b"tinyt = tinyt.__main__:entry" in entry


EDGE_SCRIPT = """
import importlib.util, json, sys
assert importlib.util.find_spec("torch") is None, "torch is installed in the edge venv"
import tinyt.runtime as rt
lm = rt.load(sys.argv[1])
print(json.dumps([r.token_ids for r in lm.generate_details(["def alpha", "import os"],
                                                            max_new_tokens=16)]))
from tinyt.manifest import toolkit_digest
print(toolkit_digest())
"""


@pytest.mark.slow
def test_edge_install_from_the_wheel_generates_without_torch(wheel, lm_onnx, tmp_path):
    """The built wheel with the 'cpu' extra, in a fresh virtual environment: no torch, the
    same tokens and the same toolkit digest as here. Its size on disk is what tinyt.app.footprint reports."""
    import json

    import tinyt.runtime as rt
    from tinyt.app.footprint import edge_footprint

    venv = tmp_path / "edge"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    proc = subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                           f"{wheel}[cpu]"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = subprocess.run([str(py), "-c", EDGE_SCRIPT, str(lm_onnx)], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)  # cwd: not the source tree
    assert proc.returncode == 0, proc.stderr[-3000:]
    here = [r.token_ids for r in rt.load(lm_onnx).generate_details(["def alpha", "import os"],
                                                                    max_new_tokens=16)]
    tokens, digest = proc.stdout.splitlines()
    assert json.loads(tokens) == here
    # an install hashes the same code as the checkout (its tinyt/ holds every floor's folder)
    from tinyt.manifest import toolkit_digest
    assert digest == toolkit_digest()
    site = next((venv / "lib").glob("python*/site-packages"))
    on_disk = sum(p.stat().st_size for p in site.rglob("*") if p.is_file())
    pip_itself = sum(p.stat().st_size for p in site.glob("pip*/**/*") if p.is_file())
    reported = edge_footprint()["total"]
    assert 0.7 < (on_disk - pip_itself) / reported < 1.3, (on_disk, pip_itself, reported)


@pytest.mark.slow
def test_tinyt_bench_runs_from_the_installed_wheel(wheel, tiny_ckpt, lm_onnx, tmp_path):
    """The wheel's own tinyt (installed into a directory of its own, first on the path, run
    outside the checkout) benchmarks a user's artifacts: the harness ships as tinyt.benchmarks."""
    import os
    target = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                           "--disable-pip-version-check", "--target", str(target), str(wheel)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    art = tmp_path / "art"
    art.mkdir()
    (art / "checkpoint").symlink_to(tiny_ckpt)
    (art / "onnx").symlink_to(lm_onnx)
    env = {**os.environ, "PYTHONPATH": str(target)}
    where = subprocess.run([sys.executable, "-c", "import tinyt.benchmarks.harness as h; "
                            "print(h.__file__)"], capture_output=True, text=True, env=env,
                           cwd=tmp_path)
    assert where.stdout.strip().startswith(str(target)), where.stdout + where.stderr
    proc = subprocess.run([sys.executable, "-m", "tinyt", "bench", "art", "--out", "results",
                           "--rounds", "1"], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "results" / "results.json").is_file()
    assert "results:" in proc.stdout
