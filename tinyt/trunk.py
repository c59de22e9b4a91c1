"""The shared stack (torch): the MLP, the residual block (with cross-attention in an
encoder-decoder's decoder), the Trunk (embeddings, positions, blocks, final norm), the masks
and GPT-2's init. The decoder-only LM and the encoder (tinyt.model) and the encoder-decoder
(tinyt.seq2seq) are each a Trunk or two and a head.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from tinyt.attention import CrossAttention, RelativeBias, SelfAttention
from tinyt.config import ModelConfig
from tinyt.norms import norm
from tinyt.positions import RotaryPositions, SinusoidalPositions


class MLP(nn.Module):
    """GELU (ReLU, SiLU): c_proj(gelu(c_fc(x))). SwiGLU (GeGLU-tanh): c_fc makes the gate and the up
    projection in one matmul, c_proj(silu(gate) * up) (gelu_tanh(gate) * up, Gemma's)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gated = cfg.gated_mlp
        width = cfg.mlp_width
        self.c_fc = nn.Linear(cfg.n_embd, 2 * width if self.gated else width, bias=cfg.bias)
        self.act = nn.SiLU() if cfg.activation in ("swiglu", "silu") else \
            nn.ReLU() if cfg.activation == "relu" else \
            nn.GELU(approximate="tanh" if cfg.activation in ("gelu_tanh", "geglu_tanh")
                    else "none")  # gelu, geglu: exact
        self.c_proj = nn.Linear(width, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x):
        h = self.c_fc(x)
        if self.gated:
            gate, up = h.chunk(2, dim=-1)
            return self.dropout(self.c_proj(self.act(gate) * up))
        return self.dropout(self.c_proj(self.act(h)))


class AudioStem(nn.Module):
    """Whisper's audio front end, in place of a token table: log-mel features (B, n_mels, L)
    -> gelu(conv1) (kernel 3, padding 1) -> gelu(conv2) (kernel 3, stride 2, padding 1) ->
    (B, ceil(L / 2), C), one vector per 20 ms."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.conv1 = nn.Conv1d(cfg.n_mels, cfg.n_embd, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(cfg.n_embd, cfg.n_embd, kernel_size=3, stride=2, padding=1)
        self.act = nn.GELU()  # exact, as Whisper's

    def forward(self, features):
        x = self.act(self.conv2(self.act(self.conv1(features))))  # (B, C, L/2)
        return x.transpose(1, 2)  # (B, L/2, C)


def sinusoids(length: int, channels: int) -> torch.Tensor:
    """Whisper's encoder positions (length, channels): the sines of every frequency, then the
    cosines, frequency i = 10000^(-i / (channels/2 - 1)); a table, stored with the weights."""
    inv = torch.exp(-math.log(10000) / (channels // 2 - 1) * torch.arange(channels // 2))
    angles = torch.arange(length).view(-1, 1) * inv.view(1, -1)
    return torch.cat([angles.sin(), angles.cos()], dim=1)


class Block(nn.Module):
    """Pre-norm residual block: x + attn(ln(x)), then x + mlp(ln(x)) (each branch times
    residual_multiplier, Granite's; with post_norms each branch's output normalised before
    it is added, Gemma's four norms a block: ln_1, ln_1_out, ln_2, ln_2_out; without
    pre_norms only the outputs', OLMo-2's: x + ln_1_out(attn(x))). With
    norm_placement='post' (BERT's): ln_1(x + attn(x)), then ln_2(x + mlp(x)). An
    encoder-decoder's decoder block (cross) attends over the encoder's output between the
    two, through its own norm ln_x, placed as the others."""

    def __init__(self, cfg: ModelConfig, layer: int = 0, cross: bool = False):
        super().__init__()
        # ModernBERT's block 0 takes the embeddings' norm as its first
        pre = cfg.pre_norms  # OLMo-2 has none: only the branches' outputs are normalised
        self.ln_1 = norm(cfg) if pre and (layer or cfg.first_block_norm) else nn.Identity()
        self.attn = SelfAttention(cfg)
        self.cross = CrossAttention(cfg) if cross else None
        self.ln_x = norm(cfg) if cross else None
        self.ln_2 = norm(cfg) if pre else nn.Identity()
        self.mlp = MLP(cfg)
        self.ln_1_out = norm(cfg) if cfg.post_norms else None
        self.ln_2_out = norm(cfg) if cfg.post_norms else None
        self.residual = cfg.residual_multiplier
        self.post = cfg.norm_placement == "post"

    def forward(self, x, mask, past, is_causal: bool, rope=None, cross=None):
        """cross: (this layer's encoder keys and values, the source's mask), a decoder's."""
        if self.post:  # BERT's: each sum normalised, x = ln(x + branch(x))
            a, present = self.attn(x, mask, past, is_causal, rope)
            x = self.ln_1(x + a)
            if self.cross is not None:
                x = self.ln_x(x + self.cross(x, *cross))
            return self.ln_2(x + self.mlp(x)), present
        a, present = self.attn(self.ln_1(x), mask, past, is_causal, rope)
        if self.ln_1_out is not None:
            a = self.ln_1_out(a)
        m = self.residual
        x = x + (a if m == 1.0 else a * m)
        if self.cross is not None:
            x = x + self.cross(self.ln_x(x), *cross)
        h = self.mlp(self.ln_2(x))
        if self.ln_2_out is not None:
            h = self.ln_2_out(h)
        x = x + (h if m == 1.0 else h * m)
        return x, present


class Trunk(nn.Module):
    """Token + position embeddings (or rotary angles, or T5's relative bias, for the
    attention), the blocks, and the final norm. An encoder-decoder has two: the encoder's
    (cfg.n_layer blocks) and the decoder's (`layers` blocks with cross-attention). An audio
    encoder (`audio`, Whisper's) reads log-mel features through its stem, not a token table,
    and has a position table of cfg.source_positions rows."""

    def __init__(self, cfg: ModelConfig, layers: int | None = None, cross: bool = False,
                 audio: bool = False):
        super().__init__()
        layers = cfg.n_layer if layers is None else layers
        self.stem = AudioStem(cfg) if audio else None
        self.wte = None if audio else nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = self.rope = self.rope_local = self.rel = None
        self.position_offset = cfg.position_offset
        if audio:
            self.wpe = nn.Embedding(cfg.source_positions, cfg.n_embd)
        elif cfg.pos_encoding == "learned":  # RoBERTa's rows before its offset are never read
            self.wpe = nn.Embedding(cfg.block_size + cfg.position_offset, cfg.n_embd)
        elif cfg.pos_encoding.startswith("sinusoidal"):
            self.wpe = SinusoidalPositions(cfg.n_embd, cfg.pos_encoding)
        elif cfg.pos_encoding == "relative":  # T5's: the decoder's buckets look back only
            self.rel = RelativeBias(cfg, bidirectional=not cross)
        else:
            self.rope = RotaryPositions(cfg)
            if cfg.rope_local_theta is not None:  # Gemma 3: the windowed layers' own base
                self.rope_local = RotaryPositions(cfg, local=True)
        # BERT's token-type (segment) table and the norm of the embeddings' sum
        self.wtt = nn.Embedding(cfg.type_vocab_size, cfg.n_embd) if cfg.type_vocab_size else None
        self.ln_e = norm(cfg) if cfg.embedding_norm else None
        self.drop = nn.Dropout(cfg.dropout)
        self.h = nn.ModuleList(Block(cfg, i, cross) for i in range(layers))
        self.ln_f = norm(cfg) if cfg.norm_placement == "pre" else None  # post: blocks end normed
        self.embedding_multiplier = cfg.embedding_multiplier
        self.rotary = [cfg.rotary_layer(i) for i in range(layers)]
        self.windowed = [cfg.windowed(i) for i in range(layers)]

    def forward(self, input_ids, position_ids, mask, past_key_values, is_causal: bool,
                window_mask=None, token_type_ids=None, cross=None, key_positions=None):
        """input_ids: token ids (B, T), or an audio encoder's features (B, n_mels, 2T);
        window_mask: the mask of the layers that attend through the sliding window;
        token_type_ids (B, T): rows of the token-type table (None: row 0, as transformers);
        cross: (each layer's encoder keys and values, the source's mask), a decoder's;
        key_positions (B, P+T): the keys' positions for the relative bias (None: the
        queries', which have no past)."""
        x = self.wte(input_ids) if self.stem is None else self.stem(input_ids)  # (B, T, C)
        if self.embedding_multiplier != 1.0:
            x = x * self.embedding_multiplier
        if self.wtt is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            x = x + self.wtt(token_type_ids)
        rope = local_rope = None
        if self.rope is not None:
            rope = self.rope(position_ids)
            if self.rope_local is not None:
                local_rope = self.rope_local(position_ids)
        elif self.wpe is not None:
            x = x + self.wpe(position_ids if self.position_offset == 0
                             else position_ids + self.position_offset)
        if self.rel is not None:  # the bias, and the lowest where the boolean mask is off
            bias = self.rel(position_ids, position_ids if key_positions is None
                            else key_positions)
            mask = bias.masked_fill(~mask, torch.finfo(bias.dtype).min)
            is_causal = False
        if self.ln_e is not None:
            x = self.ln_e(x)
        x = self.drop(x)
        presents = []
        for i, block in enumerate(self.h):
            past = None if past_key_values is None else past_key_values[i]
            local = self.windowed[i]
            turn = (local_rope if local and local_rope is not None else rope) \
                if self.rotary[i] else None
            x, present = block(x, window_mask if local else mask, past,
                               is_causal and not local, turn,
                               None if cross is None else (cross[0][i], cross[1]))
            presents.append(present)
        return (x if self.ln_f is None else self.ln_f(x)), tuple(presents)


def _init_weights(model: nn.Module, n_layer: int) -> None:
    """GPT-2 init: N(0, 0.02), zero biases, residual projections scaled by 1/sqrt(2 n_layer)."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
    for name, p in model.named_parameters():
        if name.endswith("c_proj.weight"):
            nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))


def positions_from_mask(attention_mask, T: int):
    """Position of each of the last T tokens counting only unmasked ones, so left padding
    does not shift positions: (B, T) int64."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -T:]


def causal_mask(attention_mask, P, T, device, window: int | None = None, position_ids=None):
    # Query i sits at absolute position P+i and sees key j when j <= P+i and j is not
    # padding. Each query also sees itself, so a padding row is never fully masked
    # (SDPA returns NaN for those); real tokens never see padding either way.
    # Through a sliding window it sees only keys whose position is less than `window`
    # before its own (transformers' "kv_idx > q_idx - sliding_window" on a contiguous
    # row): positions, not indices, so padding between a row's tokens (a pinned-shape
    # graph's slots, runtime/fixed.py) does not shift the window.
    k_idx = torch.arange(P + T, device=device)
    q_idx = torch.arange(T, device=device) + P
    causal = k_idx.unsqueeze(0) <= q_idx.unsqueeze(1)  # (T, P+T)
    if attention_mask is None:
        if window is not None:
            causal = causal & (k_idx.unsqueeze(0) > q_idx.unsqueeze(1) - window)
        return causal.unsqueeze(0).unsqueeze(0)  # (1, 1, T, P+T)
    keep = attention_mask.bool().unsqueeze(1).unsqueeze(2)  # (B, 1, 1, P+T)
    diag = k_idx.unsqueeze(0) == q_idx.unsqueeze(1)  # (T, P+T)
    mask = causal & (keep | diag)  # (B, 1, T, P+T)
    if window is not None:
        k_pos = attention_mask.long().cumsum(-1) - 1  # (B, P+T): each key's position
        near = position_ids.unsqueeze(-1) - k_pos.unsqueeze(1) < window  # (B, T, P+T)
        mask = mask & (near.unsqueeze(1) | diag)
    return mask
