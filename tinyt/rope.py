"""Rotary frequencies: the inverse frequencies and the cos/sin factor of a config's rotary
positions, computed as transformers' modeling_rope_utils computes them, in float32 (torch-free:
the PyTorch model, the shared-cache graph's cos/sin tables and the runtime read the same).

    default  inv_freq[i] = 1 / theta^(2i / d)
    linear   default / factor
    dynamic  default: its NTK base changes only past max_position_embeddings, where tinyt's
             context ends (a longer context is refused at import)
    llama3   long wavelengths (> original / low_freq_factor) / factor, short ones (< original /
             high_freq_factor) kept, a smooth blend between
    yarn     interpolated (/ factor) and extrapolated frequencies blended by a linear ramp over
             the dimensions between beta_fast's and beta_slow's rotations at the original
             context; cos and sin times the attention factor (0.1 ln(factor) + 1, or mscale's)
    longrope default / a factor per frequency: the short factors while a sequence is within
             the original context, the long ones past it (transformers then recomputes the
             whole cache); cos and sin times sqrt(1 + ln(factor) / ln(original))

Each step is the same float32 operation as transformers' on the same values, so the tables
agree with it to the last bit but for the power function's own rounding (numpy's and torch's
powf differ in about one element in 200, by one ulp).
"""
from __future__ import annotations

import math

import numpy as np

from tinyt.config import ModelConfig, rope_parameters

F32 = np.float32


def _default(theta: float, dim: int) -> np.ndarray:
    exponent = np.arange(0, dim, 2, dtype=np.int64).astype(F32) / F32(dim)
    return (F32(1.0) / (F32(theta) ** exponent)).astype(F32)


def rope_frequencies(cfg: ModelConfig, *, long: bool = False) -> tuple[np.ndarray, float]:
    """(inv_freq float32 [rotary_dims / 2], attention factor) of cfg's rotary positions.
    long: longrope's long factors (the frequencies of a sequence past the original context;
    the short ones otherwise, and every other type has one set)."""
    dim, theta = cfg.rotary_dims, cfg.rope_theta
    inv = _default(theta, dim)
    if cfg.rope_scaling is None:
        return inv, 1.0
    kind, p = rope_parameters(cfg)
    if kind == "longrope":
        return _longrope(cfg, p, long)
    factor = float(p["factor"])
    if kind == "linear":
        return (inv / F32(factor)).astype(F32), 1.0
    if kind == "dynamic":
        return inv, 1.0
    if kind == "llama3":
        old = p["original_max_position_embeddings"]
        low, high = float(p["low_freq_factor"]), float(p["high_freq_factor"])
        low_wavelen, high_wavelen = old / low, old / high
        wavelen = F32(2 * math.pi) / inv
        scaled = np.where(wavelen > F32(low_wavelen), inv / F32(factor), inv).astype(F32)
        smooth = ((F32(old) / wavelen - F32(low)) / F32(high - low)).astype(F32)
        smoothed = ((F32(1) - smooth) * scaled / F32(factor) + smooth * scaled).astype(F32)
        medium = ~(wavelen < F32(high_wavelen)) & ~(wavelen > F32(low_wavelen))
        return np.where(medium, smoothed, scaled).astype(F32), 1.0
    return _yarn(cfg, p, factor)


def is_longrope(cfg: ModelConfig) -> bool:
    """Whether cfg's rotary switches to other frequencies past an original context."""
    return cfg.rope_scaling is not None and rope_parameters(cfg)[0] == "longrope"


def longrope_original(cfg: ModelConfig) -> int | None:
    """The context past which longrope's long factors apply (None: no longrope)."""
    return rope_parameters(cfg)[1]["original_max_position_embeddings"] if is_longrope(cfg) \
        else None


def _longrope(cfg: ModelConfig, p: dict, long: bool) -> tuple[np.ndarray, float]:
    """inv_freq = 1 / (ext * theta^(2i/d)) with the short or long factors `ext`, and the
    attention factor sqrt(1 + ln(factor) / ln(original)) (1 where factor <= 1), as
    transformers' longrope computes them; the factor multiplies cos and sin."""
    dim, original = cfg.rotary_dims, p["original_max_position_embeddings"]
    ext = np.asarray(p["long_factor" if long else "short_factor"], dtype=F32)
    shape = np.arange(0, dim, 2, dtype=np.int64).astype(F32) / F32(dim)
    inv = (F32(1.0) / (ext * (F32(cfg.rope_theta) ** shape))).astype(F32)
    attention = p.get("attention_factor")
    if attention is None:
        factor = float(p["factor"])
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return inv, float(attention)


def local_rope_frequencies(cfg: ModelConfig) -> np.ndarray:
    """inv_freq of the windowed layers where rope_local_theta gives them a base of their own
    (Gemma 3): the default frequencies at that base, rope_scaling not applied (transformers'
    local rotary is a copy of the config with rope_type 'default')."""
    if cfg.rope_local_theta is None:
        raise ValueError("the config has no rope_local_theta: every layer's rotary is "
                         "rope_frequencies'")
    return _default(cfg.rope_local_theta, cfg.rotary_dims)


def _mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(cfg: ModelConfig, p: dict, factor: float) -> tuple[np.ndarray, float]:
    dim, base = cfg.head_dim, cfg.rope_theta
    original = p.get("original_max_position_embeddings") or cfg.block_size
    attention = p.get("attention_factor")
    if attention is None:
        mscale, mscale_all = p.get("mscale"), p.get("mscale_all_dim")
        attention = (_mscale(factor, mscale) / _mscale(factor, mscale_all)
                     if mscale and mscale_all else _mscale(factor))
    fast, slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    lo, hi = correction_dim(fast), correction_dim(slow)
    if p.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, dim - 1)
    if lo == hi:
        hi += 0.001  # transformers' guard against a zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=F32) - F32(lo)) / F32(hi - lo), 0, 1).astype(F32)
    pos_freqs = (F32(base) ** (np.arange(0, dim, 2).astype(F32) / F32(dim))).astype(F32)
    extrapolation = (F32(1.0) / pos_freqs).astype(F32)
    interpolation = (F32(1.0) / (F32(factor) * pos_freqs)).astype(F32)
    keep = (F32(1) - ramp).astype(F32)  # the extrapolation's share
    inv = (interpolation * (F32(1) - keep) + extrapolation * keep).astype(F32)
    return inv, float(attention)


def attention_scale(cfg: ModelConfig) -> float | None:
    """q.k's scale: attention_multiplier (Granite's, Gemma's query_pre_attn_scalar^-1/2) or
    1 / sqrt(head_dim), times yarn's attention factor squared; None where it is SDPA's own
    default."""
    factor = rope_frequencies(cfg)[1] if cfg.pos_encoding == "rotary" else 1.0
    if is_longrope(cfg):  # its factor multiplies cos and sin: the rotated dims alone
        factor = 1.0
    if cfg.attention_multiplier is None and factor == 1.0:
        return None
    base = cfg.attention_multiplier or 1.0 / math.sqrt(cfg.head_dim)
    return base * factor * factor


def rope_table(cfg: ModelConfig, positions: int, *, scaled: bool = True, local: bool = False,
               long: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [positions, rotary_dims / 2], float32: position times inv_freq, as one
    float32 product each, then cos and sin; times the attention factor unless scaled=False
    (tinyt's graphs put yarn's factor into the attention's scale instead; longrope's stays in
    the table). local: the windowed layers' own table (local_rope_frequencies; no attention
    factor). long: longrope's long factors."""
    inv, factor = (local_rope_frequencies(cfg), 1.0) if local else \
        rope_frequencies(cfg, long=long)
    angles = np.arange(positions, dtype=F32)[:, None] * inv[None, :]
    cos, sin = np.cos(angles).astype(F32), np.sin(angles).astype(F32)
    if scaled and factor != 1.0:
        cos, sin = (cos * F32(factor)).astype(F32), (sin * F32(factor)).astype(F32)
    return cos, sin
