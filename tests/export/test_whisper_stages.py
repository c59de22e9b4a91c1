"""A Whisper through every stage after import (issue 52): `tinyt pipeline --skip-train` on a
Hugging Face directory (tests/whisper_fixtures.py's random-weight Whisper at tiny's widths,
heads, 80 mel bins, 1,500 frames and 51,865-token vocabulary, 2 + 2 layers) imports, exports,
verifies (export/speech_verify.py), optimizes (attention and the convolutions' GELU fused),
quantizes to INT8 and INT4 with the speech report (export/speech_accuracy.py) and writes the
report; then the ORT-format package transcribes as its source does, and what is not built for
speech (static INT8) is refused by name. The web and transformers.js packages:
test_speech_web.py, test_speech_transformers_js.py.

Tolerances: verify and optimize hold every output to seq2seq_checks.graph_bound (fp32
rounding of both stacks, widened to the audio encoder's 1,500-frame sums and its two
convolutions); the quantizations are judged by their reports, against a baseline of the fp32
graphs scored against themselves (agreement 1, WER 0, KL 0: the report compares two different
models, not one with itself)."""
import json
import shutil

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from whisper_fixtures import save_whisper

import tinyt.runtime as rt
from tinyt.app.pipeline import Record, _imported, pipeline
from tinyt.contract import SEQ2SEQ_FILES
from tinyt.errors import OptimizeError, QuantizeError
from tinyt.export import speech_accuracy, verify
from tinyt.export.optimize import _check_seq2seq_fusions
from tinyt.export.package import package
from tinyt.export.quantize import quantize
from tinyt.export.speech_accuracy import (
    edit_distance,
    error_rate,
    speech_clips,
    speech_report,
    voice,
)
from tinyt.fsutil import sha256_file
from tinyt.manifest import open_artifact_dir
from tinyt.recipe import SPEECH_BLOCK
from tinyt.runtime.transcribe import SpeechModel
from tinyt.tokenizer import Tokenizer

ROWS = ("onnx", "onnx-opt", "onnx-int8", "onnx-int4")
LAYERS = 2  # the fixture's encoder and decoder layers each
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore"),
              pytest.mark.skipif(shutil.which("espeak-ng") is None,
                                 reason="espeak-ng is not installed (scripts/setup.sh)")]


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The pipeline on the fixture's Hugging Face directory: (its output, the directory, log)."""
    root = tmp_path_factory.mktemp("whisper")
    save_whisper("tiny", root / "hf")
    logs = []
    pipeline(root / "run", skip_train=root / "hf", bench=False, log=logs.append)
    return root / "run", root / "hf", logs


def _manifest(path):
    return json.loads((path / "manifest.json").read_text())


def test_pipeline_imports_makes_every_row_and_reports(run):
    out, hf, logs = run
    assert any(line.startswith("[import] ") for line in logs)
    made = {p.name for p in out.iterdir() if (p / "manifest.json").is_file()}
    assert made == set(ROWS)
    for row in ROWS:
        m = _manifest(out / row)
        assert m["graph"] == "seq2seq" and set(SEQ2SEQ_FILES.values()) <= set(m["files"])
        assert "speech.json" in m["files"], row  # every stage carries Whisper's tokens
    for row in ("onnx", "onnx-opt"):
        assert json.loads((out / f"{row}-verify.json").read_text())["passed"], row
    text = (out / "report.md").read_text()
    assert "(speech: Whisper)" in text and text.count("verified vs PyTorch") == 2
    assert "| onnx-int8 |" in text and "WER vs fp32" in text and "--mode static" not in text
    again = []  # the import is skipped while the directory is unchanged
    assert _imported(hf, out, Record(again.append)) == out / "checkpoint"
    assert again == [f"[import] up to date: {out / 'checkpoint'}"]


def test_verify_holds_every_graph_to_its_bound_then_names_a_corrupted_one(run, tmp_path):
    out, _, _ = run
    report = json.loads((out / "onnx-verify.json").read_text())
    assert {k.split(":")[0] for k in report["worst"]} == set(SEQ2SEQ_FILES.values())
    for name, w in report["worst"].items():
        assert 0 < w["max_abs"] <= w["bound"], name  # measured ~1e-5 against ~1e-3
    assert report["audio"] == ["synthetic voice", "espeak-ng"]
    assert all(g["identical"] and len(g["torch"]) > 0 for g in report["generation"])
    bad = tmp_path / "bad"
    shutil.copytree(out / "onnx", bad)
    graph = bad / SEQ2SEQ_FILES["encoder"]
    proto = onnx.load(str(graph))
    conv = next(n for n in proto.graph.node if n.op_type == "Conv")
    init = next(i for i in proto.graph.initializer if i.name == conv.input[1])
    w = numpy_helper.to_array(init).copy()
    w[0] *= -1  # one output channel of the first convolution flipped
    init.CopyFrom(numpy_helper.from_array(w, init.name))
    onnx.save(proto, str(graph))
    manifest = _manifest(bad)  # re-hashed: a stage's slip, not a tampered file
    manifest["files"][graph.name] = {"sha256": sha256_file(graph), "bytes": graph.stat().st_size}
    (bad / "manifest.json").write_text(json.dumps(manifest))
    failed = verify(out / "checkpoint", bad)
    assert not failed["passed"]
    assert any(f.startswith("encoder_model.onnx: last_hidden_state") for f in failed["failures"])


def test_optimize_fuses_attention_and_the_convolutions_gelu(run):
    out, _, _ = run
    m = _manifest(out / "onnx-opt")
    assert m["attention"] == {
        "encoder_model.onnx": {"self": "2 of 2"},
        "decoder_model.onnx": {"self": "2 of 2", "cross": "2 of 2"},
        "decoder_with_past_model.onnx": {"self": "2 of 2", "cross": "2 of 2"}}
    assert m["fusions"]["encoder_model.onnx"]["conv_gelu"] == 2
    assert m["fusions"]["decoder_with_past_model.onnx"]["attention_with_past"] == LAYERS
    encoder = m["op_counts"]["encoder_model.onnx"]
    assert encoder["Conv"] == 2 and "Erf" not in encoder  # every GELU one kernel
    for file, groups in m["equivalence"]["worst"].items():
        for group, w in groups.items():
            assert w["max_abs"] <= w["bound"], (file, group, w)
    records = {f: {"fusions": dict(m["fusions"][f]), "attention": m["attention"][f],
                   "op_counts": m["op_counts"][f]} for f in SEQ2SEQ_FILES.values()}
    records["encoder_model.onnx"]["fusions"]["conv_gelu"] = 1
    with pytest.raises(OptimizeError, match="convolutions' GELU fused .* 1 times where 2"):
        _check_seq2seq_fusions(open_artifact_dir(out / "onnx-opt").config, "cpu", records)


def test_beams_read_a_windows_cross_cache_once(run):
    """onnx-opt's stepping graph takes each window's cross keys / values once for its rows
    (export/cross_groups.py): fed so, without a copy, three rows of each of two windows get the
    logits of the caches copied a row, within graph_bound (the same products in another
    order); rows not k to a window are fed a cache a row; beams choose the same tokens."""
    from tinyt.export.seq2seq_checks import graph_bound
    from tinyt.runtime.audio import log_mel
    from tinyt.runtime.encoder_decoder import DecoderSteps

    out, _, _ = run
    m = _manifest(out / "onnx-opt")
    assert m["fusions"]["decoder_with_past_model.onnx"]["cross_attention_groups"] == LAYERS
    model = rt.load(out / "onnx-opt", threads=1)
    assert model.decoder.cross_groups
    feats = np.stack([log_mel(voice(2.0, seed=s)) for s in (0, 1)])
    memory, prompt = model.encode(feats[0]), model._prefix("en", "transcribe", False)
    memory = np.concatenate([memory, model.encode(feats[1])])
    logits = {}
    for grouped in (True, False):
        model.decoder.cross_groups = grouped
        steps = DecoderSteps(model.decoder, memory, None)
        steps.first(prompt)
        a = steps(np.array([0, 0, 0, 1, 1, 1]), np.array([11, 12, 13, 11, 12, 13]))
        assert (steps.cross is steps.cross_src) == grouped  # grouped: the first step's arrays
        assert steps.cross[0].shape[0] == (2 if grouped else 6)
        b = steps(np.array([0, 1, 3]), np.array([14, 15, 16]))  # 2 rows, then 1: a row each
        assert steps.cross[0].shape[0] == 3
        logits[grouped] = np.concatenate([a, b])
    bound = graph_bound(model.config, np.abs(logits[False]).max(), 2 * LAYERS)
    assert np.abs(logits[True] - logits[False]).max() <= bound
    beams = {}
    for grouped in (True, False):
        model.decoder.cross_groups = grouped
        beams[grouped] = model.decode_features(feats, max_new_tokens=8, num_beams=3)
    assert beams[True] == beams[False]


@pytest.mark.parametrize("row", ["onnx-int8", "onnx-int4"])
def test_quantizations_report_speech_against_fp32(run, row):
    out, _, _ = run
    m = _manifest(out / row)
    a = m["accuracy"]
    assert a["clips"] == 6 and a["data"].startswith("espeak-ng")
    for key in ("token_agreement", "exact_match", "language_agreement", "top1_agreement"):
        assert 0.0 <= a[key] <= 1.0, (key, a[key])
    assert a["wer_vs_fp32"] >= 0 and a["cer_vs_fp32"] >= 0 and a["words"] > 0
    # a different model from fp32: its distributions move, and so do some tokens
    assert a["kl_divergence"] > 0 and a["top1_agreement"] < 1 and a["token_agreement"] < 1
    assert m["quantization"]["size_ratio"] < (0.35 if row == "onnx-int8" else 0.2)
    if row == "onnx-int8":  # 1,500 rows a window: int8 GEMMs, a scale a row
        done = m["quantization"]["quantized"]
        rows = [q for q in done if q.startswith(("encoder_model.onnx", "decoder_model.onnx"))
                and "(MatMul," in q]  # (the tied table, the lookups: block tables, shared)
        assert rows and all("activations per row" in q for q in rows)
        assert not any("activations per row" in q for q in done if q not in rows)
        assert m["int8"]["encoder_model.onnx"]["u8s8_gemm"]
        assert m["int8"]["decoder_model.onnx"]["u8s8_gemm"]
        assert not m["int8"]["decoder_with_past_model.onnx"]["u8s8_gemm"]
        assert any(t.startswith("decoder_model.onnx") for t in m["quantization"]["shared_tables"])
        assert m["quantization"]["recipe"]["block_size"] == SPEECH_BLOCK  # (none was named)
    asr = rt.load(out / row, threads=1)
    assert len(asr.transcribe(voice(), max_new_tokens=4).tokens) == 4


def test_the_report_of_fp32_against_itself_is_exact(run, monkeypatch):
    """The baseline that makes the quantizations' figures mean something: the same graphs
    score agreement 1, WER and CER 0, KL 0 (on two of the sentences, to keep it short)."""
    out, _, _ = run
    monkeypatch.setattr(speech_accuracy, "SENTENCES", speech_accuracy.SENTENCES[:2])
    src = open_artifact_dir(out / "onnx-opt")
    same = speech_report(src, {r: src.path / f for r, f in SEQ2SEQ_FILES.items()},
                         Tokenizer.from_file(src.path / "tokenizer.json"), None)
    assert same["token_agreement"] == same["exact_match"] == same["top1_agreement"] == 1.0
    assert same["wer_vs_fp32"] == same["cer_vs_fp32"] == 0.0
    assert same["kl_divergence"] == pytest.approx(0.0, abs=1e-9)
    # a second report on the same source (the pipeline's INT4 after its INT8) transcribes the
    # candidate only: fp32's side is kept, by the source's hashes and the sentences
    calls = []
    transcribe = SpeechModel.transcribe
    monkeypatch.setattr(SpeechModel, "transcribe",
                        lambda self, *a, **k: calls.append(self) or transcribe(self, *a, **k))
    again = speech_report(src, {r: src.path / f for r, f in SEQ2SEQ_FILES.items()},
                          Tokenizer.from_file(src.path / "tokenizer.json"), None)
    assert again == same and len(calls) == 2  # the candidate's two sentences
    monkeypatch.setattr(speech_accuracy, "SENTENCES", speech_accuracy.SENTENCES[:1])
    calls.clear()
    speech_report(src, {r: src.path / f for r, f in SEQ2SEQ_FILES.items()},
                  Tokenizer.from_file(src.path / "tokenizer.json"), None)
    assert len(calls) == 2  # other sentences: fp32's side again, then the candidate's


def test_the_ort_package_transcribes_as_its_source(run, tmp_path):
    out, _, _ = run
    pkg = package(out / "onnx-int8", tmp_path / "ort", format="ort")
    m = _manifest(pkg)
    assert {"encoder_model.ort", "decoder_model.ort", "decoder_with_past_model.ort",
            "speech.json"} <= set(m["files"])
    assert m["equivalence"]["greedy"] == {"audio": "synthetic voice (3 s)",
                                         "max_new_tokens": 8, "equal": True}
    audio = voice(2.0, seed=1)
    ours = rt.load(pkg, threads=1).transcribe(audio, max_new_tokens=12)
    theirs = rt.load(out / "onnx-int8", threads=1).transcribe(audio, max_new_tokens=12)
    assert ours.tokens == theirs.tokens and ours.language == theirs.language


def test_static_int8_is_refused_by_name(run, tmp_path):
    out, _, _ = run
    with pytest.raises(QuantizeError, match="static .QDQ. quantization of a speech"):
        quantize(out / "onnx", tmp_path / "q", mode="static")


def test_report_clips_from_a_folder_and_bad_data(tmp_path):
    for i, seed in enumerate((0, 1)):
        import soundfile

        soundfile.write(tmp_path / f"{i}.wav", voice(1.0, seed=seed), 16_000)
    (tmp_path / "notes.txt").write_text("not audio")
    clips, said = speech_clips(str(tmp_path))
    assert len(clips) == 2 and said.endswith("(2 files)")
    assert np.allclose(clips[1], voice(1.0, seed=1), atol=1e-4)  # 16-bit WAV's rounding
    with pytest.raises(QuantizeError, match="is not an audio file"):
        speech_clips(str(tmp_path / "notes.txt"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(QuantizeError, match="holds no audio file"):
        speech_clips(str(tmp_path / "empty"))


def test_error_rates_count_edits():
    assert edit_distance("kitten".split(), "sitting".split()) == 1
    assert edit_distance(list("kitten"), list("sitting")) == 3
    # 1 substitution + 1 deletion over 4 + 1 reference words
    assert error_rate(["the cat sat", "hi"], ["the dog sat down", "hi"]) == pytest.approx(2 / 5)
    assert error_rate(["ab"], ["abc"], chars=True) == pytest.approx(1 / 3)
    assert error_rate(["a  b"], ["a b"]) == 0.0 and error_rate([""], [""]) == 0.0
