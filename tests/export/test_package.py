"""tinyt package: .ort + operator list, pinned shapes, Triton model repository."""
import json

import numpy as np
import onnx
import pytest
from conftest import run_tinyt

import tinyt.runtime as rt
from tinyt.export import export_onnx, verify
from tinyt.export.optimize import optimize
from tinyt.export.package import PackageError, package
from tinyt.export.triton import TritonError, check_config
from tinyt.manifest import ManifestError, check_manifest

PROMPTS = ["def alpha", "import os\n", "    return "]


@pytest.fixture(scope="module")
def lm_opt(lm_onnx, tmp_path_factory):
    return optimize(lm_onnx, tmp_path_factory.mktemp("pkg") / "opt")


@pytest.fixture(scope="module")
def clf_onnx(tiny_clf, tmp_path_factory):
    return export_onnx(tiny_clf, tmp_path_factory.mktemp("pkg") / "clf")


def greedy(path, prompts=PROMPTS, n=12):
    return [r.token_ids for r in rt.load(path).generate_details(prompts, max_new_tokens=n)]


def operators(config_text: str) -> set[tuple[str, str]]:
    """(domain, op) pairs listed in a required_operators.config."""
    out = set()
    for line in config_text.splitlines():
        if line and not line.startswith("#"):
            domain, _, ops = line.split(";")
            out |= {(domain, op) for op in ops.split(",")}
    return out


def test_ort_format_loads_in_the_runtime_and_matches_the_onnx(lm_opt, tmp_path):
    out = package(lm_opt, tmp_path / "ort", format="ort")
    manifest = check_manifest(out)
    assert set(manifest["files"]) == {"model.ort", "required_operators.config", "config.json",
                                      "tokenizer.json", "generation_config.json",
                                      "genai_config.json"}
    assert manifest["model_file"] == "model.ort" and manifest["package_format"] == "ort"
    worst = manifest["equivalence"]["ort_vs_onnx"].values()
    assert all(w["max_abs"] <= w["bound"] < 1e-3 for w in worst)
    # the tied matrix still stored once: the .ort grows by less than one more copy of it
    cfg = json.loads((lm_opt / "config.json").read_text())["tinyt"]["model"]
    tied_bytes = 4 * cfg["vocab_size"] * cfg["n_embd"]
    growth = (out / "model.ort").stat().st_size - (lm_opt / "model.onnx").stat().st_size
    assert growth < tied_bytes, (growth, tied_bytes)
    lm = rt.load(out)
    assert lm.artifact.model_file == "model.ort"
    assert lm.session._model_path.endswith("model.ort")
    assert greedy(out) == greedy(lm_opt)
    # the operator list names what the saved graph runs: the fused contrib ops among them
    ops = operators((out / "required_operators.config").read_text())
    assert ("com.microsoft", "MultiHeadAttention") in ops and ("ai.onnx", "Split") in ops
    graph = onnx.load(str(lm_opt / "model.onnx")).graph
    assert {n.op_type for n in graph.node} <= {op for _, op in ops}


def test_ort_format_of_a_portable_graph_keeps_standard_ops(lm_onnx, tmp_path):
    portable = optimize(lm_onnx, tmp_path / "portable", target="portable", level="basic")
    out = package(portable, tmp_path / "ort", format="ort")
    ops = operators((out / "required_operators.config").read_text())
    assert ops and {d for d, _ in ops} == {"ai.onnx"}
    assert greedy(out) == greedy(portable)


def test_pinned_decoder_is_static_verified_and_generates_the_same(lm_opt, tiny_ckpt,
                                                                   tmp_path):
    out = package(lm_opt, tmp_path / "fixed", format="onnx",
                  fixed=["batch_size=2", "sequence_length=1", "past_sequence_length=31"])
    graph = onnx.load(str(out / "model.onnx")).graph
    for vi in [*graph.input, *graph.output]:
        dims = vi.type.tensor_type.shape.dim
        assert all(d.HasField("dim_value") for d in dims), vi.name
    assert [d.dim_value for d in graph.input[3].type.tensor_type.shape.dim] == [2, 2, 31, 16]
    assert [d.dim_value for d in graph.output[0].type.tensor_type.shape.dim] == [2, 1, 300]
    report = verify(tiny_ckpt, out)  # PyTorch vs the pinned graph, greedy included
    assert report["passed"], report["failures"]
    assert report["fixed_shape"] == {"batch_size": 2, "sequence_length": 1,
                                     "past_sequence_length": 31}
    assert all(g["identical"] and g["tokens"] > 0 for g in report["generation"])
    assert greedy(out, PROMPTS[:2], 20) == greedy(lm_opt, PROMPTS[:2], 20)
    lm = rt.load(out)
    assert lm.context == 32
    with pytest.raises(ValueError, match="pinned to batch_size 2"):
        lm.generate(PROMPTS)


def test_pinned_chunks_of_several_tokens(lm_onnx, tmp_path):
    """sequence_length 4: prompts go in left-padded chunks, each decode step is one token and
    three empty slots; the tokens are those of the dynamic graph."""
    out = package(lm_onnx, tmp_path / "fixed", format="onnx",
                  fixed=["batch_size=1", "sequence_length=4", "past_sequence_length=20"])
    for prompt in PROMPTS:
        assert greedy(out, [prompt], 8) == greedy(lm_onnx, [prompt], 8)
    result = rt.load(out).generate_details(["def alpha"], max_new_tokens=100)[0]
    assert result.finish_reason == "context"
    assert len(rt.load(out).tokenizer.encode("def alpha")) + len(result.token_ids) == 21


@pytest.mark.slow
def test_pinned_no_cache_decoder_and_classifier(tiny_ckpt, tiny_clf, clf_onnx, tmp_path):
    no_cache = export_onnx(tiny_ckpt, tmp_path / "nocache", with_past=False)
    out = package(no_cache, tmp_path / "nocache-fixed", format="onnx",
                  fixed=["batch_size=1", "sequence_length=32"])
    assert verify(tiny_ckpt, out)["passed"]
    assert greedy(out, PROMPTS[:1], 10) == greedy(no_cache, PROMPTS[:1], 10)
    clf = package(clf_onnx, tmp_path / "clf-fixed", format="onnx",
                  fixed=["batch_size=2", "sequence_length=32"])
    assert verify(tiny_clf, clf)["passed"]
    texts = ["x = sum(sum_1, 2)\n", "y = join(join_3, 4)\n", "z = sum(1, 2)\n"]
    ours, ref = rt.load(clf).classify(texts), rt.load(clf_onnx).classify(texts)
    for a, b in zip(ours, ref):
        assert a.label == b.label
        assert np.allclose(list(a.probabilities.values()), list(b.probabilities.values()),
                           atol=1e-5)


def _triton_config(out, name):
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    return text_format.Parse((out / name / "config.pbtxt").read_text(),
                             model_config_pb2.ModelConfig())


def test_triton_repository_for_the_kv_cache_decoder(lm_opt, tiny_ckpt, tmp_path):
    pytest.importorskip("tritonclient.grpc", reason="the triton extra is not installed")
    out = package(lm_opt, tmp_path / "repo", format="triton", name="tiny-lm")
    assert (out / "tiny-lm" / "1" / "model.onnx").is_file()
    config = _triton_config(out, "tiny-lm")
    assert config.name == "tiny-lm" and config.platform == "onnxruntime_onnx"
    assert config.max_batch_size == 0 and not config.HasField("dynamic_batching")
    graph = onnx.load(str(out / "tiny-lm" / "1" / "model.onnx")).graph
    assert [i.name for i in config.input] == [i.name for i in graph.input]
    assert [o.name for o in config.output] == [o.name for o in graph.output]
    assert list(config.input[3].dims) == [-1, 2, -1, 16]
    assert list(config.output[0].dims) == [-1, -1, 300]
    assert config.instance_group[0].kind == config.instance_group[0].KIND_CPU
    assert verify(tiny_ckpt, out)["passed"]  # the repository's graph, through its manifest
    with pytest.raises(ManifestError, match="Triton model repository"):
        rt.load(out)


def test_triton_repository_batches_the_classifier_on_gpu_instances(clf_onnx, tmp_path):
    pytest.importorskip("tritonclient.grpc", reason="the triton extra is not installed")
    out = package(clf_onnx, tmp_path / "repo", format="triton", device="gpu", instances=2,
                  max_batch_size=16)
    name = check_manifest(out)["triton"]["model"]
    config = _triton_config(out, name)
    assert config.max_batch_size == 16 and config.HasField("dynamic_batching")
    assert [(t.name, list(t.dims)) for t in config.input] == [("input_ids", [-1]),
                                                              ("attention_mask", [-1])]
    assert [(t.name, list(t.dims)) for t in config.output] == [("logits", [2])]
    group = config.instance_group[0]
    assert group.kind == group.KIND_GPU and group.count == 2


def test_triton_config_that_disagrees_with_the_graph_is_refused(clf_onnx):
    pytest.importorskip("tritonclient.grpc", reason="the triton extra is not installed")
    graph = onnx.load(str(clf_onnx / "model.onnx")).graph
    good = ('name: "c" platform: "onnxruntime_onnx" max_batch_size: 8 '
            'input [ { name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] }, '
            '{ name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] } ] '
            'output [ { name: "logits" data_type: TYPE_FP32 dims: [ 2 ] } ]')
    check_config(good, graph)
    with pytest.raises(TritonError, match="outputs"):
        check_config(good.replace("dims: [ 2 ]", "dims: [ 3 ]"), graph)
    with pytest.raises(TritonError, match="inputs"):
        check_config(good.replace("TYPE_INT64", "TYPE_INT32", 1), graph)
    with pytest.raises(TritonError, match="does not parse"):
        check_config(good.replace("max_batch_size", "max_batch"), graph)


@pytest.mark.parametrize("kw,needle", [
    (dict(format="tflite"), "format='tflite' is not one of onnx, ort, triton"),
    (dict(fixed=["batch=1"]), "axis 'batch' is not one of"),
    (dict(fixed=["batch_size:1"]), "is not AXIS=N"),
    (dict(fixed=["batch_size=1"]), "pins exactly batch_size, sequence_length, past"),
    (dict(fixed=["batch_size=0", "sequence_length=1", "past_sequence_length=3"]), "too small"),
    (dict(fixed=["batch_size=1", "sequence_length=30", "past_sequence_length=3"]),
     "exceeds the model's block_size 32"),
    (dict(format="triton", name="a/b"), "name='a/b'"),
    (dict(format="triton", device="tpu"), "device='tpu' is not one of cpu, gpu"),
])
def test_bad_requests_write_nothing(lm_opt, tmp_path, kw, needle):
    with pytest.raises(PackageError if "device" not in kw else TritonError, match=needle):
        package(lm_opt, tmp_path / "out", **kw)
    assert not (tmp_path / "out").exists()


def test_cli_package(lm_opt, tmp_path):
    r = run_tinyt("package", lm_opt, tmp_path / "p", "--format", "onnx", "--fixed",
                  "batch_size=1", "--fixed", "sequence_length=1", "--fixed",
                  "past_sequence_length=15")
    assert r.returncode == 0, r.stderr
    assert "at most 16 tokens per sequence" in r.stdout
    r = run_tinyt("package", tmp_path / "p", tmp_path / "q")
    assert r.returncode == 2 and "already a package" in r.stderr
    assert json.loads((tmp_path / "p" / "manifest.json").read_text())["stage"] == "package"
