"""A small Llama-form ModelConfig and transformers' own Llama / Qwen2 models on random weights:
the references tests/core/test_llama.py, test_hfllama.py and tests/app/test_llama_deploy.py
compare tinyt with."""
import torch

from tinyt.config import ModelConfig
from tinyt.model import build_model

# The same PyTorch kernels on the same weights; tinyt runs q, k, v (and gate, up) as one
# matmul where transformers runs two or three, which sums nothing differently per output but
# may block the GEMM otherwise: ulp-level (measured below 1e-5). A wrong rotary half, head
# grouping or norm moves logits by ~0.1 or more.
HF_ATOL = 1e-4
LLAMA = dict(block_size=64, vocab_size=211, n_layer=2, n_head=4, n_kv_head=2, n_embd=32,
             n_inner=48, pos_encoding="rotary", norm="rmsnorm", activation="swiglu",
             bias=False, norm_eps=1e-6, rope_theta=500.0)


def small_llama(**kw) -> ModelConfig:
    return ModelConfig(**{**LLAMA, **kw})


def from_hf(hf, cfg: ModelConfig):
    """A tinyt model holding a transformers Llama / Qwen2 model's weights, mapped by the
    importer's own code (q, k, v rows stacked into c_attn, gate and up into c_fc)."""
    from tinyt.checkpoint import load_weights
    from tinyt.hf import state_from_llama

    ours = build_model(cfg).eval()
    load_weights(ours, state_from_llama(hf.state_dict(), cfg, "test model"), "test model")
    return ours


def hf_reference(kind: str, cfg: ModelConfig):
    import transformers as T

    common = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.n_embd,
                  intermediate_size=cfg.mlp_width, num_hidden_layers=cfg.n_layer,
                  num_attention_heads=cfg.n_head, num_key_value_heads=cfg.kv_heads,
                  max_position_embeddings=cfg.block_size, rms_norm_eps=cfg.norm_eps,
                  rope_theta=cfg.rope_theta, tie_word_embeddings=cfg.tie_weights,
                  hidden_act="silu", attn_implementation="eager")
    torch.manual_seed(0)
    if kind == "llama":
        model = T.LlamaForCausalLM(T.LlamaConfig(**common, attention_bias=False,
                                                 mlp_bias=False))
    else:
        model = T.Qwen2ForCausalLM(T.Qwen2Config(**common, use_sliding_window=False))
    for p in model.parameters():  # random weights of size, not init's near-zero biases
        torch.nn.init.normal_(p, std=0.2)
    return model.eval()
