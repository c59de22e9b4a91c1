"""Data-parallel training (torchrun, gloo on CPU) equals single-process training on the same
global batch: each rank takes its half of the batch and DDP averages the gradients."""
import json
import os
import subprocess
import sys

from safetensors.torch import load_file

from conftest import assert_close

DDP_TOL = 1e-5  # float summation order differs between one process and an all-reduce


def run(args, env_extra=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_extra or {})}
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_two_process_ddp_equals_single_process(corpus_dir, tmp_path):
    common = ["train", "--preset", "test", "--data", str(corpus_dir), "--max-steps", "6",
              "--eval-interval", "3", "--batch-size", "8"]
    run([sys.executable, "-m", "tinyt", *common, "--out", str(tmp_path / "single")])
    proc = run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node", "2", "-m", "tinyt", *common, "--out", str(tmp_path / "ddp")])
    assert proc.stderr.count("model:") == 1  # only rank 0 reports
    a = load_file(str(tmp_path / "single" / "model.safetensors"))
    b = load_file(str(tmp_path / "ddp" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        assert_close(a[k], b[k], DDP_TOL, f"{k}: single vs DDP")
    ma, mb = (json.loads((tmp_path / d / "config.json").read_text())["metrics"]
              for d in ("single", "ddp"))
    assert ma["step"] == mb["step"] == 6
    assert abs(ma["val_loss"] - mb["val_loss"]) < 1e-4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ddp", "single"]


def test_ddp_batch_must_split_evenly(corpus_dir, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "tinyt", "train", "--preset", "test", "--data", str(corpus_dir),
         "--batch-size", "5", "--out", str(tmp_path / "x")],
        capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert proc.returncode != 0
    assert "batch_size=5 must be divisible by the 2 data-parallel processes" in proc.stderr
    assert not (tmp_path / "x").exists()
