"""Which tokens a generation step may choose, as transformers' logits processors decide it
(torch-free): no repeated n-grams, banned words, a forced first token (NLLB's / M2M100's target
language) and a forced last one. Applied to a step's scores (logits for greedy and sampling,
log-probabilities for beam search) before the choice; the same rules in every loop.

    scores [rows, vocab] ──no_repeat_ngram_size, bad_words: -inf──▶ forced_bos (first step),
        forced_eos (last step): every other token -inf, the forced one 0
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from tinyt.errors import ConfigError


class StepRules(Protocol):
    """What the generation loops ask of a step's rules: Rules below, or a model's own
    (runtime/transcribe.py's WhisperRules)."""

    @property
    def active(self) -> bool: ...

    def apply(self, scores: np.ndarray, histories: Sequence[Sequence[int]], made: int
              ) -> None: ...

    def static_mask(self, made: int, vocab: int) -> np.ndarray | None:
        """apply's effect at step `made` as one additive mask [vocab] (0, or -inf where a
        token is ruled out) where it reads no history and so is the same for every row;
        None where it is not."""
        ...


@dataclass(frozen=True)
class Rules:
    """transformers' NoRepeatNGram, NoBadWords, ForcedBOS and ForcedEOS logits processors, in
    its order. A history is a row's every token so far: the prompt (a decoder-only model's) or
    the decoder's start token, then the tokens generated."""
    max_new_tokens: int  # where forced_eos applies: the step that makes the last token
    no_repeat_ngram_size: int = 0  # 0: off; n: no n-gram occurs twice in a history
    bad_words: tuple[tuple[int, ...], ...] = ()  # token sequences never completed
    forced_bos: int | None = None  # the first generated token
    forced_eos: tuple[int, ...] = ()  # one of these ends a sequence that reaches max_new_tokens

    def __post_init__(self) -> None:
        n = self.no_repeat_ngram_size
        if not (isinstance(n, int) and not isinstance(n, bool) and n >= 0):
            raise ConfigError(f"no_repeat_ngram_size={n!r} is invalid: an integer >= 0 (0 = "
                              "off)")

    @property
    def active(self) -> bool:
        """Whether any rule can change a step's scores."""
        return bool(self.no_repeat_ngram_size or self.bad_words or self.forced_bos is not None
                    or self.forced_eos)

    def apply(self, scores: np.ndarray, histories: Sequence[Sequence[int]], made: int) -> None:
        """Set, in place, the scores [rows, vocab] of the tokens each row may not choose next
        to -inf; `made`: the tokens every row has generated so far."""
        for r, history in enumerate(histories):
            banned = self._banned(history)
            if banned:
                scores[r, banned] = -np.inf
        forced = [self.forced_bos] if made == 0 and self.forced_bos is not None else []
        if made == self.max_new_tokens - 1 and self.forced_eos:
            forced = list(self.forced_eos)  # transformers applies it after forced_bos
        if forced:
            scores[:] = -np.inf
            scores[:, forced] = 0.0

    def static_mask(self, made: int, vocab: int) -> None:
        """None: banned n-grams and words read each row's history, and a forced token replaces
        the scores rather than masking them."""
        return None

    def _banned(self, history: Sequence[int]) -> list[int]:
        """The tokens that would repeat an n-gram of `history` or complete a bad word."""
        out = []
        n = self.no_repeat_ngram_size
        if n and len(history) + 1 >= n:  # transformers' _calc_banned_ngram_tokens
            prefix = tuple(history[len(history) - n + 1:]) if n > 1 else ()
            out += [history[i + n - 1] for i in range(len(history) - n + 1)
                    if tuple(history[i:i + n - 1]) == prefix]
        for word in self.bad_words:
            if len(word) == 1 or tuple(history[len(history) - len(word) + 1:]) == word[:-1]:
                out.append(word[-1])
        return out
