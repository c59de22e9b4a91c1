"""Data-parallel training (torchrun, gloo on CPU) does what DDP promises: each rank takes its
half of the global batch, and the gradients every rank steps with are the average of the
halves', i.e. the single-process gradients of the whole batch."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

WORKER = str(Path(__file__).resolve().parents[1] / "ddp_worker.py")
# The tolerance, from the arithmetic. float32 rounds each operation by at most u = 2^-24 (6e-8).
# A gradient entry of the test preset passes through sums of at most a few thousand terms (the
# batch's 8 x 32 positions, 512 vocabulary logits, 128-wide MLP rows, forward and backward
# through 2 layers), and the two runs sum in different orders: one process, or two halves and
# an all-reduce, with matmul kernels that block by the batch size and differ between CPU kinds.
# The worst case of such a reordering is ~n·u ≈ 2.4e-4 of the summands' size; errors of random
# sign grow like sqrt(n)·u ≈ 4e-6 (measured: 6.5e-7 at worst, Intel Xeon with AMX). GRAD_RTOL
# sits between, relative to each tensor's largest gradient. A DDP fault is off by O(1): a rank
# stepping with its own half, the sum instead of the mean, the same half on both ranks.
GRAD_RTOL = 1e-4
# After 6 AdamW steps the weights differ by chip where a gradient is near AdamW's eps (1e-8),
# whose update lr·g/(|g|+eps) turns a rounding difference into up to ~lr: the weights cannot be
# compared tightly (3e-5 seen on AMX). Those weights carry gradients ~eps, so they move the
# loss by at most ~n_params·eps·lr ≈ 4e4 x 1e-8 x 3e-3 ≈ 1e-6.
LOSS_ATOL = 1e-4


def run(args):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_two_process_ddp_steps_with_the_single_process_gradients(corpus_dir, tmp_path):
    common = ["train", "--preset", "test", "--data", str(corpus_dir), "--max-steps", "6",
              "--eval-interval", "3", "--batch-size", "8"]
    run([sys.executable, WORKER, tmp_path / "single.grads", *common,
         "--out", tmp_path / "single"])
    proc = run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node", "2", WORKER, tmp_path / "ddp.grads", *common,
                "--out", tmp_path / "ddp"])
    assert proc.stderr.count("model:") == 1  # only rank 0 reports
    a, b = (load_file(str(tmp_path / f"{d}.grads")) for d in ("single", "ddp"))
    assert a.keys() == b.keys() and len(a) > 0
    for k in a:
        assert a[k].shape == b[k].shape, f"{k}: shape {tuple(a[k].shape)} != {tuple(b[k].shape)}"
        scale = float(a[k].abs().max())
        assert scale > 0, f"{k}: no gradient in the single-process run"
        worst = float((a[k] - b[k]).abs().max())
        assert worst <= GRAD_RTOL * scale, \
            f"{k}: first-step gradient, single vs DDP: max abs diff {worst:.3g} > " \
            f"{GRAD_RTOL} x {scale:.3g}"
    ma, mb = (json.loads((tmp_path / d / "config.json").read_text())["metrics"]
              for d in ("single", "ddp"))
    assert ma["step"] == mb["step"] == 6
    assert abs(ma["val_loss"] - mb["val_loss"]) <= LOSS_ATOL, (ma["val_loss"], mb["val_loss"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ddp", "ddp.grads", "single",
                                                          "single.grads"]


def test_ddp_batch_must_split_evenly(corpus_dir, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "tinyt", "train", "--preset", "test", "--data", str(corpus_dir),
         "--batch-size", "5", "--out", str(tmp_path / "x")],
        capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert proc.returncode != 0
    assert "batch_size=5 must be divisible by the 2 data-parallel processes" in proc.stderr
    assert not (tmp_path / "x").exists()
