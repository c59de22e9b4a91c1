"""The stages after export on an encoder-decoder artifact (Optimum's three graphs): verify,
optimize, quantize (dynamic, qgemm, static, 4-bit), the pipeline that chains them, and
Optimum's ORTModelForSeq2SeqLM loading the exported directory unchanged.

One `tinyt pipeline --task seq2seq` run at the smallest preset (seq2seq-test: 20 steps on the
built-in code summarization) makes the artifacts most tests read (each export is ~8 s of
torch's exporter); a random-weight transformers MarianMTModel (tests/hf_fixtures.py's
opus-mt, at Opus-MT's 58,101 ids) imported and exported once is Optimum's input.

Tolerances: verify and optimize hold every output to compare.reorder_bound (fp32 rounding of
the model's depth and width, at the output's size); the quantizations are judged by their
reports (chrF / BLEU / token agreement against fp32's greedy outputs) and by loading in the
runtime."""
import json
import shutil
import subprocess
import sys

import onnx
import pytest
import torch
from cli_run import run_cli
from onnx import numpy_helper

import tinyt.runtime as rt
from tinyt.app.pipeline import pipeline
from tinyt.contract import SEQ2SEQ_FILES
from tinyt.errors import OptimizeError, PackageError, QuantizeError
from tinyt.fsutil import sha256_file
from tinyt.hardware import saturates_here
from tinyt.int8 import EXACT_EVERYWHERE

ROWS = ("onnx", "onnx-opt", "onnx-int8", "onnx-int4")
FILES = tuple(SEQ2SEQ_FILES.values())
# INT8's chrF against the references may move from fp32's by a little (a near-tie flips a
# token); more means the quantized graphs compute something else
INT8_CHRF_MOVE = 5.0


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Tiny models on a shared machine: one torch thread is fastest."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The pipeline at seq2seq-test: (its directory, its log)."""
    out, logs = tmp_path_factory.mktemp("s2s") / "run", []
    pipeline(out, task="seq2seq", preset="seq2seq-test", bench=True, log=logs.append)
    return out, logs


@pytest.fixture(scope="module")
def pairs_tsv(tmp_path_factory):
    """200 small source -> target pairs (a held-out split of ~10)."""
    path = tmp_path_factory.mktemp("pairs") / "pairs.tsv"
    words = ["alpha", "beta", "gamma", "delta", "value", "count", "name", "item"]
    path.write_text("".join(f"def {w}_{i}(x):\treturn the {w} of x plus {i}.\n"
                            for i in range(25) for w in words), encoding="utf-8")
    return path


def _manifest(path):
    return json.loads((path / "manifest.json").read_text())


def test_pipeline_makes_verifies_reports_then_skips(run):
    out, logs = run
    made = {p.name for p in out.iterdir() if (p / "manifest.json").is_file()}
    assert made == set(ROWS)  # no decoder rows, no pair; static and qgemm by hand
    for row in ROWS:
        m = _manifest(out / row)
        assert m["graph"] == "seq2seq" and set(FILES) <= set(m["files"]), row
    for row in ("onnx", "onnx-opt"):
        assert json.loads((out / f"{row}-verify.json").read_text())["passed"], row
    assert any("[bench] skipped for an encoder-decoder" in line for line in logs)
    text = (out / "report.md").read_text()
    assert text.count("verified vs PyTorch") == 2 and "| onnx-int4 |" in text
    assert "seq2seq peer benchmark" in text and "--mode static" in text
    logs = []
    pipeline(out, task="seq2seq", preset="seq2seq-test", bench=False, log=logs.append)
    assert sum("up to date" in line for line in logs) == len(ROWS)
    assert any("finished run" in line for line in logs)


def test_verify_passes_then_names_the_corrupted_graph(run, tmp_path, monkeypatch, capsys):
    out, _ = run
    report = json.loads((out / "onnx-verify.json").read_text())
    assert {k.split(":")[0] for k in report["worst"]} == set(FILES)
    assert all(w["max_abs"] <= w["bound"] for w in report["worst"].values())
    assert report["generation"] and all(g["identical"] for g in report["generation"])
    bad = tmp_path / "bad"
    shutil.copytree(out / "onnx", bad)
    graph = bad / SEQ2SEQ_FILES["decoder_with_past"]
    proto = onnx.load(str(graph))
    node = next(n for n in proto.graph.node if n.name == "/decoder/h.1/mlp/c_fc/MatMul")
    init = next(i for i in proto.graph.initializer if i.name == node.input[1])
    init.CopyFrom(numpy_helper.from_array(-numpy_helper.to_array(init), init.name))  # a sign
    onnx.save(proto, str(graph))
    manifest = _manifest(bad)  # re-hashed: a stage's slip, not a tampered file
    manifest["files"][graph.name] = {"sha256": sha256_file(graph), "bytes": graph.stat().st_size}
    (bad / "manifest.json").write_text(json.dumps(manifest))
    code, said, err = run_cli(monkeypatch, capsys, "verify", out / "checkpoint", bad)
    assert code == 1 and "decoder_with_past_model.onnx: logits max abs diff" in err
    assert "encoder_model.onnx:" not in err and "decoder_model.onnx:" not in err
    assert "decoder_with_past_model.onnx: logits" in said  # the worst lines, per graph


def test_optimize_fuses_every_attention_and_keeps_outputs(run):
    out, _ = run
    m = _manifest(out / "onnx-opt")
    layers = 2  # seq2seq-test: 2 + 2 blocks
    assert m["attention"] == {
        "encoder_model.onnx": {"self": f"{layers} of {layers}"},
        "decoder_model.onnx": {"self": f"{layers} of {layers}", "cross": f"{layers} of {layers}"},
        "decoder_with_past_model.onnx": {"self": f"{layers} of {layers}",
                                         "cross": f"{layers} of {layers}"}}
    assert m["fusions"]["decoder_with_past_model.onnx"]["attention_with_past"] == layers
    # the cached cross keys / values read in place (BNSH), no copy of them a step
    assert m["fusions"]["decoder_with_past_model.onnx"]["cross_attention_bnsh"] == layers
    assert "Transpose" not in m["op_counts"]["decoder_with_past_model.onnx"]
    for file in FILES:
        assert m["op_counts"][file]["com.microsoft.MultiHeadAttention"] == \
            (layers if file.startswith("encoder") else 2 * layers)
        for group, w in m["equivalence"]["worst"][file].items():
            assert w["max_abs"] <= w["bound"], (file, group, w)
    assert all(e["exact_on"] == EXACT_EVERYWHERE for e in m["int8"].values())


def _check_report(a: dict) -> None:
    for key in ("chrf_vs_fp32", "bleu_vs_fp32", "chrf", "chrf_reference", "bleu"):
        assert 0.0 <= a[key] <= 100.0, (key, a[key])
    for key in ("token_agreement", "exact_match", "top1_agreement"):
        assert 0.0 <= a[key] <= 1.0, (key, a[key])
    assert a["kl_divergence"] >= 0 and a["pairs"] > 0 and a["target_tokens"] > 0


def _translates(path) -> None:
    model = rt.load(path, threads=1)
    result = model.generate_details(["def add(a, b):\n    return a + b"], max_new_tokens=6)[0]
    assert 0 < len(result.token_ids) <= 6 or result.finish_reason == "eos"


@pytest.mark.parametrize("row", ["onnx-int8", "onnx-int4"])
def test_pipeline_quantizations_load_and_report(run, row):
    out, _ = run
    m = _manifest(out / row)
    a = m["accuracy"]
    _check_report(a)
    assert abs(a["chrf"] - a["chrf_reference"]) <= INT8_CHRF_MOVE or row == "onnx-int4"
    q = m["quantization"]
    assert {s.split(":")[0] for s in q["quantized"]} == set(FILES)
    assert {t.split(":")[0] for t in q["shared_tables"]} == {"decoder_model.onnx",
                                                            "decoder_with_past_model.onnx"}
    assert q["recipe"]["bits"] == (4 if row == "onnx-int4" else 8)
    assert set(m["int8"]) == set(FILES)
    _translates(out / row)


def test_qgemm_and_static_quantize_and_load(run, pairs_tsv, tmp_path):
    """The int8 GEMM kernels: 7-bit weights where this CPU's u8 x s8 sums saturate (exact on
    every CPU), refused at 8 bits there. Static INT8 calibrates on the pairs' training split,
    in a process without torch (the stage is torch-free), and reports on their held-out one."""
    from tinyt.export.quantize import quantize

    out, _ = run
    qgemm = quantize(out / "onnx-opt", tmp_path / "qgemm", kernel="qgemm")
    entry = qgemm.manifest["int8"]["decoder_model.onnx"]
    assert entry["u8s8_gemm"] and (entry["weight_bits"] == 7) == saturates_here()
    _check_report(qgemm.manifest["accuracy"])
    _translates(tmp_path / "qgemm")
    for file in ("decoder_model.onnx", "decoder_with_past_model.onnx"):
        # the lm_head an int8 GEMM too, final_logits_bias inside it: logits come from it
        graph = onnx.load(tmp_path / "qgemm" / file, load_external_data=False).graph
        head = next(n for n in graph.node if "logits" in n.output)
        bias = any("final_logits_bias" in i.name for i in graph.initializer)  # Marian's
        assert head.op_type == "DynamicQuantizeMatMul" and len(head.input) == 4 + bias, head
    if saturates_here():
        with pytest.raises(QuantizeError, match="saturate on this CPU"):
            quantize(out / "onnx-opt", tmp_path / "qgemm8", kernel="qgemm", reduce_range=False)
    argv = ["tinyt", "quantize", str(out / "onnx"), str(tmp_path / "static"), "--mode",
            "static", "--data", str(pairs_tsv)]
    proc = subprocess.run([sys.executable, "-c", (
        "import sys; sys.modules['torch'] = None  # any 'import torch' now fails\n"
        f"sys.argv = {argv!r}\nfrom tinyt.__main__ import entry\n"
        "try:\n    entry()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n")],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = _manifest(tmp_path / "static")
    assert m["accuracy"]["data"] == str(pairs_tsv) and m["accuracy"]["pairs"] >= 2
    assert m["quantization"]["calibration_set"]["data"] == str(pairs_tsv)
    assert all(e["exact_on"] == EXACT_EVERYWHERE or not saturates_here()
               for e in m["int8"].values())
    _check_report(m["accuracy"])
    _translates(tmp_path / "static")


def test_what_does_not_apply_to_an_encoder_decoder_is_refused(run, tmp_path):
    from tinyt.export.optimize import optimize
    from tinyt.export.package import package
    from tinyt.export.search import quantize_search

    out, _ = run
    with pytest.raises(PackageError, match="encoder-decoder .*--format triton does not apply"):
        package(out / "onnx-int8", tmp_path / "pkg", format="triton")
    with pytest.raises(OptimizeError, match="target 'gqa' is the decoder-only"):
        optimize(out / "onnx-int8", tmp_path / "gqa", target="gqa")
    with pytest.raises(QuantizeError, match="encoder-decoder .* chosen recipe"):
        quantize_search(out / "onnx-opt", tmp_path / "search", max_loss_increase=0.1)


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    """A random-weight transformers MarianMTModel (Opus-MT's settings, 2 + 2 layers) imported
    and exported: (the artifact, the source texts' ids)."""
    from hf_fixtures import save_seq2seq

    from tinyt.export import export_onnx
    from tinyt.hf import import_hf

    root = tmp_path_factory.mktemp("marian")
    save_seq2seq("opus-mt", root / "hf")
    import_hf(root / "hf", root / "ck")
    return export_onnx(root / "ck", root / "onnx")


def test_optimum_loads_the_export_and_generates_tinyt_tokens(marian, monkeypatch):
    pytest.importorskip("optimum.onnxruntime", reason="the optimum extra is not installed")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a local directory: nothing to fetch
    from optimum.onnxruntime import ORTModelForSeq2SeqLM

    config = json.loads((marian / "config.json").read_text())
    assert config["model_type"] == "marian" and config["architectures"] == ["MarianMTModel"]
    assert config["pad_token_id"] == config["decoder_start_token_id"] == 58100
    assert config["tinyt"]["graph"] == "seq2seq"
    model = ORTModelForSeq2SeqLM.from_pretrained(marian, provider="CPUExecutionProvider")
    ours = rt.load(marian, threads=1)
    for text in ("The cat sat on the mat.", "A longer source, with several words in it"):
        ids = ours.tokenizer.encode_prompt(text)
        x = torch.tensor([ids])
        got = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=12,
                             do_sample=False, num_beams=1)[0].tolist()
        want = ours.generate_ids([ids], max_new_tokens=12)[0]
        tail = [0] if want.finish_reason == "eos" else []  # Optimum keeps the end token
        assert got == [58100, *want.token_ids, *tail], text


def test_optimum_loads_the_transformers_js_package_merged(marian, monkeypatch, tmp_path):
    """The package transformers.js loads (`tinyt package --format transformers-js`) is Optimum's
    layout too: ORTModelForSeq2SeqLM opens its onnx/ folder on the merged decoder."""
    pytest.importorskip("optimum.onnxruntime", reason="the optimum extra is not installed")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from optimum.onnxruntime import ORTModelForSeq2SeqLM

    from tinyt.export.package import package

    pkg = package(marian, tmp_path / "tjs", format="transformers-js")
    model = ORTModelForSeq2SeqLM.from_pretrained(pkg, subfolder="onnx",
                                                 provider="CPUExecutionProvider")
    assert model.decoder.is_merged
    ours = rt.load(marian, threads=1)
    ids = ours.tokenizer.encode_prompt("A longer source, with several words in it")
    x = torch.tensor([ids])
    got = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=12,
                         do_sample=False, num_beams=1)[0].tolist()
    want = ours.generate_ids([ids], max_new_tokens=12)[0]
    tail = [0] if want.finish_reason == "eos" else []
    assert got == [58100, *want.token_ids, *tail]
