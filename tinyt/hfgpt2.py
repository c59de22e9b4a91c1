"""A tinyt causal-LM checkpoint as a Hugging Face GPT-2 directory (torch, transformers).

    checkpoint/ ──load──▶ GPT2LMHeadModel (same weights) ──logits check──▶ out/
        config.json, model.safetensors, tokenizer.json, tokenizer_config.json

The architectures are the same, with three differences of form:
- HF GPT-2's projections are `Conv1D`, weight [in, out]: c_attn, c_proj and c_fc transposed;
- `activation_function="gelu"` is the exact erf GELU tinyt uses (HF's "gelu_new" is the tanh
  approximation), `layer_norm_epsilon` 1e-5 as torch's LayerNorm;
- GPT-2 has learned positions and biases everywhere: a sinusoidal tinyt model gets its table
  written into `wpe`, a bias-free one gets zero biases — the same function either way.
The directory is what CTranslate2's `TransformersConverter`, llama.cpp's converter and
`transformers` itself read. Before it is written, its logits are checked against tinyt's
(HF_LOGITS_ATOL) on a prompt of block_size tokens.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from tinyt.checkpoint import load_checkpoint
from tinyt.errors import TinytError
from tinyt.fsutil import atomic_dir, write_json

HF_LOGITS_ATOL = 1e-4
TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


class ConversionError(TinytError, ValueError):
    """The checkpoint cannot be written as a Hugging Face GPT-2 model."""


def gpt2_config(cfg, eos_id: int | None) -> dict:
    return {
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
        "n_embd": cfg.n_embd, "n_head": cfg.n_head, "n_layer": cfg.n_layer,
        "n_inner": 4 * cfg.n_embd, "vocab_size": cfg.vocab_size,
        "n_positions": cfg.block_size, "n_ctx": cfg.block_size,
        "activation_function": "gelu", "layer_norm_epsilon": 1e-5,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
        "scale_attn_weights": True, "tie_word_embeddings": True,
        "bos_token_id": eos_id, "eos_token_id": eos_id, "pad_token_id": eos_id,
        "torch_dtype": "float32",
    }


def gpt2_state_dict(model, cfg) -> dict[str, torch.Tensor]:
    """tinyt's weights under GPT-2's names and layouts."""
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    out = {}
    for name, tensor in sd.items():
        if name == "lm_head.weight":
            continue  # tied: GPT2LMHeadModel takes it from wte
        if name.endswith(TRANSPOSED):
            tensor = tensor.t().contiguous()  # Linear [out, in] -> Conv1D [in, out]
        out[name] = tensor
    if cfg.pos_encoding != "learned":  # the sinusoidal table as learned positions
        pos = torch.arange(cfg.block_size).unsqueeze(0)
        out["transformer.wpe.weight"] = model.transformer.wpe(pos)[0].detach().clone()
    for i in range(cfg.n_layer):  # a bias-free model: zero biases, the same function
        p = f"transformer.h.{i}."
        shapes = {"ln_1.bias": cfg.n_embd, "ln_2.bias": cfg.n_embd,
                  "attn.c_attn.bias": 3 * cfg.n_embd, "attn.c_proj.bias": cfg.n_embd,
                  "mlp.c_fc.bias": 4 * cfg.n_embd, "mlp.c_proj.bias": cfg.n_embd}
        for k, n in shapes.items():
            out.setdefault(p + k, torch.zeros(n))
    out.setdefault("transformer.ln_f.bias", torch.zeros(cfg.n_embd))
    return out


def to_hf_gpt2(checkpoint_dir: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Write a tinyt causal-LM checkpoint as a Hugging Face GPT-2 directory; returns out_dir."""
    from transformers import GPT2Config, GPT2LMHeadModel

    ckpt = load_checkpoint(checkpoint_dir)
    cfg = ckpt.config
    if cfg.task != "causal_lm" or not cfg.tie_weights:
        raise ConversionError(f"{checkpoint_dir}: only causal LMs with a tied lm_head map onto "
                              f"GPT2LMHeadModel (task={cfg.task!r}, tie_weights={cfg.tie_weights})")
    eos = ckpt.tokenizer.eos_id
    hf_cfg = gpt2_config(cfg, eos)
    hf = GPT2LMHeadModel(GPT2Config(**hf_cfg)).eval()
    missing, unexpected = hf.load_state_dict(gpt2_state_dict(ckpt.model, cfg), strict=False)
    missing = [k for k in missing if not k.endswith((".attn.bias", ".attn.masked_bias"))
               and k != "lm_head.weight"]
    if missing or unexpected:
        raise ConversionError(f"weights did not map: missing {missing}, unexpected {unexpected}")
    hf.tie_weights()
    ids = torch.randint(0, cfg.vocab_size, (2, cfg.block_size),
                        generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = ckpt.model.eval()(ids)[0]
        got = hf(ids).logits
    worst = float((want - got).abs().max())
    if not worst <= HF_LOGITS_ATOL:
        raise ConversionError(f"the GPT-2 model's logits differ from tinyt's by {worst:.3g} "
                              f"(allowed {HF_LOGITS_ATOL})")
    with atomic_dir(out_dir) as tmp:
        hf.save_pretrained(tmp, safe_serialization=True)
        ckpt.tokenizer.save(tmp / "tokenizer.json")
        special = {"eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>",
                   "unk_token": "<|endoftext|>"} if eos is not None else {}
        write_json(tmp / "tokenizer_config.json", {
            "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": cfg.block_size,
            **special})
        meta = json.loads((tmp / "config.json").read_text())
        meta["tinyt"] = {"source": str(Path(checkpoint_dir).resolve()),
                         "logits_max_abs_diff": worst}
        write_json(tmp / "config.json", meta)
    return Path(out_dir)
