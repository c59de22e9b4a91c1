"""`tinyt serve` of a Whisper artifact (server/transcriptions.py): OpenAI's /v1/audio/transcriptions
and /v1/audio/translations through the `openai` client, each answer equal to
SpeechModel.transcribe on the same file (json, text, srt, vtt, verbose_json; language, prompt),
and bad uploads as OpenAI error objects. The model: tests/whisper_fixtures.py's tiny
vocabulary and 80 mel bins at 64 wide, 1 + 1 layers (fast to export); one server, 127.0.0.1,
stopped by the test."""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from live_server import KEY, Server
from whisper_fixtures import save_whisper

import tinyt.runtime as rt
from tinyt.runtime.subtitles import render

SMALL = dict(d_model=64, encoder_attention_heads=4, decoder_attention_heads=4,
             encoder_ffn_dim=128, decoder_ffn_dim=128, encoder_layers=1, decoder_layers=1)
pytestmark = [pytest.mark.filterwarnings("ignore"),
              pytest.mark.skipif(shutil.which("espeak-ng") is None,
                                 reason="espeak-ng is not installed (scripts/setup.sh)")]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(the running server, the artifact's SpeechModel, a WAV of speech)."""
    from tinyt.export import export_onnx
    from tinyt.hf import import_hf

    root = tmp_path_factory.mktemp("whisper-serve")
    save_whisper("tiny", root / "hf", **SMALL)
    art = export_onnx(import_hf(root / "hf", root / "ck"), root / "onnx")
    wav = root / "said.wav"
    subprocess.run(["espeak-ng", "-w", str(wav), "Hello there, general."], check=True,
                   timeout=60)
    server = Server(art, "--api-key", KEY)
    try:
        yield server, rt.load(art, threads=1), wav
    finally:
        assert server.stop() == 0


def test_openai_client_transcribes_and_translates_as_the_runtime(served):
    server, model, wav = served
    client = server.client()
    name = model.artifact.path.name
    with wav.open("rb") as f:
        got = client.audio.transcriptions.create(model=name, file=f, language="en",
                                                 response_format="verbose_json")
    want = model.transcribe(wav, language="en", timestamps=True)
    assert got.text == want.text and got.language == "en"
    assert [(s.start, s.end, s.tokens) for s in got.segments] == \
        [(s.start, s.end, list(s.tokens)) for s in want.segments]
    with wav.open("rb") as f:
        got = client.audio.transcriptions.create(model=name, file=f, language="en",
                                                 prompt="General Kenobi.")
    assert got.text == model.transcribe(wav, language="en", prompt="General Kenobi.").text
    for form in ("text", "srt", "vtt"):
        with wav.open("rb") as f:
            got = client.audio.translations.create(model=name, file=f, response_format=form)
        want = model.transcribe(wav, task="translate", timestamps=form != "text")
        text = render(want, form)
        assert got == (text.rstrip("\n") if form == "text" else text), form


def test_bad_uploads_are_openai_errors(served, tmp_path):
    import openai

    server, model, wav = served
    client = server.client()
    bad = tmp_path / "notes.wav"
    bad.write_text("not audio")
    with pytest.raises(openai.BadRequestError) as e, bad.open("rb") as f:
        client.audio.transcriptions.create(model=model.artifact.path.name, file=f)
    assert "notes.wav is not audio this machine's libsndfile reads" in str(e.value)
    with pytest.raises(openai.NotFoundError), wav.open("rb") as f:
        client.audio.transcriptions.create(model="whisper-1", file=f)
    with pytest.raises(openai.BadRequestError) as e, wav.open("rb") as f:
        client.audio.transcriptions.create(model=model.artifact.path.name, file=f,
                                           language="xx")
    assert "language='xx' is not one of this model's languages" in str(e.value)
    with pytest.raises(openai.AuthenticationError), wav.open("rb") as f:
        server.client(key="wrong").audio.transcriptions.create(model="m", file=f)
    status, text, _ = server.post("/v1/audio/transcriptions", None,
                                  headers={"Authorization": f"Bearer {KEY}"}, raw="{}")
    assert status == 400 and "multipart/form-data" in json.loads(text)["error"]["message"]
    big = b"x" * (25 * 2**20 + 1)
    status, text, _ = server.request(
        "POST", "/v1/audio/transcriptions", raw=big,
        headers={"Authorization": f"Bearer {KEY}",
                 "Content-Type": "multipart/form-data; boundary=b"})
    assert status == 413 and json.loads(text)["error"]["message"].startswith("the body is")
