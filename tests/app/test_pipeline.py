import json
from pathlib import Path

import pytest

from tinyt.app.pipeline import pipeline
from tinyt.artifacts import made_by
from tinyt.manifest import fresh


@pytest.mark.slow
def test_pipeline_runs_every_stage_then_skips_them(corpus_dir, tmp_path):
    out = tmp_path / "run"
    logs: list[str] = []
    # bench=False: the README test runs the main job with its benchmark and checks the report
    report = pipeline(out, preset="test", data=str(corpus_dir), bench=False, log=logs.append)
    for sub in ("checkpoint", "onnx", "onnx-opt", "onnx-int8", "onnx-int8-qgemm",
                "onnx-int8-gqa", "onnx-int8-rows", "onnx-int8-rows-gqa"):
        assert (out / sub).is_dir(), sub
    made = {p.name for p in out.iterdir() if (p / "manifest.json").is_file()}
    assert made == {v.dir for v in made_by("pipeline")}  # exactly the catalogue's rows
    assert json.loads((out / "onnx-verify.json").read_text())["passed"]
    assert json.loads((out / "onnx-opt-verify.json").read_text())["passed"]
    text = report.read_text()
    assert "| onnx-int8 |" in text and "verified vs PyTorch" in text
    assert "| onnx-int8-gqa |" in text and "checked vs onnx-int8 |" in text
    assert "| onnx-int8-rows-gqa |" in text and "checked vs onnx-int8-rows |" in text
    assert json.loads((out / "onnx-int8-gqa" / "manifest.json").read_text())["graph"] == \
        "decoder_gqa"
    assert "edge install (tinyt[cpu], no torch):" in text and "onnxruntime" in text
    assert "- onnx-int8-static: not built by `tinyt pipeline`: static (QDQ) INT8" in text
    assert not (out / "onnx-int8-static").exists()
    # tinyt's own trained model has no outlier channels: every gated row's first options hold
    assert not (out / "rejected").exists() and "not kept" not in text and "made with" not in text
    assert json.loads((out / "onnx-int8" / "manifest.json").read_text())["options"]["mode"] == \
        "dynamic"
    assert fresh(out / "onnx", out / "checkpoint") and fresh(out / "onnx-opt", out / "onnx")

    logs.clear()
    pipeline(out, preset="test", data=str(corpus_dir), bench=False, log=logs.append)
    assert "[train] finished run" in logs[0]
    # export, optimize, 3 × quantize, 2 × shared-cache
    assert sum("up to date" in line for line in logs) == 7
    assert not any("running" in line for line in logs)


@pytest.mark.slow
def test_changed_input_reruns_the_stages_after_it(corpus_dir, tmp_path, tiny_ckpt):
    import shutil
    out = tmp_path / "run"
    ck = tmp_path / "ck"
    shutil.copytree(tiny_ckpt, ck)
    logs: list[str] = []
    pipeline(out, skip_train=ck, data=str(corpus_dir), bench=False, log=logs.append)
    meta = json.loads((ck / "config.json").read_text())
    meta["metrics"]["note"] = "changed"  # the checkpoint's config changes: export must rerun
    (ck / "config.json").write_text(json.dumps(meta))
    logs.clear()
    pipeline(out, skip_train=ck, data=str(corpus_dir), bench=False, log=logs.append)
    assert "[export] running" in "\n".join(logs)
    assert not fresh(out / "onnx", tmp_path / "nothing")


@pytest.mark.slow
def test_other_tinyt_code_reruns_every_stage(corpus_dir, tmp_path, tiny_ckpt, monkeypatch):
    out = tmp_path / "run"
    pipeline(out, skip_train=tiny_ckpt, data=str(corpus_dir), bench=False, log=lambda s: None)
    assert fresh(out / "onnx-opt", out / "onnx")
    import tinyt.manifest
    monkeypatch.setattr(tinyt.manifest, "toolkit_digest", lambda: "an upgraded tinyt")
    assert not fresh(out / "onnx", tiny_ckpt) and not fresh(out / "onnx-opt", out / "onnx")


def test_the_catalogue_names_each_variant_once_after_its_sources():
    """tinyt.artifacts: every row is made from a checkpoint or an earlier row, its options are
    the stage's keywords, and the labels the harness reports it under are unique (the peers'
    engine names: tests/benchmarks/test_peers.py)."""
    from tinyt.artifacts import CHECKPOINTS, STAGES, VARIANTS, arguments, variant

    seen: list[str] = []
    for v in VARIANTS:
        assert v.stage in STAGES, v
        assert all(d in seen or d in CHECKPOINTS for d in v.inputs), (v.dir, v.inputs, seen)
        assert v.dir not in seen, v.dir
        seen.append(v.dir)
    for key in ("bench", "step"):
        names = [getattr(v, key) for v in VARIANTS if getattr(v, key) is not None]
        assert len(names) == len(set(names)), key
    assert all(v.bench for v in VARIANTS if v.timed)
    assert {v.made_by for v in VARIANTS} == {"pipeline", "peers", "hand"}
    pair = variant("onnx-int8-gqa")
    source, out, options = arguments(pair, Path("/a"), checkpoint=Path("/ck"), data="d")
    assert (source, out) == (Path("/a/onnx-int8"), Path("/a/onnx-int8-gqa"))
    assert options == {"target": "gqa", "prefill_from": Path("/a/onnx-int8-qgemm")}
    assert arguments(variant("onnx"), Path("/a"), checkpoint=Path("/ck"))[0] == Path("/ck")
    assert arguments(variant("onnx-int8"), Path("/a"), data="d")[2] == {"data": "d"}
    assert all(v.source != "clf" for v in made_by("pipeline"))
    with pytest.raises(ValueError, match="no artifact variant 'onnx-fp8'; known: onnx, "):
        variant("onnx-fp8")


@pytest.mark.slow
def test_a_gated_row_beyond_the_budget_is_set_aside(corpus_dir, tmp_path, tiny_ckpt,
                                                     monkeypatch):
    """A row marked gated (the int8-GEMM graph with one activation scale per tensor) is kept
    only when its own accuracy report is within the budget; otherwise it moves under
    OUT/rejected, the pair runs prompts on its step graph, and the report says why."""
    import tinyt.app.pipeline as P

    monkeypatch.setattr(P, "INT8_PERPLEXITY_BUDGET", -1.0)  # nothing can be within it
    out, logs = tmp_path / "run", []
    report = pipeline(out, skip_train=tiny_ckpt, data=str(corpus_dir), bench=False,
                      log=logs.append)
    assert not (out / "onnx-int8-qgemm").exists()
    # onnx-int8 has a fallback: made again with fp32 products, and kept
    made = json.loads((out / "onnx-int8" / "manifest.json").read_text())
    assert made["options"]["mode"] == "weight-only"
    assert (out / "rejected" / "onnx-int8-qgemm" / "manifest.json").is_file()
    pair = json.loads((out / "onnx-int8-gqa" / "manifest.json").read_text())
    assert "prefill_model_file" not in pair and not (out / "onnx-int8-gqa" / "prefill.onnx").exists()
    # the pair's report is its own (through the runtime), its step graph's kept beside it
    assert pair["accuracy"]["measured_on"].startswith("this artifact")
    assert pair["source_accuracy"] == json.loads(
        (out / "onnx-int8" / "manifest.json").read_text())["accuracy"]
    text = report.read_text()
    assert "| onnx-int8-qgemm | — | — | — | — | not kept: perplexity " in text
    assert "beyond the +-100.0% an INT8 artifact may cost" in text
    assert "- onnx-int8: made with {'mode': 'weight-only'} — with its first options it was " \
        "perplexity" in text
    rows = json.loads((out / "onnx-int8-rows" / "manifest.json").read_text())["options"]
    assert (rows["kernel"], rows["mode"]) == ("nbits", "weight-only")  # its fallback,
    assert "[onnx-int8-rows] the same stage as onnx-int8: copied" in logs  # onnx-int8's own
    logs.clear()
    report = pipeline(out, skip_train=tiny_ckpt, data=str(corpus_dir), bench=False,
                      log=logs.append)
    assert any("[quantize-qgemm] up to date, not kept" in line for line in logs), logs
    assert not any("running" in line for line in logs), logs
    assert "- onnx-int8: made with {'mode': 'weight-only'}" in report.read_text()  # again
    monkeypatch.setattr(P, "INT8_PERPLEXITY_BUDGET", 10.0)  # now within: made and kept again
    logs.clear()
    pipeline(out, skip_train=tiny_ckpt, data=str(corpus_dir), bench=False, log=logs.append)
    assert (out / "onnx-int8-qgemm" / "manifest.json").is_file()
    assert (out / "onnx-int8-gqa" / "prefill.onnx").is_file()  # the pair made again with it
    made = json.loads((out / "onnx-int8" / "manifest.json").read_text())
    assert made["options"]["mode"] == "dynamic"  # its first options back in their place
    assert not (out / "rejected" / "onnx-int8").exists()
