"""OpenAI's two shapes of log-probabilities, from the engine's Logprobs (runtime/score.py):

    /v1/completions (legacy):  "logprobs": {"tokens": [str], "token_logprobs": [float | null],
        "top_logprobs": [{str: float} | null], "text_offset": [int]}   (echo: the prompt's
        tokens first, the first with null)
    /v1/chat/completions:      "logprobs": {"content": [{"token", "logprob", "bytes",
        "top_logprobs": [{"token", "logprob", "bytes"}]}], "refusal": null}

A token's text is its own decoding; its bytes, where the vocabulary is byte-level, the bytes
it stands for (a piece of a character decodes to U+FFFD, its bytes stay exact).
"""
from __future__ import annotations

from tinyt.runtime.score import Logprob
from tinyt.tokenizer import Tokenizer, bytes_to_unicode

_BYTE_OF = {c: b for b, c in bytes_to_unicode().items()}


class TokenTexts:
    """Each token id's text and bytes, decoded once per server."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self._texts: dict[int, str] = {}
        self._bytes: dict[int, list[int]] = {}

    def text(self, token: int) -> str:
        if token not in self._texts:
            self._texts[token] = self.tokenizer.decode([token])
        return self._texts[token]

    def bytes(self, token: int) -> list[int]:
        if token not in self._bytes:
            piece = self.tokenizer.hf.id_to_token(token)
            special = self.tokenizer.hf.get_added_tokens_decoder().get(token)
            if piece is not None and special is None and all(c in _BYTE_OF for c in piece):
                self._bytes[token] = [_BYTE_OF[c] for c in piece]
            else:
                self._bytes[token] = list(self.text(token).encode("utf-8"))
        return self._bytes[token]


class Legacy:
    """The completions' logprobs object of one choice, token by token."""

    def __init__(self, texts: TokenTexts, offset: int = 0):
        self.texts, self.offset = texts, offset
        self.tokens: list[str] = []
        self.token_logprobs: list[float | None] = []
        self.top_logprobs: list[dict[str, float] | None] = []
        self.text_offset: list[int] = []

    def add(self, token: int, lp: Logprob | None) -> None:
        """One token, with its Logprob (None: a prompt's first token, which has none)."""
        text = self.texts.text(token)
        self.tokens.append(text)
        self.text_offset.append(self.offset)
        self.offset += len(text)
        if lp is None:
            self.token_logprobs.append(None)
            self.top_logprobs.append(None)
            return
        self.token_logprobs.append(lp.logprob)
        top: dict[str, float] = {}
        for t, v in lp.top:  # most likely first: a text two tokens share keeps the higher
            top.setdefault(self.texts.text(t), v)
        self.top_logprobs.append(top)

    def json(self) -> dict:
        return {"tokens": self.tokens, "token_logprobs": self.token_logprobs,
                "top_logprobs": self.top_logprobs, "text_offset": self.text_offset}


def chat_entry(texts: TokenTexts, lp: Logprob) -> dict:
    """One generated token of a chat completion's logprobs.content."""
    def one(token: int, value: float) -> dict:
        return {"token": texts.text(token), "logprob": value, "bytes": texts.bytes(token)}
    return {**one(lp.token, lp.logprob), "top_logprobs": [one(t, v) for t, v in lp.top]}
