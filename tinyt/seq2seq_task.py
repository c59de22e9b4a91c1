"""The encoder-decoder's training task: padded source / target batches, teacher forcing on
the shifted target with the loss over target tokens only, and the evaluation (validation
loss, chrF and BLEU of greedy outputs by sacrebleu) that tinyt.train runs every eval_interval.

    source ids + EOS, <pad> after    ──encoder──▶
    <pad> target ids (shifted right) ──decoder──▶ logits ── cross-entropy ◀── target ids + EOS
                                                                               (-100 after)

<pad> is the padding and the decoder's first token (Marian's convention: decoder_start_id is
the pad id); <|endoftext|> ends both sides.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from tinyt.config import ModelConfig, TrainConfig
from tinyt.errors import ConfigError, DataError
from tinyt.seq2seq import greedy, shift_right
from tinyt.seq2seq_data import ParallelData, encode_sides, output_text
from tinyt.tokenizer import PAD_TOKEN, Tokenizer

IGNORE = -100  # the label of a padded target position: no loss


def _sacrebleu():
    """sacrebleu (the torch extra's), or a ConfigError saying how to install it."""
    try:
        import sacrebleu
    except ImportError:
        raise ConfigError("a seq2seq run scores its outputs with sacrebleu, which is not "
                          "installed: pip install 'sacrebleu>=2' (tinyt's torch extra has it)"
                          ) from None
    return sacrebleu


def text_metrics(hypotheses: list[str], references: list[str]) -> dict[str, float]:
    """Corpus chrF and BLEU (sacrebleu's defaults, one reference each), 0-100."""
    sacrebleu = _sacrebleu()
    return {"chrf": sacrebleu.corpus_chrf(hypotheses, [references]).score,
            "bleu": sacrebleu.corpus_bleu(hypotheses, [references]).score}


def target_limit(model_cfg: ModelConfig, train_cfg: TrainConfig) -> int:
    """Tokens of a target, EOS included: max_target_tokens, within the model's positions."""
    return min(train_cfg.max_target_tokens, model_cfg.block_size)


def collate(sources: list[list[int]], targets: list[list[int]], pad: int):
    """input_ids and attention_mask (B, S) padded on the right with `pad`; labels (B, T)
    padded with IGNORE."""
    S, T = max(map(len, sources)), max(map(len, targets))
    x = torch.full((len(sources), S), pad, dtype=torch.long)
    mask = torch.zeros((len(sources), S), dtype=torch.long)
    y = torch.full((len(targets), T), IGNORE, dtype=torch.long)
    for row, (s, t) in enumerate(zip(sources, targets)):
        x[row, :len(s)] = torch.tensor(s)
        mask[row, :len(s)] = 1
        y[row, :len(t)] = torch.tensor(t)
    return x, mask, y


class Seq2SeqTask:
    """Source -> target pairs as tinyt.train's loop steps and evaluates them."""

    def __init__(self, tok: Tokenizer, data: ParallelData, cfg: ModelConfig,
                 train_cfg: TrainConfig):
        _sacrebleu()  # missing: fail before training, not at its first evaluation
        self.tok = tok
        if tok.pad_id is None:
            raise DataError(f"the tokenizer has no {PAD_TOKEN} token; an encoder-decoder's "
                            "tokenizer is made by tinyt train --task seq2seq")
        if cfg.decoder_start_id != tok.pad_id:
            raise DataError(f"decoder_start_id={cfg.decoder_start_id} is not the tokenizer's "
                            f"{PAD_TOKEN} id {tok.pad_id} (tinyt's decoder starts at the pad)")
        self.pad = tok.pad_id
        self.source_limit, self.target_limit = cfg.block_size, target_limit(cfg, train_cfg)
        self.train = self._encode(data.train)
        self.val = self._encode(data.val)
        self.references = [t for _, t in data.val]
        self.tokens_per_example = float(np.mean([len(s) + len(t) for s, t in self.train]))

    def _encode(self, pairs):
        return list(zip(encode_sides(self.tok, [s for s, _ in pairs], self.source_limit),
                        encode_sides(self.tok, [t for _, t in pairs], self.target_limit)))

    def _batch(self, examples):
        x, mask, y = collate([s for s, _ in examples], [t for _, t in examples], self.pad)
        # The loss is the mean over the global batch's target tokens on one process or many:
        # each row carries rows / tokens of the whole batch, a rank scales its sum by it and
        # divides by its own rows, and DDP's mean over ranks restores the single-process mean.
        rows_per_token = len(examples) / int((y != IGNORE).sum())
        return x, mask, y, torch.full((len(examples),), rows_per_token)

    def batch(self, seed: int, step: int, size: int):
        """The batch of step `step`: a pure function of (seed, step), as the LM's."""
        rng = np.random.default_rng([seed, step])
        return self._batch([self.train[i] for i in rng.integers(0, len(self.train), size)])

    def loss(self, model, batch):
        """Teacher forcing: cross-entropy over the target's tokens only (mean over the global
        batch's tokens, see _batch)."""
        x, mask, y, rows_per_token = batch
        logits = model(x, mask, shift_right(y, self.pad, self.pad))  # (B, T, vocab)
        total = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=IGNORE,
                                reduction="sum")
        return total * rows_per_token[0] / x.shape[0]

    def eval_indices(self, count: int) -> list[int]:
        """The fixed validation slice: `count` examples spread evenly (all when fewer)."""
        if count >= len(self.val):
            return list(range(len(self.val)))
        return sorted(set(np.linspace(0, len(self.val) - 1, num=count).astype(int).tolist()))

    @torch.no_grad()
    def generate(self, model, indices: list[int], size: int, device) -> list[str]:
        """Greedy outputs of the validation examples `indices`, `size` at a time."""
        out = []
        for i in range(0, len(indices), size):
            chunk = [self.val[j] for j in indices[i:i + size]]
            x, mask, _ = collate([s for s, _ in chunk], [t for _, t in chunk], self.pad)
            ids = greedy(model, x.to(device), mask.to(device),
                         max_new_tokens=self.target_limit, eos_id=self.tok.eos_id)
            out += [output_text(self.tok, row) for row in ids.tolist()]
        return out

    @torch.no_grad()
    def evaluate(self, model, count: int, size: int, device) -> dict[str, float]:
        """Validation loss (nats per target token) and chrF / BLEU of greedy outputs against
        the references, on the same fixed slice of the held-out pairs."""
        picks = self.eval_indices(count)
        nats, tokens = 0.0, 0
        for i in range(0, len(picks), size):
            x, mask, y = collate([self.val[j][0] for j in picks[i:i + size]],
                                 [self.val[j][1] for j in picks[i:i + size]], self.pad)
            x, mask, y = x.to(device), mask.to(device), y.to(device)
            logits = model(x, mask, shift_right(y, self.pad, self.pad))
            nats += float(F.cross_entropy(logits.flatten(0, 1), y.flatten(),
                                          ignore_index=IGNORE, reduction="sum"))
            tokens += int((y != IGNORE).sum())
        scores = text_metrics(self.generate(model, picks, size, device),
                              [self.references[j] for j in picks])
        return {"val_loss": nats / tokens, "val_chrf": scores["chrf"],
                "val_bleu": scores["bleu"]}
