"""Speech to text with a Whisper artifact (torch-free): tinyt's own transcription over the
three graphs of Optimum's speech layout, with transformers 4.57's generate semantics.

    audio (a file, or samples) ──load_audio, log_mel──▶ features [n_mels, frames]
    language None ──encoder, the decoder's first step on <|startoftranscript|>, the best
        language token──▶ <|lang|> (transformers' detect_language; the first window's)
    per 30-s window, from frame `seek` (features cut, zero-padded to 3,000 frames):
        encoder_model.onnx once ──▶ memory
        [<|startofprev|> prompt] <|startoftranscript|> <|lang|> <|task|> [<|notimestamps|>]
            ──decoder (runtime/encoder_decoder.py's DecoderSteps; greedy / sampling there,
              beams in runtime/beam.py) with WhisperRules──▶ tokens up to <|endoftext|>
        timestamps split them into segments; seek moves to the last complete segment's end
        (or the window's end), as transformers' long-form generation does

Audio of at most 30 s is one window of features padded with silence (WhisperFeatureExtractor's
default); longer audio is read whole (its features' floor set by the whole) and always decoded
with timestamps, since the windows continue from them. Temperature fallback, no-speech
skipping and conditioning on the previous windows' tokens: runtime/fallback.py. Not here:
word-level timestamps.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tinyt.contract import SEQ2SEQ_FILES, SEQ2SEQ_ORT_FILES, SPEECH_FILE
from tinyt.errors import ConfigError, ManifestError
from tinyt.fsutil import read_json_object
from tinyt.tokenizer import Tokenizer

from .audio import HOP, N_FRAMES, load_audio, log_mel
from .beam import beam_search
from .encoder_decoder import DecoderSteps, Seq2SeqModel, Settings
from .fallback import (
    Attempt,
    Decision,
    Fallback,
    decide,
    no_speech_probability,
    previous_tokens,
    token_logprob,
)
from .session import Artifact, create_session
from .whisper_rules import WhisperRules

TIME_PRECISION = 0.02  # seconds a timestamp token stands for
FRAME_SECONDS = 0.01  # a feature frame: HOP samples at 16 kHz
INPUT_STRIDE = 2  # feature frames an encoder position reads (the second convolution's stride)
TASKS = ("transcribe", "translate")
Progress = Callable[[float, float], None]  # (seconds done, seconds in all)


@dataclass(frozen=True)
class Segment:
    """A stretch of the transcript between two timestamps (seconds from the audio's start)."""
    start: float
    end: float
    text: str
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class Transcription:
    """transcribe's answer: the text, the language (given or detected), the segments and every
    generated token (transformers' generate output: each window's, timestamps included)."""
    text: str
    language: str
    segments: list[Segment]
    tokens: list[int]
    duration: float  # seconds of audio

    def to_dict(self) -> dict:
        return {"text": self.text, "language": self.language, "duration": self.duration,
                "segments": [{"id": i, "start": s.start, "end": s.end, "text": s.text,
                              "tokens": list(s.tokens)} for i, s in enumerate(self.segments)]}


def split_segments(tokens: Sequence[int], timestamp_begin: int, offset: float, frames: int,
                   ) -> tuple[list[tuple[float, float, list[int]]], int]:
    """A window's tokens as (start, end, tokens) segments, and the frames to move on by:
    transformers' _retrieve_segment. Consecutive timestamps end a segment; a window that does
    not end on a lone timestamp drops what follows its last complete segment and resumes at
    that segment's end."""
    T, tokens = timestamp_begin, list(tokens)
    is_stamp = [t >= T for t in tokens]
    single_ending = is_stamp[-2:] == [False, True]
    cuts = [i + 1 for i in range(len(tokens) - 1) if is_stamp[i] and is_stamp[i + 1]]
    if not cuts:
        stamps = [t for t in tokens if t >= T]
        last = int(frames * FRAME_SECONDS / TIME_PRECISION)
        if stamps and stamps[-1] != T:
            last = stamps[-1] - T
        return [(offset, offset + last * TIME_PRECISION, tokens)], frames
    if single_ending:
        cuts.append(len(tokens))
    else:
        cuts[-1] += 1  # the last segment keeps both of its closing timestamps
    segments, begin = [], 0
    for i, cut in enumerate(cuts):
        piece = tokens[begin:cut]
        end = piece[-1] if i < len(cuts) - 1 or single_ending else piece[-2]
        segments.append((offset + (piece[0] - T) * TIME_PRECISION,
                         offset + (end - T) * TIME_PRECISION, piece))
        begin = cut
    if single_ending:
        return segments, frames
    return segments, (tokens[begin - 2] - T) * INPUT_STRIDE


@dataclass(frozen=True)
class _Run:
    """One transcribe call's decoding choices, the same for every window."""
    timestamps: bool
    max_new_tokens: int | None
    num_beams: int
    length_penalty: float
    seed: int | None
    fallback: Fallback


class SpeechModel:
    """A Whisper artifact: transcribe(audio) turns speech into text. Thread-safe: calls share
    only the sessions."""

    def __init__(self, artifact: Artifact, sessions: dict, tokenizer: Tokenizer, *,
                 max_context: int | None = None):
        path = artifact.path / SPEECH_FILE
        if not path.is_file():
            raise ManifestError(f"{artifact.path} has no {SPEECH_FILE} (Whisper's special "
                                "tokens and generation settings): export it again with tinyt "
                                "export")
        speech = read_json_object(path, ManifestError)
        self.artifact, self.sessions, self.tokenizer = artifact, sessions, tokenizer
        # its caches, loops and settings; max_context: the decoder's positions (448 at most)
        self.decoder = Seq2SeqModel(artifact, sessions, tokenizer, max_context=max_context)
        self.config, self.n_mels = artifact.config, artifact.config.n_mels
        self.provider = self.decoder.provider
        self.tokens, gen, old = speech["tokens"], speech["generation_config"], speech["config"]
        self.languages: dict[str, int] = self.tokens["languages"]
        self.multilingual = bool(gen.get("is_multilingual", bool(self.languages)))
        self.suppress = tuple(gen.get("suppress_tokens") or old.get("suppress_tokens") or ())
        self.begin_suppress = tuple(gen.get("begin_suppress_tokens")
                                    or old.get("begin_suppress_tokens") or ())
        self.max_initial = gen.get("max_initial_timestamp_index")
        self.eos = self.tokens["end"]

    # -- checks ------------------------------------------------------------------------------
    def language_id(self, language: str) -> int:
        """The id of a language code ("en", or "<|en|>"); ConfigError listing the codes."""
        code = language[2:-2] if isinstance(language, str) and language.startswith("<|") \
            and language.endswith("|>") else language
        if isinstance(code, str) and code.lower() in self.languages:
            return self.languages[code.lower()]
        raise ConfigError(f"language={language!r} is not one of this model's languages; it "
                          f"takes the codes {', '.join(sorted(self.languages))} (None: detect "
                          "it)")

    def _prefix(self, language: str | None, task: str, timestamps: bool) -> list[int]:
        """The decoder's prompt after any previous text: start, language, task, and
        <|notimestamps|> unless timestamps are predicted (the language None: detected later)."""
        if task not in TASKS:
            raise ConfigError(f"task={task!r} is invalid: one of {', '.join(TASKS)}")
        if timestamps and not self.tokens["timestamps"]:
            raise ConfigError("timestamps=True: this model's tokenizer has no timestamp "
                              "tokens (<|0.00|> .. <|30.00|>)")
        if not self.multilingual:
            if (language not in (None, "en")) or task != "transcribe":
                raise ConfigError(f"language={language!r}, task={task!r}: this model is "
                                  "English-only; leave language and task out")
            head = [self.tokens["start"]]
        else:
            head = [self.tokens["start"], -1 if language is None else self.language_id(language),
                    self.tokens["tasks"][task]]
        return head + ([] if timestamps else [self.tokens["no_timestamps"]])

    def _prompt_ids(self, prompt: str | None) -> list[int]:
        """transformers' get_prompt_ids: <|startofprev|> then " " + the prompt's text."""
        if prompt is None:
            return []
        if not isinstance(prompt, str):
            raise ConfigError(f"prompt={prompt!r} is invalid: a string (text that came before)")
        ids = self.tokenizer.hf.encode(" " + prompt.strip(), add_special_tokens=False).ids
        return [self.tokens["previous"], *ids]

    # -- the model -----------------------------------------------------------------------------
    def encode(self, window: np.ndarray) -> np.ndarray:
        """The encoder's hidden states [1, frames / 2, C] of one window's features."""
        (memory,) = self.sessions["encoder"].run(
            ["last_hidden_state"], {"input_features": window[None].astype(np.float32)})
        return memory

    def detect_language(self, memory: np.ndarray) -> int:
        """The language token the decoder's first step ranks highest (transformers'
        detect_language: no rule applied)."""
        logits = DecoderSteps(self.decoder, memory, None).first(self.tokens["start"])[0]
        ids = np.asarray(list(self.languages.values()))
        return int(ids[np.argmax(logits[ids])])

    def _window(self, memory: np.ndarray, prompt: list[int], settings: Settings,
                ) -> list[list[int]]:
        """Each window's generated tokens (memory [B, frames / 2, C], one prompt for all), the
        final <|endoftext|> left out."""
        steps = DecoderSteps(self.decoder, memory, None)
        first = steps.first(prompt)
        if settings.beams.num_beams > 1:
            out = beam_search(first, steps, [prompt] * len(memory), settings.beams,
                              eos=(self.eos,), max_new_tokens=settings.max_new_tokens,
                              rules=settings.rules, head=self.decoder.beam_head)
        else:
            out = self.decoder._sample(first, steps, len(memory), settings, prefix=prompt)
        return [tokens for tokens, _ in out]

    def decode_features(self, features: np.ndarray, *, language: str | None = "en",
                        task: str = "transcribe", timestamps: bool = False,
                        num_beams: int = 1, max_new_tokens: int | None = None,
                        length_penalty: float = 1.0) -> list[list[int]]:
        """The generated tokens of each window of log-mel `features` [B, n_mels, 3000]
        (log_mel's, one window each), in one batch: what transformers' generate returns on
        input_features (short-form: one window each, the final <|endoftext|> left out).
        language: a code (an English-only model: None)."""
        f = np.asarray(features)
        if f.ndim != 3 or f.shape[1:] != (self.n_mels, N_FRAMES) or not len(f):
            raise ConfigError(f"features of shape {f.shape}: [windows >= 1, {self.n_mels}, "
                              f"{N_FRAMES}] (runtime/audio.log_mel's, one 30-s window each)")
        prefix = self._prefix(language, task, timestamps)
        if -1 in prefix:
            raise ConfigError("language=None: decode_features takes the language's code "
                              "(transcribe detects it)")
        settings = self._settings(len(prefix), timestamps, max_new_tokens,
                                  num_beams=num_beams, length_penalty=length_penalty)
        (memory,) = self.sessions["encoder"].run(["last_hidden_state"],
                                                 {"input_features": f.astype(np.float32)})
        return self._window(memory, prefix, settings)

    # -- public API ----------------------------------------------------------------------------
    def transcribe(self, audio: str | os.PathLike | np.ndarray, *, language: str | None = None,
                   task: str = "transcribe", timestamps: bool = False, num_beams: int = 1,
                   temperature: float | Sequence[float] = 0.0, prompt: str | None = None,
                   max_new_tokens: int | None = None, sampling_rate: int | None = None,
                   length_penalty: float = 1.0, seed: int | None = None,
                   compression_ratio_threshold: float | None = None,
                   logprob_threshold: float | None = None,
                   no_speech_threshold: float | None = None,
                   condition_on_prev_tokens: bool = False,
                   progress: Progress | None = None) -> Transcription:
        """Speech to text: `audio` a file path, or samples (16 kHz unless sampling_rate says
        otherwise). language: a code ("en"; None: detected); task "transcribe" or "translate"
        (into English); timestamps: predict them (segments then carry their times; audio over
        30 s always does); num_beams, length_penalty: beam search; temperature > 0 samples
        (seed), a list of them is tried in turn where a window fails compression_ratio_
        threshold or logprob_threshold; no_speech_threshold (with logprob_threshold) skips a
        silent window; condition_on_prev_tokens: the windows so far prompt the next
        (runtime/fallback.py); prompt: text that came before (spelling, names);
        max_new_tokens: tokens a window (default: as many as the decoder's 448 positions
        leave); progress(done, total): called in seconds before each window."""
        if not isinstance(timestamps, bool):
            raise ConfigError(f"timestamps={timestamps!r} is invalid: True or False")
        fallback = Fallback.check(temperature, compression_ratio_threshold, logprob_threshold,
                                  no_speech_threshold, condition_on_prev_tokens)
        samples = load_audio(audio, 16_000 if sampling_rate is None and not isinstance(
            audio, (str, os.PathLike)) else sampling_rate)
        whole = samples.size // HOP > N_FRAMES  # longer than one window: long-form
        timestamps = timestamps or whole
        prefix = self._prefix(language, task, timestamps)
        prompt_ids = self._prompt_ids(prompt)
        features = log_mel(samples, self.n_mels, whole=whole)
        run = _Run(timestamps, max_new_tokens, num_beams, length_penalty, seed, fallback)
        self._settings(len(prompt_ids) + len(prefix), timestamps, max_new_tokens,  # checks
                       num_beams=num_beams, temperature=fallback.temperatures[0],
                       length_penalty=length_penalty, seed=seed)
        memory = self.encode(self._cut(features, 0)[0])
        if prefix[1:2] == [-1]:  # detect the language from the first window
            prefix[1] = self.detect_language(memory)
        lang = next((c for c, i in self.languages.items() if [i] == prefix[1:2]), "en")
        segments, tokens = self._windows(features, memory, prompt_ids, prefix, run, progress)
        return Transcription(self._text(tokens), lang, segments, tokens,
                             round(samples.size / 16_000, 3))

    def _run_settings(self, begin: int, run: _Run, temperature: float) -> Settings:
        """A window's settings at one temperature (beams at 0 only, as transformers)."""
        return self._settings(begin, run.timestamps, run.max_new_tokens,
                              num_beams=run.num_beams if temperature == 0 else 1,
                              temperature=temperature, length_penalty=run.length_penalty,
                              seed=run.seed)

    def _settings(self, begin: int, timestamps: bool, max_new_tokens: int | None,
                  **kwargs) -> Settings:
        """The decoding settings, the rules Whisper's: at most the positions left after the
        `begin` prompt tokens."""
        room = self.decoder.context - begin
        if room < 1:
            raise ConfigError(f"the prompt and the task tokens are {begin} tokens; the decoder "
                              f"reads {self.decoder.context}: shorten the prompt")
        n = room if max_new_tokens is None else max_new_tokens
        if not (isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= room):
            raise ConfigError(f"max_new_tokens={n!r} is invalid: an integer in 0..{room} (the "
                              f"decoder's {self.decoder.context} positions less the {begin} "
                              "prompt tokens; None for all of them)")
        settings = self.decoder.settings(max_new_tokens=n, **kwargs)
        rules = WhisperRules(begin_index=begin, eos=self.eos, suppress=self.suppress,
                             begin_suppress=self.begin_suppress, timestamps=timestamps,
                             timestamp_begin=self.tokens["timestamp_begin"],
                             no_timestamps=self.tokens["no_timestamps"],
                             max_initial=self.max_initial)
        return dataclasses.replace(settings, rules=rules)

    @staticmethod
    def _cut(features: np.ndarray, seek: int) -> tuple[np.ndarray, int]:
        """The window of 3,000 frames from `seek` (zero-padded past the end, as transformers
        pads features) and how many frames of it are audio."""
        frames = min(features.shape[1] - seek, N_FRAMES)
        window = np.zeros((features.shape[0], N_FRAMES), dtype=np.float32)
        window[:, :frames] = features[:, seek:seek + frames]
        return window, frames

    def _windows(self, features: np.ndarray, memory: np.ndarray, prompt_ids: list[int],
                 prefix: list[int], run: _Run, progress: Progress | None,
                 ) -> tuple[list[Segment], list[int]]:
        """Every window's segments and tokens, each window from where the last one's
        complete segments end (transformers' long-form loop, one audio), with the fallback's
        temperatures, skips and conditioning (runtime/fallback.py)."""
        total, seek = features.shape[1], 0
        segments: list[Segment] = []
        tokens: list[int] = []
        history = [prompt_ids[1:]] if prompt_ids else []  # what conditions: the prompt's text
        condition = run.fallback.condition_on_prev_tokens
        while seek < total:
            if progress is not None:
                progress(round(seek * FRAME_SECONDS, 2), round(total * FRAME_SECONDS, 2))
            window, frames = self._cut(features, seek)
            if seek:
                memory = self.encode(window)
            offset = seek * TIME_PRECISION / INPUT_STRIDE
            before = prompt_ids
            if condition and history:
                before = previous_tokens(history, self.tokens["timestamp_begin"],
                                         self.tokens["previous"], self.config.block_size // 2 - 1)
            decision = self._decide(memory, before, prefix, run)
            condition = run.fallback.condition_on_prev_tokens and decision.conditions_next
            if decision.skip:  # silence: no segment, on by the window's frames
                seek += frames
                continue
            pieces, advance = split_segments(decision.attempt.tokens,
                                             self.tokens["timestamp_begin"], offset, frames)
            for start, end, piece in pieces:
                segments.append(Segment(round(start, 3), round(end, 3), self._text(piece),
                                        tuple(piece)))
                tokens += piece
                history.append(piece)
            seek += max(advance, 1)  # (a timestamp pair never ends at 0.00)
        if progress is not None:
            progress(*(2 * (round(total * FRAME_SECONDS, 2),)))
        return segments, tokens

    def _decide(self, memory: np.ndarray, before: list[int], prefix: list[int], run: _Run,
                ) -> Decision:
        """A window decoded at the fallback's temperatures in turn (runtime/fallback.decide),
        its prompt `before` (the previous text) then `prefix` (start, language, task...)."""
        prompt = before + prefix
        def decode(temperature: float) -> Attempt:
            settings = self._run_settings(len(prompt), run, temperature)
            steps = DecoderSteps(self.decoder, memory, None)
            first = steps.first(prompt)
            if settings.beams.num_beams > 1:
                ((out, reason),) = beam_search(first, steps, [prompt], settings.beams,
                                               eos=(self.eos,), rules=settings.rules,
                                               max_new_tokens=settings.max_new_tokens,
                                               head=self.decoder.beam_head)
                ended = reason == "eos"
                rescored = (self._rescore(memory, prompt, out + [self.eos] * ended, settings)
                            if run.fallback.scores_needed else [])
                return Attempt(out, ended, rescored)
            scores: list[list[float]] | None = [[]] if run.fallback.scores_needed else None
            ((out, reason),) = self.decoder._sample(first, steps, 1, settings, prefix=prompt,
                                                    logprobs=scores)
            return Attempt(out, reason == "eos", scores[0] if scores else [])

        def no_speech() -> float:  # the raw logits after <|startoftranscript|>
            logits = DecoderSteps(self.decoder, memory, None).first(prompt[:len(before) + 1])[0]
            return no_speech_probability(logits, self.tokens["no_timestamps"] - 1)

        return decide(decode, run.fallback, eos=self.eos, vocab_size=self.config.vocab_size,
                      no_speech=no_speech)

    def _rescore(self, memory: np.ndarray, prompt: list[int], tokens: list[int],
                 settings: Settings) -> list[float]:
        """Each of a beam's tokens' log-softmax of the rule-applied logits (what transformers
        reads from the chosen beam's step scores): the decoder stepped along them once."""
        steps = DecoderSteps(self.decoder, memory, None)
        logits, out = steps.first(prompt), []
        for made, token in enumerate(tokens):
            z = logits.astype(np.float32)  # a copy: the rules write into it
            settings.rules.apply(z, [prompt + tokens[:made]], made)
            out.append(token_logprob(z[0], token))
            if made + 1 < len(tokens):
                logits = steps(np.zeros(1, np.int64), np.asarray([token], np.int64))
        return out

    def _text(self, tokens: Sequence[int]) -> str:
        """The text of the ordinary tokens (special ones and timestamps left out)."""
        return self.tokenizer.hf.decode([t for t in tokens if t < self.eos],
                                        skip_special_tokens=True).strip()


def load_speech_model(artifact: Artifact, tokenizer: Tokenizer, *, provider: str, threads: int,
                      spinning: bool | None, level: str | None,
                      max_context: int | None = None) -> SpeechModel:
    """The three sessions of a Whisper artifact (or of its ORT-format package's .ort files),
    each checked against its contract (runtime/session.py), as one SpeechModel."""
    package = artifact.manifest.package_format
    if package not in (None, "ort"):
        raise ManifestError(f"{artifact.path} is a package ({package}); tinyt.runtime "
                            "transcribes with the artifact it was made from, or its ORT-format "
                            "package (tinyt package --format ort)")
    files = SEQ2SEQ_ORT_FILES if package == "ort" else SEQ2SEQ_FILES
    # the encoder and the first decoder step run once a window, then the steps back to back:
    # their threads sleep as soon as a run ends, not spin beside the steps' own (as
    # runtime/encoder_decoder.load_seq2seq, measured there)
    sessions = {role: create_session(artifact, provider=provider, threads=threads,
                                     spinning=spinning, level=level, graph=file,
                                     phase="step" if role == "decoder_with_past" else "prompt")
                for role, file in files.items()}
    return SpeechModel(artifact, sessions, tokenizer, max_context=max_context)
