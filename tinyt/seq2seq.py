"""The encoder-decoder (torch): the Transformer of "Attention Is All You Need" — an encoder
stack with bidirectional self-attention over the source, and a decoder stack whose blocks
attend causally over the target, then over the encoder's output (cross-attention), then run
the MLP — built from the same Trunk and blocks as tinyt's decoder-only and encoder models.

    source ──encoder──▶ memory ──each layer's c_kv, once──▶ cross keys / values
    target (shifted right: decoder_start_id first) ──decoder (self cache, cross kv)──▶ logits

An audio encoder-decoder (n_mels set: Whisper's) reads log-mel features (B, n_mels, 2S) as
its source, through two convolutions (tinyt.trunk.AudioStem) and a table of S positions;
every one of its S vectors is attended (no source mask).

Training reads the whole shifted target at once (teacher forcing); generation runs the
encoder once per batch and steps the decoder through its self-attention cache, the cross
keys and values computed once (`cross_kv`), as Optimum's exported seq2seq graphs do.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from tinyt.config import ModelConfig
from tinyt.errors import ConfigError
from tinyt.trunk import Trunk, _init_weights, causal_mask, positions_from_mask, sinusoids


def source_mask(attention_mask):
    """The encoder's mask (B, 1, S, S): each token sees the source's real tokens, and itself
    (so a padding row is never empty: SDPA returns NaN for those)."""
    S = attention_mask.shape[1]
    idx = torch.arange(S, device=attention_mask.device)
    diag = idx.unsqueeze(0) == idx.unsqueeze(1)
    return attention_mask.bool().unsqueeze(1).unsqueeze(2) | diag


def memory_mask(attention_mask):
    """The cross-attention's mask (B, 1, 1, S): the source's real tokens."""
    return attention_mask.bool().unsqueeze(1).unsqueeze(2)


class TinySeq2Seq(nn.Module):
    """Encoder-decoder. forward(input_ids, attention_mask, decoder_input_ids) returns the
    logits at every target position (teacher forcing); encode / cross_kv / decode are the
    steps generation and the exported graphs take."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.task != "seq2seq":
            raise ConfigError(f"TinySeq2Seq needs task='seq2seq', got {cfg.task!r}")
        self.config = cfg
        self.encoder = Trunk(cfg, audio=cfg.n_mels is not None)
        self.decoder = Trunk(cfg, layers=cfg.decoder_layers, cross=True)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.final_logits_bias:  # BART's and Marian's: a buffer, as transformers keeps it
            self.register_buffer("final_logits_bias", torch.zeros(1, cfg.vocab_size))
        else:
            self.final_logits_bias = None
        _init_weights(self, cfg.n_layer + cfg.decoder_layers)
        if cfg.n_mels is not None:  # Whisper's fixed sinusoid, a table it stores and loads
            with torch.no_grad():
                self.encoder.wpe.weight.copy_(sinusoids(cfg.source_positions, cfg.n_embd))
        if cfg.shared_embeddings:  # one Parameter, read by both stacks
            self.decoder.wte = self.encoder.wte
        if cfg.tie_weights:
            self.lm_head.weight = self.decoder.wte.weight

    def source_ones(self, source):
        """The mask of a source without padding (B, S): token ids (B, S), or an audio
        encoder's features (B, n_mels, 2S), whose length must be its table's (Whisper's 3,000
        frames: transformers refuses any other)."""
        if self.config.n_mels is None:
            return torch.ones_like(source)
        frames = 2 * self.config.source_positions
        if source.dim() != 3 or source.shape[1:] != (self.config.n_mels, frames):
            raise ConfigError(f"an audio encoder reads features (batch, {self.config.n_mels}, "
                              f"{frames}); got {tuple(source.shape)} (runtime/audio.log_mel "
                              "pads or cuts to 30 s)")
        return torch.ones(source.shape[0], frames // 2, dtype=torch.long, device=source.device)

    def encode(self, input_ids, attention_mask=None):
        """The encoder's output (B, S, C) for the source (B, S), or an audio encoder's
        features (B, n_mels, 2S); attention_mask 1 = token (audio: none, every frame)."""
        if self.config.n_mels is not None:
            S = self.source_ones(input_ids).shape[1]  # checks the features' shape
            positions = torch.arange(S, device=input_ids.device).unsqueeze(0)  # (1, S)
            memory, _ = self.encoder(input_ids, positions, None, None, is_causal=False)
            return memory
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        positions = positions_from_mask(attention_mask, attention_mask.shape[1])
        memory, _ = self.encoder(input_ids, positions, source_mask(attention_mask), None,
                                 is_causal=False)
        return memory

    def cross_kv(self, memory):
        """Each decoder layer's cross-attention keys and values of `memory`, computed once
        per source: per layer (key, value) of (B, nkv, S, hs)."""
        return tuple(block.cross.kv(memory) for block in self.decoder.h)

    def decode(self, decoder_input_ids, cross, attention_mask, past_key_values=None):
        """decoder_input_ids (B, T) after past_key_values' P tokens (per layer (key, value)
        of (B, nkv, P, hs)); cross: cross_kv(memory); attention_mask (B, S): the source's
        (None: every source vector, an audio encoder's).
        Returns logits (B, T, vocab) and the self-attention cache, per layer (B, nkv, P+T,
        hs). The target has no padding: every row starts at decoder_start_id together."""
        T = decoder_input_ids.shape[1]
        P = 0 if past_key_values is None else past_key_values[0][0].shape[2]
        device = decoder_input_ids.device
        positions = torch.arange(P, P + T, device=device).unsqueeze(0)
        mask = causal_mask(None, P, T, device)
        keys = torch.arange(P + T, device=device).unsqueeze(0) if P else None
        x, presents = self.decoder(decoder_input_ids, positions, mask, past_key_values,
                                   is_causal=False, cross=(cross, None if attention_mask
                                                           is None else
                                                           memory_mask(attention_mask)),
                                   key_positions=keys)
        return self.logits(x), presents

    def logits(self, x):
        logits = self.lm_head(x)
        if self.config.logits_scaling != 1.0:  # T5's tied head: d_model^-0.5 on its input
            logits = logits / self.config.logits_scaling
        if self.final_logits_bias is not None:
            logits = logits + self.final_logits_bias
        return logits

    def forward(self, input_ids, attention_mask=None, decoder_input_ids=None):
        """Teacher forcing: logits (B, T, vocab) of the target `decoder_input_ids` (B, T)
        (the labels shifted right) given the source."""
        if decoder_input_ids is None:
            raise ConfigError("a seq2seq forward needs decoder_input_ids (the target shifted "
                              "right, decoder_start_id first)")
        if attention_mask is None and self.config.n_mels is None:
            attention_mask = torch.ones_like(input_ids)
        memory = self.encode(input_ids, attention_mask)
        logits, _ = self.decode(decoder_input_ids, self.cross_kv(memory), attention_mask)
        return logits

    def num_parameters(self) -> int:
        """Unique parameters (a shared or tied matrix counts once)."""
        return sum(p.numel() for p in self.parameters())


def shift_right(labels, start_id: int, pad_id: int):
    """The decoder's input for `labels` (B, T): start_id, then the labels but the last; the
    loss's ignored positions (-100) read as padding."""
    shifted = labels.new_full(labels.shape, start_id)
    shifted[:, 1:] = labels[:, :-1]
    return shifted.masked_fill(shifted == -100, pad_id)


def seq2seq_loss(model: TinySeq2Seq, input_ids, attention_mask, labels, pad_id: int):
    """Cross-entropy over the target's tokens only (labels -100 elsewhere)."""
    dec = shift_right(labels, model.config.decoder_start_id, pad_id)
    logits = model(input_ids, attention_mask, dec)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                           ignore_index=-100)


@torch.no_grad()
def greedy(model: TinySeq2Seq, input_ids, attention_mask=None, *, max_new_tokens: int,
           eos_id: int | None = None, forced_bos_id: int | None = None,
           vocab_limit: int | None = None) -> torch.Tensor:
    """Greedy decoding through the caches: the encoder once, the decoder a token a step.
    Returns (B, 1 + n) ids, decoder_start_id first; a row that has made eos_id pads with it.
    forced_bos_id: the first generated token (NLLB's / M2M100's target language);
    vocab_limit: ids from it on are never chosen (a vocabulary padded beyond its tokenizer,
    T5's 32,128 for 32,100 pieces, as the runtime chooses)."""
    if attention_mask is None and model.config.n_mels is None:
        attention_mask = torch.ones_like(input_ids)
    B = input_ids.shape[0]
    cross = model.cross_kv(model.encode(input_ids, attention_mask))
    out = torch.full((B, 1), model.config.decoder_start_id, dtype=torch.long,
                     device=input_ids.device)
    done = torch.zeros(B, dtype=torch.bool, device=input_ids.device)
    past = None
    for step in range(max_new_tokens):
        logits, past = model.decode(out[:, -1:], cross, attention_mask, past)
        nxt = logits[:, -1, :vocab_limit].argmax(-1)
        if step == 0 and forced_bos_id is not None:
            nxt = torch.full_like(nxt, forced_bos_id)
        if eos_id is not None:
            nxt = torch.where(done, torch.full_like(nxt, eos_id), nxt)
            done = done | (nxt == eos_id)
        out = torch.cat([out, nxt.unsqueeze(1)], dim=1)
        if eos_id is not None and bool(done.all()):
            break
    return out
