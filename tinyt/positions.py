"""Positions for the model (torch): learned tables live in the Trunk; these are the computed
ones, sinusoidal (Vaswani et al.) and rotary (cos and sin from position ids, tinyt.rope's
frequencies), and the rotation rotary applies to q and k.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from tinyt.config import ModelConfig
from tinyt.rope import local_rope_frequencies, longrope_original, rope_frequencies


def rotate(x, rope):
    """Rotary positions, non-interleaved as Llama: the first and second halves of each head
    are a vector's two coordinates, turned by the angle of the token's position. Written as
    transformers writes it (slices, not chunk), so ONNX Runtime's RotaryEmbedding fusion
    recognises the exported graph."""
    cos, sin = rope  # (B, 1, T, rd)
    rd = cos.shape[-1]
    if rd != x.shape[-1]:  # partial rotary (Phi-4-mini): the first rd dims turn, the rest pass
        return torch.cat([rotate(x[..., :rd], rope), x[..., rd:]], dim=-1)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class SinusoidalPositions(nn.Module):
    """Fixed sin/cos position encoding (Vaswani et al.), computed from position ids: the sines
    of every frequency, then the cosines. Frequency i is 10000^(-2i / n_embd) ("sinusoidal",
    Marian's), or 10000^(-i / (n_embd / 2 - 1)) ("sinusoidal_fairseq": tensor2tensor's
    spacing, which fairseq and so M2M100 / NLLB use)."""

    def __init__(self, n_embd: int, form: str = "sinusoidal"):
        super().__init__()
        if form == "sinusoidal_fairseq":
            half = n_embd // 2
            inv_freq = torch.exp(torch.arange(half).float() * -(math.log(10000.0) / (half - 1)))
        else:
            inv_freq = torch.exp(torch.arange(0, n_embd, 2).float()
                                 * (-math.log(10000.0) / n_embd))
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # (C/2,)

    def forward(self, position_ids):
        angles = position_ids.unsqueeze(-1).float() * self.inv_freq  # (B, T, C/2)
        return torch.cat([angles.sin(), angles.cos()], dim=-1)  # (B, T, C)


class RotaryPositions(nn.Module):
    """cos and sin of each token's rotary angles, from its position id (so left padding does
    not shift them): the head's i-th and (i + hs/2)-th coordinates turn by pos * inv_freq[i],
    1 / theta^(2i/hs) scaled as rope_scaling says (tinyt.rope). Yarn's attention factor f,
    which transformers multiplies cos and sin by, is the attention's scale times f^2 instead
    (q and k each carry one f): the same product, and the rotary stays the form ONNX Runtime
    fuses into RotaryEmbedding."""

    def __init__(self, cfg: ModelConfig, local: bool = False):
        super().__init__()
        inv_freq = local_rope_frequencies(cfg) if local else rope_frequencies(cfg)[0]
        self.register_buffer("inv_freq", torch.from_numpy(inv_freq), persistent=False)
        # longrope (Phi-3): other frequencies for a sequence past the original context, and
        # an attention factor on cos and sin (the rotated dims alone, as transformers)
        self.original = None if local else longrope_original(cfg)
        self.factor = 1.0
        long_inv = None
        if self.original is not None:
            long_inv, self.factor = rope_frequencies(cfg, long=True)
            long_inv = torch.from_numpy(long_inv)
        self.register_buffer("long_inv_freq", long_inv, persistent=False)

    def forward(self, position_ids):
        inv_freq = self.inv_freq
        if self.long_inv_freq is not None:  # the whole batch's longest position decides
            past = position_ids.max() + 1 > self.original
            inv_freq = torch.where(past, self.long_inv_freq, self.inv_freq)
        # inv_freq (1, rd/2, 1) @ positions (B, 1, T): the form the cos/sin-cache fusion knows
        inv = inv_freq[None, :, None].expand(position_ids.shape[0], -1, 1)
        angles = (inv @ position_ids[:, None, :].float()).transpose(1, 2)  # (B, T, rd/2)
        angles = torch.cat([angles, angles], dim=-1)  # (B, T, rd)
        cos, sin = angles.cos(), angles.sin()
        if self.factor != 1.0:
            cos, sin = cos * self.factor, sin * self.factor
        return cos.unsqueeze(1), sin.unsqueeze(1)  # (B, 1, T, rd)
