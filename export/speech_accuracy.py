"""What a quantized Whisper costs, on speech (torch-free): its transcripts against the fp32
graphs' as tinyt.runtime transcribes (runtime/transcribe.py), and its next-token
distributions along fp32's transcripts.

    clips (espeak-ng speaking SENTENCES, or --data: an audio file or a folder of them)
      features ──fp32 graphs (SpeechModel)──▶ tokens, text ─┐ token agreement, exact match,
               ──quantized graphs───────────▶ tokens, text ─┴▶ WER and CER vs fp32's text
      fp32's tokens (teacher forcing: each model's encoder, then decoder_model over them)
               ──both──▶ loss per token, top-1 agreement, KL(fp32 || quantized)

Greedy, the language detected (the language token is the first compared), no timestamps, up
to REPORT_TOKENS tokens a clip. WER and CER are word / character edit distances (a small
Levenshtein below: jiwer is not a tinyt dependency) summed over clips and divided by fp32's
words / characters: the quantized transcript against fp32's, not against what was said. A
model that has not learnt speech (random weights) says noise; its WER then measures only how
far quantization moves that noise, never how well either transcribes.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from tinyt.contract import SEQ2SEQ_FILES
from tinyt.errors import QuantizeError
from tinyt.manifest import Artifact
from tinyt.runtime.audio import SAMPLE_RATE, load_audio, log_mel
from tinyt.runtime.session import graph_session
from tinyt.runtime.transcribe import SpeechModel
from tinyt.tokenizer import Tokenizer

from .accuracy import _window_sums

# What espeak-ng says when no --data is given: plain English, 2-4 s each
SENTENCES = ("The quick brown fox jumps over the lazy dog.",
             "Please call Stella and ask her to bring these things with her from the store.",
             "Six spoons of fresh snow peas, five thick slabs of blue cheese.",
             "We also need a small plastic snake and a big toy frog for the kids.",
             "The weather in the north will be cold and wet through the weekend.",
             "Turn left at the second light, then keep going until you reach the bridge.")
REPORT_CLIPS = 8  # clips of a --data folder read, at most (its files in name order)
REPORT_TOKENS = 48  # greedy tokens a clip, at most
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".opus", ".mp3", ".aiff", ".aif")


def voice(seconds: float = 3.0, seed: int = 0) -> np.ndarray:
    """A synthetic voice at 16 kHz: a 120-Hz pulse train through three formants that glide
    (so the spectrum moves as speech's does), syllables at 4 Hz, a little noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    phase = 2 * np.pi * 120 * t
    buzz = sum(np.sin(k * phase) / k for k in range(1, 30))
    out = np.zeros_like(t)
    for f0, f1 in ((500, 800), (1500, 1100), (2500, 2800)):  # formants gliding over the clip
        f = f0 + (f1 - f0) * t / seconds
        out += buzz * (1 + np.cos(2 * np.pi * f * t)) / 2
    envelope = 0.5 * (1 - np.cos(2 * np.pi * 4 * t))  # four syllables a second
    x = out * envelope + 0.05 * rng.standard_normal(t.size)
    return (0.3 * x / np.abs(x).max()).astype(np.float32)


def speech_clips(data: str | None) -> tuple[list[np.ndarray], str]:
    """16 kHz clips for the report, and what they are: espeak-ng's SENTENCES (data None), an
    audio file, or a folder's audio files (REPORT_CLIPS at most, in name order)."""
    if data is None:
        return _spoken(SENTENCES), f"espeak-ng, {len(SENTENCES)} built-in English sentences"
    path = Path(data)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in AUDIO_SUFFIXES)
        if not files:
            raise QuantizeError(f"data={data!r} holds no audio file ({', '.join(AUDIO_SUFFIXES)})"
                                "; a speech model's report transcribes audio")
        files = files[:REPORT_CLIPS]
    elif path.is_file() and path.suffix.lower() in AUDIO_SUFFIXES:
        files = [path]
    else:
        raise QuantizeError(f"data={data!r} is not an audio file ({', '.join(AUDIO_SUFFIXES)}) "
                            "or a folder of them; a speech model's report transcribes audio "
                            "(leave data out: espeak-ng's built-in sentences)")
    return [load_audio(f) for f in files], f"{data} ({len(files)} files)"


def _spoken(sentences) -> list[np.ndarray]:
    """Each sentence as espeak-ng says it, 16 kHz."""
    if shutil.which("espeak-ng") is None:
        raise QuantizeError("a speech model's quantization report transcribes speech: install "
                            "espeak-ng (apt-get install espeak-ng) for the built-in sentences, "
                            "or pass data= an audio file or a folder of them (WAV, FLAC, ...)")
    clips = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, text in enumerate(sentences):
            wav = Path(tmp) / f"{i}.wav"
            subprocess.run(["espeak-ng", "-w", str(wav), text], check=True, timeout=60,
                           capture_output=True)
            clips.append(load_audio(wav))
    return clips


def edit_distance(a: list, b: list) -> int:
    """Levenshtein distance between two sequences (substitutions, insertions, deletions)."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def error_rate(hypotheses: list[str], references: list[str], *, chars: bool = False) -> float:
    """Corpus WER (CER with chars): edits over all pairs / the references' words (chars)."""
    def split(text: str) -> list[str]:
        return list(" ".join(text.split())) if chars else text.split()

    edits = sum(edit_distance(split(h), split(r)) for h, r in zip(hypotheses, references))
    return edits / max(1, sum(len(split(r)) for r in references))


def speech_model_on(src: Artifact, graphs: dict[str, Path], tokenizer: Tokenizer
                    ) -> SpeechModel:
    """The runtime's SpeechModel on `graphs` (by role), with the source artifact's config and
    speech.json (a quantized artifact carries them unchanged)."""
    sessions = {role: graph_session(graphs[role], level="all") for role in SEQ2SEQ_FILES}
    return SpeechModel(src, sessions, tokenizer)


def _teacher_forced(ref: SpeechModel, cand: SpeechModel, features: list[np.ndarray],
                    transcripts: list[list[int]]) -> dict[str, float]:
    """Loss per token of fp32's transcripts under both, top-1 agreement and KL(ref || cand)
    (each model's own encoder, then decoder_model over the whole transcript)."""
    nll_a = nll_b = kl = 0.0
    agree = tokens = 0
    for mel, row in zip(features, transcripts):
        ids = np.asarray([row[:-1]], dtype=np.int64)
        logits = [m.sessions["decoder"].run(["logits"], {
            "input_ids": ids, "encoder_hidden_states": m.encode(mel)})[0]
            for m in (ref, cand)]
        na, nb, k = _window_sums(logits[0], logits[1], np.asarray([row[1:]], dtype=np.int64))
        nll_a, nll_b, kl = nll_a + na, nll_b + nb, kl + k
        agree += int((logits[0].argmax(-1) == logits[1].argmax(-1)).sum())
        tokens += len(row) - 1
    return {"val_loss_reference": nll_a / tokens, "val_loss": nll_b / tokens,
            "perplexity_change": float(np.expm1((nll_b - nll_a) / tokens)),
            "top1_agreement": agree / tokens, "kl_divergence": kl / tokens,
            "target_tokens": tokens}


# The source's side of the built-in sentences' report, by the source's record (its files'
# hashes): the pipeline reports INT8 and INT4 of one source in one process, and fp32's clips,
# transcripts and features are the same for both (espeak-ng's clips, a deterministic decode).
# A --data folder is read each time (its files may change between calls).
_REFERENCES: dict[str, tuple] = {}


def _reference(src: Artifact, ref: SpeechModel, data: str | None) -> tuple:
    key = json.dumps([src.record(), SENTENCES, REPORT_TOKENS], sort_keys=True, default=str)
    if data is not None or key not in _REFERENCES:
        clips, source = speech_clips(data)
        ours = [ref.transcribe(c, max_new_tokens=REPORT_TOKENS) for c in clips]
        features = [log_mel(c, src.config.n_mels) for c in clips]
        if data is not None:
            return clips, source, ours, features
        _REFERENCES.clear()  # one source at a time
        _REFERENCES[key] = (clips, source, ours, features)
    return _REFERENCES[key]


def speech_report(src: Artifact, candidate: dict[str, Path], tokenizer: Tokenizer,
                  data: str | None) -> dict[str, Any]:
    """The quantized graphs `candidate` (by role) against the source artifact's on speech
    (the module docstring)."""
    ref = speech_model_on(src, {r: src.path / f for r, f in SEQ2SEQ_FILES.items()}, tokenizer)
    clips, source, ours, features = _reference(src, ref, data)
    cand = speech_model_on(src, candidate, tokenizer)
    theirs = [cand.transcribe(c, max_new_tokens=REPORT_TOKENS) for c in clips]
    same = sum(a == b for x, y in zip(ours, theirs) for a, b in zip(x.tokens, y.tokens))
    total = sum(max(len(x.tokens), len(y.tokens)) for x, y in zip(ours, theirs))
    texts = [r.text for r in ours], [r.text for r in theirs]
    # fp32's prompt (start, language, task, no timestamps) and tokens, its end where it
    # stopped: stopping is scored too
    rows = [ref._prefix(r.language if ref.multilingual else None, "transcribe", False)
            + list(r.tokens) + ([ref.eos] if len(r.tokens) < REPORT_TOKENS else [])
            for r in ours]
    return {
        "data": source, "clips": len(clips), "max_new_tokens": REPORT_TOKENS,
        "token_agreement": same / max(total, 1),
        "exact_match": sum(x.tokens == y.tokens for x, y in zip(ours, theirs)) / len(clips),
        "language_agreement": sum(x.language == y.language for x, y in zip(ours, theirs))
        / len(clips),
        "wer_vs_fp32": error_rate(texts[1], texts[0]),
        "cer_vs_fp32": error_rate(texts[1], texts[0], chars=True),
        "words": sum(len(t.split()) for t in texts[0]),
        **_teacher_forced(ref, cand, features, rows),
        "greedy_batched": False,
    }

