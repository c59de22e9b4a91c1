"""Sentence embeddings on an ONNX Runtime session (torch-free).

Texts are tokenized as tokenizer.json defines them (normalizer, [CLS] ... [SEP] or <s> ... </s>
post-processor) and cut where it says (an imported sentence-transformers model's
max_seq_length), else at the model's context; batches are made of texts of similar length
(sorted, then put back in order), so a short text is not padded to a long one's length.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnxruntime as ort

from tinyt.errors import ConfigError
from tinyt.tokenizer import Tokenizer

from .feeds import text_cut, text_feeds
from .session import Artifact


class Encoder:
    """An encoder artifact: `embed` gives each text's sentence embedding, `hidden_states`
    its tokens' last hidden states."""

    def __init__(self, artifact: Artifact, session: ort.InferenceSession, tokenizer: Tokenizer):
        if artifact.fixed:
            raise ConfigError(f"{artifact.path} has pinned shapes ({artifact.fixed}); the "
                              "encoder runtime pads each batch to its own longest text: use "
                              "the artifact before `package --fixed-shape`")
        self.artifact, self.session, self.tokenizer = artifact, session, tokenizer
        self.config = artifact.config
        self.provider = session.get_providers()[0]
        self.inputs = [i.name for i in session.get_inputs()]
        self.dim = self.config.n_embd
        self.max_length = text_cut(tokenizer, self.config)

    def encode(self, texts: Sequence[str]) -> list[tuple[list[int], list[int]]]:
        """Each text's (ids, token type ids), special tokens added, cut at max_length."""
        return [(e.ids, e.type_ids) for e in self.tokenizer.hf.encode_batch(
            list(texts), add_special_tokens=True)]

    def embed(self, texts: str | Sequence[str], *, normalize: bool | None = None,
              batch_size: int = 32) -> np.ndarray:
        """Sentence embeddings [n, dim] (float32; one text in: [dim]). normalize: scale each
        to unit L2 norm; None keeps the model's own choice (a sentence-transformers model
        with Normalize already gives unit vectors)."""
        if "sentence_embedding" not in [o.name for o in self.session.get_outputs()]:
            raise ConfigError(f"{self.artifact.path} is an encoder without a pooling (hidden "
                              "states only): import a sentence-transformers directory, whose "
                              "Pooling module says how tokens make a sentence, or use "
                              "hidden_states()")
        single, texts = self._texts(texts)
        if not (isinstance(batch_size, int) and not isinstance(batch_size, bool)
                and batch_size >= 1):
            raise ConfigError(f"batch_size={batch_size!r} must be an integer >= 1")
        if normalize not in (None, True, False):
            raise ConfigError(f"normalize={normalize!r} must be true, false or null")
        if normalize is False and self.config.normalize:
            raise ConfigError("normalize=False: this model normalizes its embeddings itself "
                              "(sentence-transformers' Normalize, in the graph); they cannot "
                              "be had unnormalized from it")
        rows = self.encode(texts)
        order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]))
        out = np.empty((len(rows), self.dim), dtype=np.float32)
        for s in range(0, len(order), batch_size):
            part = order[s:s + batch_size]
            out[part] = self._run([rows[i] for i in part], "sentence_embedding")
        if normalize:
            out /= np.maximum(np.linalg.norm(out, axis=-1, keepdims=True), 1e-12)
        return out[0] if single else out

    def embed_rows(self, rows: Sequence[tuple[list[int], list[int]]]) -> np.ndarray:
        """Sentence embeddings [n, dim] of token ids run as given, (ids, token types) each
        (as `encode` makes them: a server's token-id input), in one batch padded to the
        longest; the model's own pooling and normalization."""
        if not rows or any(not ids or len(ids) > self.config.block_size for ids, _ in rows):
            raise ConfigError(f"each row needs 1..{self.config.block_size} token ids")
        return self._run(list(rows), "sentence_embedding")

    def hidden_states(self, text: str) -> np.ndarray:
        """The last hidden state of each of a text's tokens [tokens, dim]."""
        _, texts = self._texts(text)
        row = self.encode(texts[:1])[0]
        return self._run([row], "last_hidden_state")[0, :len(row[0])]

    @staticmethod
    def _texts(texts) -> tuple[bool, list[str]]:
        single = isinstance(texts, str)
        texts = [texts] if single else texts
        if not isinstance(texts, (list, tuple)) or not texts \
                or not all(isinstance(t, str) for t in texts):
            raise ConfigError("texts must be a string or a non-empty list of strings")
        return single, list(texts)

    def _run(self, rows: list[tuple[list[int], list[int]]], output: str) -> np.ndarray:
        T = max(len(ids) for ids, _ in rows)
        feeds = text_feeds(rows, len(rows), T, 0, "token_type_ids" in self.inputs)
        return self.session.run([output], feeds)[0]
