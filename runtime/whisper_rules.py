"""Whisper's logits rules (torch-free): transformers 4.57's SuppressTokensAtBegin,
SuppressTokens and WhisperTimeStampLogitsProcessor as one runtime/rules.StepRules, which the
seq2seq loops (runtime/encoder_decoder.py) and beams (runtime/beam.py) apply for
runtime/transcribe.py's SpeechModel."""
from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


@functools.lru_cache(maxsize=8)
def _mask(suppress: tuple[int, ...], begin_suppress: tuple[int, ...], vocab: int) -> np.ndarray:
    """0, or -inf at the suppressed tokens [vocab]: made once a call's rules and step kind
    (a beam search asks it at every step), read-only since every caller shares it."""
    mask = np.zeros(vocab, dtype=np.float32)
    mask[list(begin_suppress)] = -np.inf
    mask[list(suppress)] = -np.inf
    mask.flags.writeable = False
    return mask


@dataclass(frozen=True)
class WhisperRules:
    """transformers' SuppressTokensAtBegin, SuppressTokens and WhisperTimeStamp logits
    processors, in that order (runtime/rules.py's interface: the loops of runtime/
    encoder_decoder.py and runtime/beam.py apply them). A history is the prompt (begin_index
    tokens) then the generated tokens; `made` counts the generated ones."""
    begin_index: int
    eos: int
    suppress: tuple[int, ...] = ()
    begin_suppress: tuple[int, ...] = ()
    timestamps: bool = False
    timestamp_begin: int = 0
    no_timestamps: int = 0
    max_initial: int | None = None  # the latest first timestamp (its index), or None
    force_timestamp: bool = True  # False: every rule but the forced timestamp (a check's)

    active = True

    def apply(self, scores: np.ndarray, histories: Sequence[Sequence[int]], made: int) -> None:
        """Set, in place, the scores [rows, vocab] of the tokens each row may not choose to
        -inf."""
        if made == 0 and self.begin_suppress:
            scores[:, list(self.begin_suppress)] = -np.inf
        if self.suppress:
            scores[:, list(self.suppress)] = -np.inf
        if self.timestamps:
            self._timestamp_rules(scores, histories, made)

    def static_mask(self, made: int, vocab: int) -> np.ndarray | None:
        """apply's effect as one mask [vocab] for every row, without timestamps (their rules
        read each row's history: None)."""
        if self.timestamps:
            return None
        return _mask(self.suppress, self.begin_suppress if made == 0 else (), vocab)

    def _timestamp_rules(self, scores: np.ndarray, histories, made: int) -> None:
        """Timestamps come in pairs (but one before the end), never decrease, the first token
        is one (at most max_initial), and a timestamp is forced where the timestamps' total
        probability beats every text token's."""
        T = self.timestamp_begin
        scores[:, self.no_timestamps] = -np.inf
        for k, history in enumerate(histories):
            seq = list(history[self.begin_index:])
            last = len(seq) >= 1 and seq[-1] >= T
            penultimate = len(seq) < 2 or seq[-2] >= T
            if last:
                if penultimate:  # a pair just closed: text next
                    scores[k, T:] = -np.inf
                else:  # an open timestamp: its pair or the end
                    scores[k, :self.eos] = -np.inf
            stamps = [t for t in seq if t >= T]
            if stamps:
                floor = stamps[-1] if last and not penultimate else stamps[-1] + 1
                scores[k, T:floor] = -np.inf
        if made == 0:
            scores[:, :T] = -np.inf
            if self.max_initial is not None:
                scores[:, T + self.max_initial + 1:] = -np.inf
        if not self.force_timestamp:
            return
        for k in range(len(scores)):
            if self.forcing_margin(scores[k]) > 0:
                scores[k, :T] = -np.inf

    def forcing_margin(self, row: np.ndarray) -> float:
        """The timestamps' log-sum-exp less the best text logit of one row [vocab] (the
        other rules applied): the rule forces a timestamp where it is > 0. As log-softmax
        shifts both sides alike, it is that of the logits themselves, each side 1-Lipschitz
        in them (a change of at most e an entry moves it by at most 2 e)."""
        T = self.timestamp_begin
        logp = _log_softmax(row[None].astype(np.float32))[0]
        stamps = logp[T:]
        peak = stamps.max()
        if not np.isfinite(peak):  # every timestamp ruled out: never forced
            return float("-inf")
        total = peak + np.log(np.exp(stamps - peak).sum())
        return float(total - logp[:T].max())
