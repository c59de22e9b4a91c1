"""Text in, text out with the PyTorch model: a quick look at what a checkpoint learned (a
causal LM continues the prompt; an encoder-decoder maps it, greedily)."""
from __future__ import annotations

import math
from pathlib import Path

import torch

from tinyt.checkpoint import load_checkpoint
from tinyt.errors import ConfigError
from tinyt.model import generate


def sample_text(checkpoint: str | Path, prompt: str, *, max_new_tokens: int = 200,
                temperature: float = 0.8, top_k: int | None = 50, seed: int = 0) -> str:
    """The prompt followed by up to max_new_tokens sampled tokens. The model has no positions
    beyond block_size: a longer prompt is conditioned on its last block_size - 1 tokens, and
    generation stops when the sequence reaches block_size (or at <|endoftext|>)."""
    ckpt = load_checkpoint(checkpoint)
    if ckpt.config.task == "seq2seq":
        if temperature != 0:
            raise ConfigError(f"{checkpoint} is a seq2seq checkpoint: it answers greedily; "
                              f"temperature={temperature} is for a causal_lm (pass 0)")
        return map_text(ckpt, prompt, max_new_tokens=max_new_tokens)
    if ckpt.config.task != "causal_lm":
        raise ConfigError(f"{checkpoint} is a {ckpt.config.task} checkpoint; sampling needs a "
                          "causal_lm or seq2seq one")
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature)
            and temperature >= 0):
        raise ConfigError(f"temperature={temperature} must be a finite number >= 0 (0 = greedy)")
    if top_k is not None and top_k < 1:
        raise ConfigError(f"top_k={top_k} must be >= 1 (or omitted)")
    if max_new_tokens < 0:
        raise ConfigError(f"max_new_tokens={max_new_tokens} must be >= 0")
    ids = ckpt.tokenizer.encode(prompt)
    if not ids:
        raise ConfigError("the prompt is empty; give at least one character")
    block = ckpt.config.block_size
    ids = ids[-(block - 1):] if block > 1 else ids[-1:]
    gen = torch.Generator().manual_seed(seed)
    out = generate(ckpt.model, torch.tensor([ids]), max_new_tokens, temperature=temperature,
                   top_k=top_k, eos_id=ckpt.tokenizer.eos_id, generator=gen,
                   vocab_limit=ckpt.tokenizer.vocab_size)
    return prompt + ckpt.tokenizer.decode(out[0, len(ids):].tolist())


def map_text(ckpt, source: str, *, max_new_tokens: int) -> str:
    """A seq2seq checkpoint's greedy output for `source` (cut to block_size tokens, as in
    training), at most max_new_tokens tokens and no more than its positions hold."""
    from tinyt.seq2seq import greedy
    from tinyt.seq2seq_data import encode_sides, output_text

    if not source:
        raise ConfigError("the source is empty; give at least one character")
    if max_new_tokens < 0:
        raise ConfigError(f"max_new_tokens={max_new_tokens} must be >= 0")
    ids = torch.tensor(encode_sides(ckpt.tokenizer, [source], ckpt.config.block_size))
    out = greedy(ckpt.model, ids, torch.ones_like(ids),
                 max_new_tokens=min(max_new_tokens, ckpt.config.block_size),
                 eos_id=ckpt.tokenizer.eos_id)
    return output_text(ckpt.tokenizer, out[0].tolist())
