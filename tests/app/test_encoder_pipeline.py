"""`tinyt pipeline --skip-train` on a sentence-encoder checkpoint (app/encoder_pipeline.py):
the encoder's rows (tinyt.artifacts.ENCODER_VARIANTS), verified, timed, reported, then skipped
when nothing changed; what does not apply is refused by name. A BertModel at
all-MiniLM-L6-v2's settings, 1 layer, random weights (the real model: tests/real)."""
import json

import pytest
from hf_fixtures import save_bert

from tinyt.app.pipeline import pipeline
from tinyt.artifacts import ENCODER_VARIANTS, made_by, rows_for
from tinyt.errors import CheckpointError, DataError


@pytest.fixture(scope="module")
def encoder_ckpt(tmp_path_factory):
    from tinyt.hf import import_hf
    root = tmp_path_factory.mktemp("enc")
    save_bert(root / "st", num_hidden_layers=1)
    import_hf(root / "st", root / "ckpt")
    return root / "ckpt"


def test_rows_follow_the_checkpoints_kind():
    assert rows_for("encoder") == ENCODER_VARIANTS
    assert [v.dir for v in ENCODER_VARIANTS] == ["onnx", "onnx-opt", "onnx-int8"]
    assert all(v.kind == "encoder" and v.made_by == "pipeline" for v in ENCODER_VARIANTS)
    assert rows_for("decoder_with_past") == made_by("pipeline")
    with pytest.raises(ValueError, match="not a classifier"):
        rows_for("classifier")


@pytest.mark.slow
def test_encoder_pipeline_builds_verifies_times_reports_then_skips(encoder_ckpt, tmp_path):
    out, logs = tmp_path / "run", []
    report = pipeline(out, skip_train=encoder_ckpt, bench=True, log=logs.append)
    made = {p.name for p in out.iterdir() if (p / "manifest.json").is_file()}
    assert made == {"onnx", "onnx-opt", "onnx-int8"}  # no static INT8, no decoder rows
    for d in ("onnx", "onnx-opt"):
        assert json.loads((out / f"{d}-verify.json").read_text())["passed"], d
    accuracy = json.loads((out / "onnx-int8" / "manifest.json").read_text())["accuracy"]
    assert accuracy["queries"] == 50 and accuracy["passages"] == 500
    timed = json.loads((out / "bench" / "encoder.json").read_text())
    assert [r["variant"] for r in timed["rows"]] == ["onnx", "onnx-opt", "onnx-int8"]
    assert all(r["texts_per_s"] > 0 and r["one_text_ms"] > 0 for r in timed["rows"])
    text = report.read_text()
    assert text.count("verified vs PyTorch") == 2 and "| onnx-int8 |" in text
    assert f"{accuracy['recall_at_10']:.3f}" in text and accuracy["set_digest"] in text
    assert "Not built: static INT8" in text and "texts/s" in text
    logs.clear()
    pipeline(out, skip_train=encoder_ckpt, bench=False, log=logs.append)
    assert sum("up to date" in line for line in logs) == 3 and "--no-bench" in logs[-1]
    assert "Speed: not measured (--no-bench)." in (out / "report.md").read_text()


def test_what_does_not_apply_to_an_encoder_is_refused(encoder_ckpt, tmp_path):
    from tinyt.hf import import_hf
    with pytest.raises(DataError, match="--data corpus.txt: .* sentence encoder"):
        pipeline(tmp_path / "run", skip_train=encoder_ckpt, data="corpus.txt", bench=False)
    save_bert(tmp_path / "clf", num_hidden_layers=1, sentence=False, head="sequence")
    import_hf(tmp_path / "clf", tmp_path / "clf-ckpt")
    with pytest.raises(CheckpointError, match="is a classifier checkpoint: the pipeline takes"):
        pipeline(tmp_path / "run", skip_train=tmp_path / "clf-ckpt", bench=False)
    assert not (tmp_path / "run").exists()
