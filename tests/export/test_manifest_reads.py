"""The artifact handle every stage and the runtime share (tinyt.manifest.Artifact): its manifest
read once into a typed value, every file of a stage's source hashed once per stage (before, a
stage hashed its source twice, and `quantize --max-loss-increase` twice per variant tried), and
manifests written before the typed form read as they always did."""
from collections import Counter
from pathlib import Path

import pytest

import tinyt.manifest as M
from tinyt.errors import ManifestError
from tinyt.manifest import Manifest, load_manifest, open_artifact_dir


@pytest.fixture()
def hashes(monkeypatch):
    """Every sha256 taken of a file, by path."""
    seen: Counter = Counter()
    real = M.sha256_file

    def counted(path):
        seen[Path(path).resolve()] += 1
        return real(path)

    monkeypatch.setattr(M, "sha256_file", counted)
    return seen


def _source_files(directory: Path) -> set[Path]:
    return {(directory / name).resolve() for name in load_manifest(directory, check=False).files}


def test_optimize_and_quantize_hash_each_source_file_once(lm_onnx, tmp_path, hashes):
    from tinyt.export.optimize import optimize
    from tinyt.export.quantize import quantize

    opt = optimize(lm_onnx, tmp_path / "opt", target="cpu")
    src = _source_files(lm_onnx)
    assert src and all(hashes[f] == 1 for f in src), {f.name: hashes[f] for f in src}
    hashes.clear()
    quantize(opt, tmp_path / "int8", bits=8)
    src = _source_files(opt)
    assert all(hashes[f] == 1 for f in src), {f.name: hashes[f] for f in src}


def test_the_search_hashes_its_source_once_for_every_variant(lm_onnx, tmp_path, hashes,
                                                             corpus_dir):
    from tinyt.export.optimize import optimize
    from tinyt.export.search import quantize_search

    opt = optimize(lm_onnx, tmp_path / "opt", target="cpu")
    hashes.clear()
    out = quantize_search(opt, tmp_path / "best", max_loss_increase=0.5, data=str(corpus_dir))
    assert len(out.manifest["search"]["tried"]) > 2
    src = _source_files(opt)
    assert all(hashes[f] == 1 for f in src), {f.name: hashes[f] for f in src}


def test_a_manifest_of_an_older_stage_reads_as_before():
    """A quantize manifest from before the recipe was recorded (options only), a pair whose
    prompt graph's report sits in its lineage, and a graph without model_file."""
    old = {"format": "tinyt-artifact", "stage": "quantize", "toolkit": "x",
           "files": {"model.onnx": {"sha256": "0" * 64, "bytes": 10}},
           "source": {"kind": "artifact", "path": "/a"},
           "options": {"bits": 8, "block_size": 32, "mode": "dynamic", "exclude": []},
           "graph": "decoder_with_past", "quantization": {"rows_independent": True}}
    m = Manifest.from_dict(old)
    assert m.graph == "decoder_with_past" and m.model_file == "model.onnx"
    assert m.recipe is not None and m.recipe.bits == 8 and m.recipe.block_size == 32
    assert m.prefill_model_file is None and m.fixed_shape is None and m.versions == {}
    pair = Manifest.from_dict({**old, "stage": "shared-cache", "options": {"level": "all"},
                               "prefill_model_file": "prefill.onnx",
                               "prefill_source": {"manifest": {"accuracy": {"kl": 1}}}})
    assert pair.prefill_accuracy == {"kl": 1} and pair.recipe is None
    with pytest.raises(KeyError, match="not a manifest record"):
        m.record("grpah")
    with pytest.raises(ManifestError, match="not a tinyt artifact manifest"):
        Manifest.from_dict({"format": "other", "files": {}})
    with pytest.raises(ManifestError, match="lacks its sha256"):
        Manifest.from_dict({**old, "files": {"model.onnx": {"bytes": 1}}})


def test_the_runtime_and_the_stages_open_one_kind_of_handle(lm_onnx):
    from tinyt.export.stage import open_source
    from tinyt.runtime.session import open_artifact

    a, b = open_artifact(lm_onnx), open_source(lm_onnx)
    assert type(a) is type(b) is M.Artifact
    assert a.manifest == b.manifest and a.kind == b.kind == a.manifest.graph
    assert open_artifact_dir(lm_onnx, check=False).config == a.config
