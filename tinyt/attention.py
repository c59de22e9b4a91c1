"""Attention (torch): self-attention with its KV cache and grouped-query heads, and the
encoder-decoder's cross-attention, whose keys and values come from the encoder's output once
per source. A mask is boolean (True: attend) or, with T5's relative position bias, additive
(the bias, and the dtype's lowest where a key is masked).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from tinyt.config import ModelConfig
from tinyt.norms import rms_norm
from tinyt.positions import rotate
from tinyt.rope import attention_scale


class SelfAttention(nn.Module):
    """Multi-head self-attention on scaled_dot_product_attention, with an optional KV cache.
    With n_kv_head < n_head, each group of n_head / n_kv_head query heads shares one key and
    value head (grouped-query attention): the cache holds n_kv_head heads."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head, self.n_kv, self.hs = cfg.n_head, cfg.kv_heads, cfg.head_dim
        qkv_bias = cfg.bias if cfg.qkv_bias is None else cfg.qkv_bias
        self.c_attn = nn.Linear(cfg.n_embd, (cfg.n_head + 2 * self.n_kv) * self.hs,
                                bias=qkv_bias)  # fused q, k, v
        self.c_proj = nn.Linear(cfg.q_width, cfg.n_embd, bias=cfg.bias)
        # q and k RMS-normalised before rotary: each head's over head_dim (Qwen3, Gemma 3), or
        # the whole projection's (OLMo-2: q over n_head * head_dim, k over n_kv * head_dim)
        self.qk_norm = cfg.qk_norm
        whole = cfg.qk_norm == "projection"
        self.q_norm = rms_norm(cfg, cfg.q_width if whole else self.hs) if cfg.qk_norm else None
        self.k_norm = rms_norm(cfg, self.n_kv * self.hs if whole else self.hs) \
            if cfg.qk_norm else None
        self.scale = attention_scale(cfg)  # None: SDPA's 1 / sqrt(head_dim)
        self.softcap = cfg.attn_softcap
        self.dropout = cfg.dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x, mask, past, is_causal: bool, rope=None):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split([self.n_head * self.hs, self.n_kv * self.hs,
                                        self.n_kv * self.hs], dim=2)
        if self.qk_norm == "projection":
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(B, T, self.n_head, self.hs)
        k = k.view(B, T, self.n_kv, self.hs)
        if self.qk_norm == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.transpose(1, 2)  # (B, nh, T, hs)
        k = k.transpose(1, 2)  # (B, nkv, T, hs)
        v = v.view(B, T, self.n_kv, self.hs).transpose(1, 2)  # (B, nkv, T, hs)
        if rope is not None:
            q, k = rotate(q, rope), rotate(k, rope)
        if past is not None:
            k = torch.cat([past[0], k], dim=2)  # (B, nkv, P+T, hs)
            v = torch.cat([past[1], v], dim=2)
        present = (k, v)
        if self.n_kv != self.n_head:  # query head i reads key/value head i // group
            k = k.repeat_interleave(self.n_head // self.n_kv, dim=1)  # (B, nh, P+T, hs)
            v = v.repeat_interleave(self.n_head // self.n_kv, dim=1)
        if self.softcap is None:
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=is_causal,
                dropout_p=self.dropout if self.training else 0.0, scale=self.scale,
            )  # (B, nh, T, hs)
        else:
            y = self._capped(q, k, v, mask, is_causal)
        y = y.transpose(1, 2).reshape(B, T, self.n_head * self.hs)
        return self.resid_dropout(self.c_proj(y)), present

    def _capped(self, q, k, v, mask, is_causal: bool):
        """Attention with its logits soft-capped (Gemma 2): scores = q.k * scale, then
        cap * tanh(scores / cap), then the mask, softmax and the values. SDPA has no cap, so
        the product is written out."""
        scale = self.scale if self.scale is not None else 1.0 / math.sqrt(self.hs)
        s = (q @ k.transpose(-2, -1)) * scale  # (B, nh, T, P+T)
        s = torch.tanh(s / self.softcap) * self.softcap
        if is_causal:
            T, S = s.shape[-2:]
            mask = torch.ones(T, S, dtype=torch.bool, device=s.device).tril(S - T)
        if mask is not None:  # the dtype's lowest, not -inf: a graph's constants are finite
            s = s.masked_fill(~mask, torch.finfo(s.dtype).min)
        p = F.dropout(F.softmax(s, dim=-1), self.dropout, self.training)
        return p @ v


class CrossAttention(nn.Module):
    """Attention of the decoder's tokens over the encoder's output: queries from the decoder
    (c_q), keys and values from the encoder's hidden states (c_kv, computed once per source
    and kept for every step: `kv`), the heads' output projected back (c_proj)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head, self.n_kv, self.hs = cfg.n_head, cfg.kv_heads, cfg.head_dim
        qkv_bias = cfg.bias if cfg.qkv_bias is None else cfg.qkv_bias
        self.c_q = nn.Linear(cfg.n_embd, cfg.q_width, bias=qkv_bias)
        self.c_kv = nn.Linear(cfg.n_embd, 2 * self.n_kv * self.hs, bias=qkv_bias)
        self.c_proj = nn.Linear(cfg.q_width, cfg.n_embd, bias=cfg.bias)
        self.scale = attention_scale(cfg)
        self.dropout = cfg.dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def kv(self, memory):
        """The keys and values of the encoder's output `memory` (B, S, C): each (B, nkv, S, hs)."""
        B, S, _ = memory.shape
        k, v = self.c_kv(memory).view(B, S, 2, self.n_kv, self.hs).unbind(2)
        return k.transpose(1, 2), v.transpose(1, 2)

    def forward(self, x, kv, mask):
        """x (B, T, C); kv: kv(memory); mask (B, 1, 1 or T, S) over the source's tokens."""
        B, T, _ = x.shape
        q = self.c_q(x).view(B, T, self.n_head, self.hs).transpose(1, 2)
        k, v = kv
        if self.n_kv != self.n_head:
            k = k.repeat_interleave(self.n_head // self.n_kv, dim=1)
            v = v.repeat_interleave(self.n_head // self.n_kv, dim=1)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0,
            scale=self.scale)
        y = y.transpose(1, 2).reshape(B, T, self.n_head * self.hs)
        return self.resid_dropout(self.c_proj(y))


def relative_bucket(relative, bidirectional: bool, buckets: int, max_distance: int):
    """T5's bucket of each key-minus-query distance: exact up to half the buckets, then
    logarithmic up to max_distance (the rest share the last); bidirectional (the encoder's)
    halves them between keys before and after the query. transformers' T5Attention, with the
    logarithm's argument kept >= 1 where the exact branch is taken (a graph's log(0) is -inf,
    and its cast is undefined)."""
    out = torch.zeros_like(relative)
    if bidirectional:
        buckets //= 2
        out = out + (relative > 0).long() * buckets
        n = relative.abs()
    else:
        n = -torch.clamp(relative, max=0)
    exact = buckets // 2
    far = exact + (torch.log(n.clamp(min=1).float() / exact)
                   / math.log(max_distance / exact) * (buckets - exact)).long()
    far = torch.clamp(far, max=buckets - 1)
    return out + torch.where(n < exact, n, far)


class RelativeBias(nn.Module):
    """T5's relative position bias: a learned scalar per head and distance bucket, added to
    every layer's attention logits (computed once, in the first layer, and shared)."""

    def __init__(self, cfg: ModelConfig, bidirectional: bool):
        super().__init__()
        self.bidirectional = bidirectional
        self.buckets, self.max_distance = cfg.relative_buckets, cfg.relative_max_distance
        self.weight = nn.Parameter(torch.zeros(cfg.relative_buckets, cfg.n_head))

    def forward(self, query_positions, key_positions):
        """(B, T) and (B, S) positions -> the bias (B, n_head, T, S)."""
        relative = key_positions.unsqueeze(1) - query_positions.unsqueeze(2)  # (B, T, S)
        bucket = relative_bucket(relative, self.bidirectional, self.buckets, self.max_distance)
        return F.embedding(bucket, self.weight).permute(0, 3, 1, 2)
