"""TinyTransformer: a GPT-style decoder-only LM with a KV cache, and an encoder classifier.

Parameter names follow nanoGPT / GPT-2 (`transformer.h.0.attn.c_attn.weight`, `lm_head`), so
checkpoints map across by name and ONNX node names read like the PyTorch modules. The same
modules take the Llama family's options from the config: RMSNorm, rotary positions, a SwiGLU
MLP and fewer key/value heads than query heads (grouped-query attention).

The forwards are export-clean: no branches on tensor values, no asserts on dynamic sizes, and
the only Python branches are on which optional inputs were given, which is fixed per graph.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from tinyt.config import ModelConfig
from tinyt.errors import ConfigError
from tinyt.norms import OffsetRMSNorm, norm, rms_norm  # noqa: F401  (tinyt.model's names too)
from tinyt.rope import longrope_original
from tinyt.trunk import (  # noqa: F401  (tinyt.model's names too)
    MLP,
    Block,
    Trunk,
    _init_weights,
    causal_mask,
    positions_from_mask,
)


class TinyTransformer(nn.Module):
    """Decoder-only causal LM. forward returns logits at every position and the KV cache."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.task != "causal_lm":
            raise ConfigError(f"TinyTransformer needs task='causal_lm', got {cfg.task!r}")
        self.config = cfg
        self.transformer = Trunk(cfg)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        _init_weights(self, cfg.n_layer)
        if cfg.tie_weights:
            self.lm_head.weight = self.transformer.wte.weight  # one Parameter, two uses

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None):
        """input_ids (B, T); attention_mask (B, P+T) of 1 = token, 0 = padding; position_ids
        (B, T); past_key_values: per layer (key, value) of (B, nkv, P, hs).
        Returns logits (B, T, vocab) and the present cache, per layer (B, nkv, P+T, hs)."""
        B, T = input_ids.shape
        P = 0 if past_key_values is None else past_key_values[0][0].shape[2]
        if position_ids is None:
            if attention_mask is None:
                position_ids = torch.arange(P, P + T, device=input_ids.device).unsqueeze(0)
            else:
                position_ids = positions_from_mask(attention_mask, T)
        mask = window_mask = None
        if attention_mask is not None or past_key_values is not None:
            mask = causal_mask(attention_mask, P, T, input_ids.device)
        window = self.config.sliding_window
        if window is not None:  # windowed layers always get a mask of their own
            window_mask = causal_mask(attention_mask, P, T, input_ids.device, window,
                                     position_ids)
        # Without a cache or padding, SDPA's own causal path is the fast one (training).
        x, presents = self.transformer(input_ids, position_ids, mask, past_key_values,
                                       is_causal=mask is None, window_mask=window_mask)
        logits = self.lm_head(x)  # (B, T, vocab)
        if self.config.logits_scaling != 1.0:
            logits = logits / self.config.logits_scaling
        cap = self.config.final_softcap
        if cap is not None:  # Gemma's: cap * tanh(logits / cap)
            logits = torch.tanh(logits / cap) * cap
        return logits, presents

    def num_parameters(self) -> int:
        """Unique parameters (a tied matrix counts once)."""
        return sum(p.numel() for p in self.parameters())


POOLER_ACTS = {"tanh": torch.tanh, "relu": F.relu, "gelu": F.gelu}


class TinyEncoder(nn.Module):
    """Encoder: the same blocks with bidirectional attention over non-padding tokens. A
    classifier pools its tokens (cfg.pooling: masked mean, the first, the last real one),
    optionally through a dense layer and activation (cfg.pooler_activation), into a linear
    head -> logits (B, num_labels); a token classifier labels each token (B, T, num_labels);
    an encoder returns its hidden states (B, T, C) and, with a pooling, the sentence
    embedding (B, C) (unit length with cfg.normalize)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.task not in ("classifier", "encoder", "token_classifier"):
            raise ConfigError(f"TinyEncoder needs task='classifier', 'encoder' or "
                              f"'token_classifier', got {cfg.task!r}")
        self.config = cfg
        self.transformer = Trunk(cfg)
        # BERT's pooler (dense + tanh on [CLS]), DistilBERT's pre_classifier (+ relu)
        self.pooler = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias) \
            if cfg.pooler_activation else None
        self.pooler_norm = norm(cfg) if cfg.pooler_norm else None  # ModernBERT's head.norm
        self.classifier = nn.Linear(cfg.n_embd, cfg.num_labels, bias=True) \
            if cfg.task != "encoder" else None
        _init_weights(self, cfg.n_layer)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        """input_ids (B, T); attention_mask (B, T), 1 = token; token_type_ids (B, T) where the
        model has a token-type table. A classifier returns logits (B, num_labels); an encoder
        last_hidden_state (B, T, C), or (last_hidden_state, sentence_embedding (B, C))."""
        B, T = input_ids.shape
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        position_ids = positions_from_mask(attention_mask, T)
        keep = attention_mask.bool()
        idx = torch.arange(T, device=input_ids.device)
        diag = idx.unsqueeze(0) == idx.unsqueeze(1)  # (T, T): keeps padding rows non-empty
        mask = keep.unsqueeze(1).unsqueeze(2) | diag  # (B, 1, T, T)
        window_mask = None
        if self.config.sliding_window is not None:  # keys within window // 2 either side
            near = (position_ids.unsqueeze(-1) - position_ids.unsqueeze(1)).abs() \
                <= self.config.sliding_window // 2  # (B, T, T), by positions
            window_mask = mask & (near.unsqueeze(1) | diag)
        x, _ = self.transformer(input_ids, position_ids, mask, None, is_causal=False,
                                window_mask=window_mask, token_type_ids=token_type_ids)
        if self.config.task == "token_classifier":
            return self.classifier(self._head(x))  # (B, T, num_labels)
        if self.classifier is not None:
            return self.classifier(self._head(self._pool(x, attention_mask)))
        if self.config.pooling is None:
            return x
        pooled = self._pool(x, attention_mask)
        if self.config.normalize:
            pooled = F.normalize(pooled, p=2.0, dim=-1, eps=1e-12)
        return x, pooled

    def _head(self, x):
        """The dense layer, activation and norm before the labels, where the model has them."""
        if self.pooler is None:
            return x
        x = POOLER_ACTS[self.config.pooler_activation](self.pooler(x))
        return x if self.pooler_norm is None else self.pooler_norm(x)

    def _pool(self, x, attention_mask):
        how = self.config.pooling
        rows = torch.arange(x.shape[0], device=x.device)
        if how == "cls":  # each row's first real token: [CLS], token 0 as tokenizers pad
            return x[rows, attention_mask.long().argmax(dim=1)]
        m = attention_mask.to(x.dtype)
        if how == "last":  # each row's last real token, wherever its padding is
            T = x.shape[1]
            return x[rows, (torch.arange(T, device=x.device) * attention_mask.long()).argmax(1)]
        m = m.unsqueeze(-1)  # (B, T, 1)
        return (x * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)  # (B, C)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


TinyClassifier = TinyEncoder  # the encoder's first name (tinyt's own classifiers)


def build_model(cfg: ModelConfig) -> nn.Module:
    if cfg.task == "seq2seq":
        from tinyt.seq2seq import TinySeq2Seq
        return TinySeq2Seq(cfg)
    return TinyTransformer(cfg) if cfg.task == "causal_lm" else TinyEncoder(cfg)


@torch.no_grad()
def generate(model: TinyTransformer, input_ids: torch.Tensor, max_new_tokens: int, *,
             temperature: float = 1.0, top_k: int | None = None, eos_id: int | None = None,
             generator: torch.Generator | None = None,
             vocab_limit: int | None = None) -> torch.Tensor:
    """Sample with the KV cache: one prefill, then one token per step. temperature=0 is greedy.
    Stops at eos_id (batch 1) or when the sequence reaches block_size: positions past the
    model's block_size were never trained, so it does not go there. vocab_limit: ids from it
    on are never chosen (a vocabulary padded beyond its tokenizer)."""
    B, T = input_ids.shape
    block = model.config.block_size
    if T < 1 or T > block:
        raise ConfigError(f"prompt length {T} is outside 1..block_size={block}")
    if max_new_tokens < 0:
        raise ConfigError(f"max_new_tokens={max_new_tokens} must be >= 0")
    steps = min(max_new_tokens, block - T)
    out = input_ids
    logits, cache = model(input_ids)
    # longrope: the step whose sequence first passes the original context recomputes the
    # whole sequence at the long frequencies, its cache made at the short ones dropped (as
    # transformers' Phi-3 generation does)
    original = longrope_original(model.config)
    for _ in range(steps):
        last = logits[:, -1, :vocab_limit]  # (B, vocab)
        if temperature == 0:
            nxt = last.argmax(dim=-1, keepdim=True)
        else:
            last = last / temperature
            if top_k is not None:
                kth = torch.topk(last, min(top_k, last.size(-1))).values[:, -1:]
                last = last.masked_fill(last < kth, float("-inf"))
            nxt = torch.multinomial(F.softmax(last, dim=-1), 1, generator=generator)
        out = torch.cat([out, nxt], dim=1)
        if eos_id is not None and B == 1 and int(nxt) == eos_id:
            break
        if original is not None and out.shape[1] - 1 == original:
            logits, cache = model(out)
        else:
            logits, cache = model(nxt, past_key_values=cache)
    return out
