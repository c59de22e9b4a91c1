"""TinyTransformer: a GPT-style decoder-only LM with a KV cache, and an encoder classifier.

Parameter names follow nanoGPT / GPT-2 (`transformer.h.0.attn.c_attn.weight`, `lm_head`), so
checkpoints map across by name and ONNX node names read like the PyTorch modules. The same
modules take the Llama family's options from the config: RMSNorm, rotary positions, a SwiGLU
MLP and fewer key/value heads than query heads (grouped-query attention).

The forwards are export-clean: no branches on tensor values, no asserts on dynamic sizes, and
the only Python branches are on which optional inputs were given, which is fixed per graph.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from tinyt.attention import CrossAttention, RelativeBias, SelfAttention
from tinyt.config import ModelConfig
from tinyt.errors import ConfigError
from tinyt.norms import OffsetRMSNorm, norm, rms_norm  # noqa: F401  (tinyt.model's names too)
from tinyt.positions import RotaryPositions, SinusoidalPositions
from tinyt.rope import longrope_original


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
    (cfg.n_layer blocks) and the decoder's (`layers` blocks with cross-attention)."""

    def __init__(self, cfg: ModelConfig, layers: int | None = None, cross: bool = False):
        super().__init__()
        layers = cfg.n_layer if layers is None else layers
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = self.rope = self.rope_local = self.rel = None
        self.position_offset = cfg.position_offset
        if cfg.pos_encoding == "learned":  # RoBERTa's rows before its offset are never read
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
        """window_mask: the mask of the layers that attend through the sliding window;
        token_type_ids (B, T): rows of the token-type table (None: row 0, as transformers);
        cross: (each layer's encoder keys and values, the source's mask), a decoder's;
        key_positions (B, P+T): the keys' positions for the relative bias (None: the
        queries', which have no past)."""
        x = self.wte(input_ids)  # (B, T, C)
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
            mask = self._mask(attention_mask, P, T, input_ids.device)
        window = self.config.sliding_window
        if window is not None:  # windowed layers always get a mask of their own
            window_mask = self._mask(attention_mask, P, T, input_ids.device, window,
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

    @staticmethod
    def _mask(attention_mask, P, T, device, window: int | None = None, position_ids=None):
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
