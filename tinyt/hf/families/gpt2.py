"""GPT-2 (GPT2LMHeadModel): tinyt's own architecture in another layout.

The same tensor names (a GPT2Model save lacks `transformer.`), its projections `Conv1D`
[in, out], biases always (a bias-free model writes zeros, and the `tinyt` block of config.json
says so), `activation_function` "gelu" the exact erf GELU and "gelu_new" /
"gelu_pytorch_tanh" / "gelu_fast" its tanh form. Learned positions, LayerNorm, fused Conv1D.
"""
from __future__ import annotations

from typing import Any

from tinyt.config import ModelConfig
from tinyt.hf.family import Family, Spelling
from tinyt.hf.tensors import OURS, weights
from tinyt.hf.tokens import gpt2_special_tokens, read_gpt2_tokenizer


def gpt2_misfit(cfg: ModelConfig) -> str | None:
    unmapped = [o for o in cfg.llama_options if not o.startswith("pos_encoding")]
    if unmapped:  # (positions have their own message below)
        return (f"it uses Llama-family options ({', '.join(unmapped)}) that GPT2LMHeadModel "
                "does not have")
    if cfg.pos_encoding != "learned":
        return (f"it has {cfg.pos_encoding} positions: GPT-2 learns its position table "
                "(pos_encoding='learned'), and a computed table written into it would not "
                "come back as the same model")
    return None


def gpt2_written(cfg: ModelConfig, eos_id: int | None) -> dict[str, Any]:
    return {"n_ctx": cfg.block_size, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
            "bos_token_id": eos_id, "pad_token_id": eos_id}  # GPT-2's <|endoftext|> is all three


_SAME = ("token_embd", "pos_embd", "output_norm", "output", "attn_norm", "ffn_norm")
_CONV1D = ("attn_qkv", "attn_out", "ffn_up", "ffn_down")
GPT2_WEIGHTS = weights({role: OURS[role] for role in _SAME + _CONV1D}, conv1d=_CONV1D)

GPT2 = Family(
    model_type="gpt2", architecture="GPT2LMHeadModel",
    keys={"n_layer": "n_layer", "n_head": "n_head", "n_embd": "n_embd",
          "n_positions": "block_size", "vocab_size": "vocab_size",
          "layer_norm_epsilon": "norm_eps", "n_inner": "n_inner",
          "tie_word_embeddings": "tie_weights"},
    defaults={"n_inner": None, "tie_word_embeddings": True},  # n_inner None = 4 * n_embd in both
    spelled={"activation_function": Spelling("activation", {
        "gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
        "gelu_fast": "gelu_tanh"}, default="gelu_new")},
    features={"norm": "layernorm", "pos_encoding": "learned"},
    fixed={"scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
           "add_cross_attention": False, "scale_attn_weights": True},
    misfit=gpt2_misfit,
    weights=GPT2_WEIGHTS, base="transformer.",
    buffers=(".attn.bias", ".attn.masked_bias"),  # causal-mask buffers of older saves
    zero_biases=True,
    read_tokenizer=read_gpt2_tokenizer, special_tokens=gpt2_special_tokens,
    written=gpt2_written,
)
