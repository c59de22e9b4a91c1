"""lab/attention_kernels.py at a small shape: each form checked against float64 numpy before
it is timed."""
import json
import sys

import pytest

from lab import attention_kernels as ak


def test_attention_kernels_check_each_form_against_the_reference(tmp_path, monkeypatch):
    """Each attention form is the same attention as float64 numpy before it is timed; a form
    that is not (here: a reference shifted by 0.01) stops the run before any timing."""
    argv = ["attention_kernels", "--heads", "4", "--kv-heads", "2", "--head-dim", "32",
            "--past", "70", "--rounds", "2", "--n-layer", "3", "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", argv)
    ak.main()
    got = json.loads((tmp_path / "results.json").read_text())
    assert [r["kernel"] for r in got["kernels"]] == list(ak.KINDS)
    for r in got["kernels"]:
        assert 0 <= r["error"] <= r["bound"] < 1e-3
        assert r["ms_step"] == pytest.approx(3 * r["ms_layer"])
    assert got["kv_bytes_layer"] == 2 * 2 * 71 * 32 * 4
    real = ak.reference
    monkeypatch.setattr(ak, "reference", lambda *a: real(*a) + 0.01)
    with pytest.raises(SystemExit, match="gqa-fp32 differs from the reference"):
        ak.main()
