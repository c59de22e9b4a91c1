"""Text classification on an ONNX Runtime session (torch-free)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from tinyt.errors import ConfigError, ManifestError
from tinyt.tokenizer import Tokenizer

from .feeds import text_cut, text_feeds
from .generate import prompt_text
from .session import Artifact


@dataclass(frozen=True)
class Prediction:
    label: str
    probabilities: dict[str, float]


class Classifier:
    """A classifier artifact. Texts longer than block_size tokens are classified on their
    first block_size tokens (the model has no positions beyond that)."""

    def __init__(self, artifact: Artifact, session: ort.InferenceSession, tokenizer: Tokenizer):
        self.artifact, self.session, self.tokenizer = artifact, session, tokenizer
        self.config, self.labels = artifact.config, list(artifact.labels or [])
        self.provider = session.get_providers()[0]
        if len(self.labels) != self.config.num_labels:
            raise ManifestError(f"{artifact.path}/config.json lists {len(self.labels)} labels "
                                f"for {self.config.num_labels} outputs")
        self._pad = tokenizer.eos_id if tokenizer.eos_id is not None else 0
        self._types = "token_type_ids" in [i.name for i in session.get_inputs()]
        self.max_length = text_cut(tokenizer, self.config, artifact.fixed)

    def _encode(self, texts: Sequence) -> list[tuple[list[int], list[int]]]:
        """Ids and token types with the special tokens tokenizer.json's post-processor adds
        ([CLS] ... [SEP] of an imported BERT; none for tinyt's own tokenizers). An item that
        is a pair of texts (a list or tuple of two) is encoded as one: [CLS] a [SEP] b [SEP],
        b's tokens of type 1 (an NLI or a cross-encoder's input)."""
        items: list[str | tuple[str, str]] = []
        for t in texts:
            if isinstance(t, (list, tuple)):
                if len(t) != 2:
                    raise ConfigError(f"a pair of texts has two items, not {len(t)}")
                items.append((prompt_text(t[0]), prompt_text(t[1])))
            else:
                items.append(prompt_text(t))
        enc = self.tokenizer.hf.encode_batch(items, add_special_tokens=True)
        return [(e.ids, e.type_ids) for e in enc]

    def _feeds(self, rows: list[tuple[list[int], list[int]]], B: int, T: int
               ) -> dict[str, np.ndarray]:
        return text_feeds(rows, B, T, self._pad, self._types)

    def classify(self, texts: str | Sequence, *, batch_size: int = 32
                 ) -> Prediction | list[Prediction]:
        """Label and class probabilities of each text (one text in, one Prediction out); an
        item of `texts` that is a pair [a, b] is classified as a pair (a list of texts is a
        batch: a pair alone goes in as [[a, b]])."""
        if not (isinstance(batch_size, int) and batch_size >= 1):
            raise ConfigError(f"batch_size={batch_size!r} must be an integer >= 1")
        single = isinstance(texts, (str, bytes))
        if single:
            texts = [texts]  # one text in, one Prediction out
        if not isinstance(texts, (list, tuple)) or not texts:
            raise ConfigError("texts must be a string or a non-empty list of strings")
        ids = self._encode(texts)
        out: list[Prediction] = []
        for i in range(0, len(ids), batch_size):
            out += self._batch(ids[i:i + batch_size])
        return out[0] if single else out

    def _batch(self, rows: list[tuple[list[int], list[int]]]) -> list[Prediction]:
        fixed = self.artifact.fixed  # pinned shapes: pad every batch to them
        if fixed and len(rows) > fixed["batch_size"]:
            return self._batch(rows[:fixed["batch_size"]]) + \
                self._batch(rows[fixed["batch_size"]:])
        B = fixed["batch_size"] if fixed else len(rows)
        T = fixed["sequence_length"] if fixed else max(len(r[0]) for r in rows)
        logits = self.session.run(["logits"], self._feeds(rows, B, T))[0]
        logits = logits[:len(rows)]
        z = logits - logits.max(axis=-1, keepdims=True)
        probs = np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True)
        return [Prediction(self.labels[int(p.argmax())],
                           {name: float(v) for name, v in zip(self.labels, p)}) for p in probs]


@dataclass(frozen=True)
class TokenLabel:
    token: str  # the tokenizer's piece ("##ing", "Ġworld", "▁東")
    start: int  # its characters in the text: text[start:end] (special tokens: 0, 0)
    end: int
    label: str
    probability: float


class TokenClassifier(Classifier):
    """A token-classification artifact (BertForTokenClassification and kin): a label for each
    token of a text, special tokens included, with where it sits in the text."""

    def classify(self, texts, *, batch_size: int = 32):
        raise ConfigError(f"{self.artifact.path} labels tokens: use tag(texts)")

    def tag(self, texts: str | Sequence[str], *, batch_size: int = 32
            ) -> list[TokenLabel] | list[list[TokenLabel]]:
        """Each text's tokens with their labels (one text in, one list out)."""
        if self.artifact.fixed:
            raise ConfigError(f"{self.artifact.path} has pinned shapes ({self.artifact.fixed})"
                              "; tag pads each batch to its own longest text: use the artifact "
                              "before `package --fixed-shape`")
        if not (isinstance(batch_size, int) and batch_size >= 1):
            raise ConfigError(f"batch_size={batch_size!r} must be an integer >= 1")
        single = isinstance(texts, (str, bytes))
        if single:
            texts = [texts]  # type: ignore[list-item]  # one text in, one list out
        if not isinstance(texts, (list, tuple)) or not texts:
            raise ConfigError("texts must be a string or a non-empty list of strings")
        enc = self.tokenizer.hf.encode_batch([prompt_text(t) for t in texts],
                                             add_special_tokens=True)
        out: list[list[TokenLabel]] = []
        for i in range(0, len(enc), batch_size):
            part = enc[i:i + batch_size]
            T = max(len(e.ids) for e in part)
            logits = self.session.run(["logits"], self._feeds(
                [(e.ids, e.type_ids) for e in part], len(part), T))[0]
            z = logits - logits.max(axis=-1, keepdims=True)
            probs = np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True)
            for e, p in zip(part, probs):
                out.append([TokenLabel(tok, a, b, self.labels[int(q.argmax())],
                                       float(q.max()))
                            for tok, (a, b), q in zip(e.tokens, e.offsets, p)])
        return out[0] if single else out
