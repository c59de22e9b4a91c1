"""lab/pair_memory.py's `session` mode at the tiny model's size, each in a fresh process (as
the module asks: memory is read in the measuring process): one session on a tinyt artifact
with tinyt's options, on a GenAI-style directory with plain ones, and a directory that is
neither refused by name."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _session(directory: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lab.pair_memory", "session", str(directory),
                           "--threads", "1"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)


def test_session_memory_of_a_tinyt_graph_and_a_genai_directory(lm_onnx, tmp_path):
    from tinyt.export.optimize import optimize

    gqa = optimize(optimize(lm_onnx, tmp_path / "opt"), tmp_path / "gqa", target="gqa")
    genai = tmp_path / "genai"  # the same graph where a GenAI directory keeps it
    genai.mkdir()
    shutil.copy(gqa / "model.onnx", genai / "model.onnx")
    (genai / "genai_config.json").write_text("{}")
    for directory, options in ((gqa, "tinyt"), (genai, "plain")):
        run = _session(directory)
        assert run.returncode == 0, run.stderr
        r = json.loads(run.stdout)
        assert r["options"] == options
        assert r["graph_mb"] == round((directory / "model.onnx").stat().st_size / 1e6, 1)
        # a session (its thread pool, kernels, weights) adds resident memory over the imports,
        # and handing back the freed heap returns no more than the load added
        assert r["over_imports_mb"] > 0
        assert r["session_trimmed"]["rss"] <= r["session"]["rss"]
        assert r["over_imports_mb"] == round(r["session_trimmed"]["rss"]
                                             - r["imports"]["rss"], 1)


def test_session_memory_refuses_a_directory_that_is_no_artifact(tmp_path):
    run = _session(tmp_path)
    assert run.returncode != 0
    assert f"{tmp_path} has no manifest.json" in run.stderr
