"""A generated sequence's text as its tokens come (torch-free): each token decoded once, by
`tokenizers`' own incremental decoder (DecodeStream), so a stream of n tokens costs O(n) where
decoding the whole sequence again at every token costs O(n^2).

    token ──DecodeStream.step──▶ a piece of text (None while a character's bytes are partial)
          ──▶ text so far; stop strings searched in the new tail only ──▶ what may be shown

What may be shown holds back a partial character (DecodeStream gives nothing for it) and a tail
that may be the start of a stop string; the text is cut at the first stop string. At the end,
the whole sequence is decoded once (a final partial character becomes U+FFFD, as
Tokenizer.decode gives it), so the pieces always add up to the finished text.
"""
from __future__ import annotations

from tokenizers.decoders import DecodeStream

from tinyt.tokenizer import Tokenizer

REPLACEMENT = "\ufffd"  # what a decoder shows for a partial UTF-8 sequence


class TextStream:
    """The text of one generation, token by token."""

    def __init__(self, tokenizer: Tokenizer, stops: tuple[str, ...] = ()):
        self.tokenizer, self.stops = tokenizer, stops
        self._stream = DecodeStream(skip_special_tokens=False)
        self.ids: list[int] = []
        self.text = ""  # every complete character decoded so far
        self.stop_at: int | None = None  # where the first stop string starts, once one occurs
        self.shown = 0  # characters handed out by pieces so far
        self._longest = max(map(len, stops), default=0)

    def add(self, token: int) -> None:
        """Decode one more token."""
        self.ids.append(token)
        piece = self._stream.step(self.tokenizer.hf, int(token))
        if not piece:
            return
        start = len(self.text)
        self.text += piece
        if self.stops and self.stop_at is None:  # a new stop string overlaps the new piece
            tail = max(0, start - self._longest + 1)
            cut = stop_cut(self.text[tail:], self.stops) + tail
            if cut < len(self.text):
                self.stop_at = cut

    @property
    def stopped(self) -> bool:
        return self.stop_at is not None

    def piece(self) -> str:
        """The text that may be shown now and was not yet."""
        if self.stop_at is not None:
            end = self.stop_at
        else:
            tail = max(0, len(self.text) - self._longest)  # safe_end reads the tail only
            end = tail + safe_end(self.text[tail:], self.stops)
        out = self.text[self.shown:end] if end > self.shown else ""
        self.shown = max(self.shown, end)
        return out

    def finish(self) -> str:
        """The finished text (cut at a stop string), decoded whole once; the pieces handed
        out so far are its start, and the rest is returned by last_piece."""
        full = self.tokenizer.decode(self.ids)
        return full[:stop_cut(full, self.stops)]

    def last_piece(self, final: str) -> str:
        """What `final` (finish()'s text) adds to the pieces handed out."""
        out = final[self.shown:]
        self.shown = len(final)
        return out


def stop_cut(text: str, stops: tuple[str, ...]) -> int:
    """Where `text` ends once cut at the first stop string (its length if none occurs)."""
    return min((text.find(s) for s in stops if s in text), default=len(text))


def safe_end(text: str, stops: tuple[str, ...]) -> int:
    """How much of `text` can be shown now: not a trailing partial character, nor a tail that
    may be the start of a stop string."""
    end = len(text)
    while end and text[end - 1] == REPLACEMENT:
        end -= 1
    for s in stops:
        for k in range(min(len(s) - 1, end), 0, -1):
            if text[:end].endswith(s[:k]):
                end -= k
                break
    return min(end, stop_cut(text, stops))
