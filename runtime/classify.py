"""Text classification on an ONNX Runtime session (torch-free)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from tinyt.errors import ConfigError, ManifestError
from tinyt.tokenizer import Tokenizer

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

    def classify(self, texts: str | Sequence[str], *, batch_size: int = 32
                 ) -> Prediction | list[Prediction]:
        """Label and class probabilities of each text (one text in, one Prediction out)."""
        if not (isinstance(batch_size, int) and batch_size >= 1):
            raise ConfigError(f"batch_size={batch_size!r} must be an integer >= 1")
        single = isinstance(texts, (str, bytes))
        if single:
            texts = [texts]  # type: ignore[list-item]  # one text in, one Prediction out
        if not isinstance(texts, (list, tuple)) or not texts:
            raise ConfigError("texts must be a string or a non-empty list of strings")
        ids = [self.tokenizer.encode(prompt_text(t))[: self.config.block_size] for t in texts]
        out: list[Prediction] = []
        for i in range(0, len(ids), batch_size):
            out += self._batch(ids[i:i + batch_size])
        return out[0] if single else out

    def _batch(self, rows: list[list[int]]) -> list[Prediction]:
        fixed = self.artifact.fixed  # pinned shapes: pad every batch to them
        if fixed and len(rows) > fixed["batch_size"]:
            return self._batch(rows[:fixed["batch_size"]]) + \
                self._batch(rows[fixed["batch_size"]:])
        B = fixed["batch_size"] if fixed else len(rows)
        T = fixed["sequence_length"] if fixed else max(map(len, rows))
        x = np.full((B, T), self._pad, dtype=np.int64)
        mask = np.zeros((B, T), dtype=np.int64)
        for r, row in enumerate(rows):
            row = row[:T]
            x[r, :len(row)], mask[r, :len(row)] = row, 1  # right padding
        logits = self.session.run(["logits"], {"input_ids": x, "attention_mask": mask})[0]
        logits = logits[:len(rows)]
        z = logits - logits.max(axis=-1, keepdims=True)
        probs = np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True)
        return [Prediction(self.labels[int(p.argmax())],
                           {name: float(v) for name, v in zip(self.labels, p)}) for p in probs]
