"""The norms of the residual stream and of q / k (torch): LayerNorm, RMSNorm, and Gemma's
RMSNorm whose gain is stored around zero."""
from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F

from tinyt.config import ModelConfig


class OffsetRMSNorm(nn.RMSNorm):
    """RMSNorm whose gain is offset + weight (Gemma's 1 + w, its weights stored around zero):
    the weights stay as the checkpoint holds them, so they go back to it bit for bit."""

    def __init__(self, dim: int, eps: float, offset: float):
        super().__init__(dim, eps=eps)
        self.offset = offset
        nn.init.constant_(self.weight, 1.0 - offset)  # a gain of 1 to start from, as Gemma's

    def forward(self, x):
        return F.rms_norm(x, self.normalized_shape, self.weight + self.offset, self.eps)


def rms_norm(cfg: ModelConfig, dim: int) -> nn.Module:
    if cfg.norm_offset:
        return OffsetRMSNorm(dim, cfg.norm_eps, cfg.norm_offset)
    return nn.RMSNorm(dim, eps=cfg.norm_eps)


def norm(cfg: ModelConfig) -> nn.Module:
    if cfg.norm == "rmsnorm":
        return rms_norm(cfg, cfg.n_embd)
    return nn.LayerNorm(cfg.n_embd, eps=cfg.norm_eps, bias=cfg.bias)
