"""Whisper's long-form heuristics (transformers 4.57's generate_with_fallback, _need_fallback,
WhisperNoSpeechDetection and condition_on_prev_tokens), torch-free, for runtime/transcribe.py:

    for t in temperatures (0.0, 0.2, ..., 1.0):       decode the window at t (t > 0 samples)
        compression ratio of its tokens > compression_ratio_threshold   ─┐ fall back: decode
        mean log-probability of its tokens < logprob_threshold           ─┘ again at the next t
        <|nospeech|>'s probability > no_speech_threshold and the mean log-probability below
            logprob_threshold ──▶ skip the window (no segments; move on by its frames)
    the window's tokens, decoded at t < 0.5 ──▶ the next window's prompt
        (<|startofprev|> then the last max_target_positions // 2 - 1 tokens of every segment so
         far, a segment's second closing timestamp left out)

As transformers computes them: the compression ratio is zlib's over the tokens' bytes (each id
in int(log2(vocab) / 8) + 1 little-endian bytes; OpenAI's whisper compresses the text), the
<|endoftext|> included; the mean log-probability is over every generated token, the
<|endoftext|> included, each token's log-softmax of the rule-applied logits at temperature 1;
the probability of <|nospeech|> (the id before <|notimestamps|>) is the softmax of the raw
logits after <|startoftranscript|>, whatever the prompt before it.
"""
from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tinyt.errors import ConfigError

LOW_TEMPERATURE = 0.5  # a window decoded below it conditions the next one (transformers')


@dataclass(frozen=True)
class Fallback:
    """transcribe's checked heuristics: the temperatures to try in turn and the thresholds
    (None: not checked)."""
    temperatures: tuple[float, ...] = (0.0,)
    compression_ratio_threshold: float | None = None
    logprob_threshold: float | None = None
    no_speech_threshold: float | None = None
    condition_on_prev_tokens: bool = False

    @classmethod
    def check(cls, temperature, compression_ratio_threshold=None, logprob_threshold=None,
              no_speech_threshold=None, condition_on_prev_tokens=False) -> Fallback:
        """ConfigError naming a bad value and what is allowed."""
        many = temperature if isinstance(temperature, (list, tuple)) else (temperature,)
        if not many or not all(_number(t) and 0 <= t for t in many):
            raise ConfigError(f"temperature={temperature!r} is invalid: a number >= 0, or a "
                              "list of them tried in turn (e.g. (0.0, 0.2, 0.4, 0.6, 0.8, 1.0))")
        for name, v in (("compression_ratio_threshold", compression_ratio_threshold),
                        ("logprob_threshold", logprob_threshold),
                        ("no_speech_threshold", no_speech_threshold)):
            if v is not None and not _number(v):
                raise ConfigError(f"{name}={v!r} is invalid: a finite number, or None")
        if no_speech_threshold is not None and logprob_threshold is None:
            raise ConfigError(f"no_speech_threshold={no_speech_threshold!r} needs "
                              "logprob_threshold: a window is skipped where <|nospeech|> is "
                              "likelier than the one and its tokens' mean log-probability "
                              "below the other (e.g. 0.6 and -1.0)")
        if not isinstance(condition_on_prev_tokens, bool):
            raise ConfigError(f"condition_on_prev_tokens={condition_on_prev_tokens!r} is "
                              "invalid: True or False")
        return cls(tuple(float(t) for t in many), compression_ratio_threshold,
                   logprob_threshold, no_speech_threshold, condition_on_prev_tokens)

    @property
    def scores_needed(self) -> bool:
        """Whether a window's tokens' log-probabilities are read."""
        return self.logprob_threshold is not None


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def compression_ratio(tokens: Sequence[int], vocab_size: int) -> float:
    """Bytes of the tokens over bytes of their zlib compression (transformers'
    _retrieve_compression_ratio)."""
    width = int(math.log2(vocab_size) / 8) + 1
    raw = b"".join(int(t).to_bytes(width, "little") for t in tokens)
    return len(raw) / len(zlib.compress(raw))


def token_logprob(scores: np.ndarray, token: int) -> float:
    """The log-softmax at `token` of one row of rule-applied scores (temperature 1)."""
    z = scores.astype(np.float64)
    top = z.max()
    return float(z[token] - top - np.log(np.exp(z - top).sum()))


def no_speech_probability(logits: np.ndarray, token: int) -> float:
    """softmax(logits)[token]: the raw logits [V] after <|startoftranscript|>."""
    return math.exp(token_logprob(logits, token))


@dataclass(frozen=True)
class Attempt:
    """One decoding of a window: its tokens (the final <|endoftext|> left out), whether it
    ended on one, and each generated token's log-probability (<|endoftext|>'s last; empty
    where not read)."""
    tokens: list[int]
    ended: bool
    logprobs: list[float]


@dataclass(frozen=True)
class Decision:
    """What the heuristics made of a window: the attempt kept, the temperatures tried (the
    last is the kept attempt's), and whether the window is skipped as silence."""
    attempt: Attempt
    temperatures: tuple[float, ...]
    skip: bool

    @property
    def conditions_next(self) -> bool:
        return self.temperatures[-1] < LOW_TEMPERATURE


def judge(attempt: Attempt, fallback: Fallback, *, eos: int, vocab_size: int,
          no_speech: Callable[[], float]) -> tuple[bool, bool]:
    """(needs fallback, skip) for one attempt: transformers' _need_fallback.
    no_speech: the window's <|nospeech|> probability (asked only where it decides)."""
    seq = attempt.tokens + ([eos] if attempt.ended else [])
    again = skip = False
    ratio = fallback.compression_ratio_threshold
    if ratio is not None and compression_ratio(seq, vocab_size) > ratio:
        again = True
    if fallback.logprob_threshold is not None:
        mean = sum(attempt.logprobs) / max(len(seq), 1)
        if mean < fallback.logprob_threshold:
            again = True
            if fallback.no_speech_threshold is not None \
                    and no_speech() > fallback.no_speech_threshold:
                again, skip = False, True
    return again, skip


def decide(decode: Callable[[float], Attempt], fallback: Fallback, *, eos: int,
           vocab_size: int, no_speech: Callable[[], float]) -> Decision:
    """Decode a window at each temperature in turn until an attempt passes (or is skipped as
    silence, or the temperatures run out: the last attempt is kept)."""
    tried: list[float] = []
    for t in fallback.temperatures:
        tried.append(t)
        attempt = decode(t)
        again, skip = judge(attempt, fallback, eos=eos, vocab_size=vocab_size,
                            no_speech=no_speech)
        if not again:
            break
    return Decision(attempt, tuple(tried), skip)


def previous_tokens(segments: Sequence[Sequence[int]], timestamp_begin: int, previous: int,
                    cut_off: int) -> list[int]:
    """The prompt of a window conditioned on the ones before: <|startofprev|> then the last
    `cut_off` tokens of the segments so far, a segment ending on two timestamps less its last
    (transformers' _pad_to_max_length with skip_ending_double_timestamps)."""
    seq: list[int] = []
    for tokens in segments:
        tokens = list(tokens)
        double = len(tokens) > 2 and tokens[-2] >= timestamp_begin
        seq += tokens[:-1] if double else tokens
    return [previous, *seq[-cut_off:]]
