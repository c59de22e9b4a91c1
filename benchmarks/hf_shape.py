"""A random-weight Hugging Face directory at a real model's shape and settings, saved by
transformers (no download): the input of the chain and of the peer benchmark at real shapes.

    python -m tinyt.benchmarks.hf_shape qwen3-0.6b DIR     # then: tinyt import-hf DIR CK

The shapes are the real config.json files' (layers, widths, heads, head_dim, vocabulary, rope
settings, context, tie); the weights are N(0, 0.02), what transformers' init gives, so the
files have the real sizes. The tokenizer is byte-level BPE trained on the standard library
(the corpus every machine has) to `TOKENIZER_VOCAB` ids (or the whole vocabulary where it is
smaller), fewer than the real models' vocabularies; the rest of the table is padding its rows
zero. The tokenizer still covers the whole table, as the real models' do (their reserved or
unused tokens): the ids past the trained ones are vocabulary entries `<unused_N>` that no merge
makes, so no text reaches them. A converter that sizes the table by the tokenizer (llama.cpp's
Gemma 3 path cuts the embedding to the tokenizer's entries while writing a vocabulary padded to
the config's) then sees the real model's sizes. tinyt never samples padding; the peers' greedy loops
take the argmax of the whole table, and with random rows there (a random model's logits are
near-uniform) most of their tokens were padding ids no other engine chose — 0% agreement at
a KL of 2e-13 for the builder's fp32, the first time the peers ran at this shape. A zero row's
logit is 0, below the largest of thousands of random ones: every engine then chooses among
the tokenizer's ids.
"""
from __future__ import annotations

import argparse
import json
import sysconfig
from pathlib import Path

TOKENIZER_VOCAB = 8192
SHAPES: dict[str, tuple[str, str, dict]] = {
    # Qwen/Qwen3-0.6B's config.json
    "qwen3-0.6b": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, use_sliding_window=False, sliding_window=None,
        max_window_layers=28)),
    # meta-llama/Llama-3.2-1B's config.json
    "llama-3.2-1b": ("LlamaConfig", "LlamaForCausalLM", dict(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64,
        max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        tie_word_embeddings=True)),
    # google/gemma-3-270m's config.json: 18 layers, every 6th global (the rest a window of
    # 512 with their own rope base), 4 / 1 heads of 256, the tied 262,144 x 640 table
    "gemma-3-270m": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
        num_attention_heads=4, num_key_value_heads=1, head_dim=256,
        max_position_embeddings=32768, rope_theta=1000000.0, rope_local_base_freq=10000.0,
        rope_scaling=None, sliding_window=512, query_pre_attn_scalar=256, rms_norm_eps=1e-6,
        hidden_activation="gelu_pytorch_tanh", final_logit_softcapping=None,
        attn_logit_softcapping=None, attention_bias=False,
        layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                     for i in range(18)],
        tie_word_embeddings=True, pad_token_id=0)),
    # microsoft/Phi-4-mini-instruct's config.json: 32 layers, 3072 wide, 24 / 8 heads of 128 of
    # which 96 rotate, LongRoPE from 4,096 to 131,072 (its factors), the tied 200,064 x 3072
    # table. 3.8 B weights: a whole chain needs ~4x its 15 GB of fp32 (`--layers` cuts depth)
    "phi-4-mini": ("Phi3Config", "Phi3ForCausalLM", dict(
        vocab_size=200064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
        num_attention_heads=24, num_key_value_heads=8, max_position_embeddings=131072,
        original_max_position_embeddings=4096, rope_theta=10000.0, partial_rotary_factor=0.75,
        rope_scaling={"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [
            1, 1.118320672, 1.250641126, 1.398617824, 1.564103225, 1.74916897, 1.956131817,
            2.187582649, 2.446418898, 2.735880826, 3.059592084, 3.421605075, 3.826451687,
            4.279200023, 4.785517845, 5.351743533, 5.984965424, 6.693110555, 7.485043894,
            8.370679318, 9.36110372, 10.4687158, 11.70738129, 13.09260651, 14.64173252,
            16.37415215, 18.31155283, 20.47818807, 22.90118105, 25.61086418, 28.64115884,
            32.03, 32.1, 32.13, 32.23, 32.6, 32.61, 32.64, 32.66, 32.7, 32.71, 32.93, 32.97,
            33.28, 33.49, 33.5, 44.16, 47.77]},
        sliding_window=262144, rms_norm_eps=1e-5, hidden_act="silu",
        tie_word_embeddings=True, pad_token_id=None)),
}
# Qwen3-0.6B's settings (context, rope, head_dim 128, q/k norms, tie) at a test's size: what
# the README test runs the chain on
SHAPES["qwen3-test"] = ("Qwen3Config", "Qwen3ForCausalLM", {
    **SHAPES["qwen3-0.6b"][2], "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_window_layers": 2})

# Llama-3.2-1B's settings (131,072-token context, llama3 rope scaling, head_dim 64, tie) at a
# test's size: what the README test runs its peer commands on
SHAPES["llama-3.2-test"] = ("LlamaConfig", "LlamaForCausalLM", {
    **SHAPES["llama-3.2-1b"][2], "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16})

# Gemma-3-270M's settings (window 512 with every 6th layer global, two rope bases, one KV head,
# q/k norms, the 32,768-token context, tie) at a test's size: six layers, one of them global
SHAPES["gemma-3-test"] = ("Gemma3TextConfig", "Gemma3ForCausalLM", {
    **SHAPES["gemma-3-270m"][2], "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32,
    "query_pre_attn_scalar": 32,
    "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                    for i in range(6)]})

# Phi-4-mini's settings (LongRoPE from 4,096 to 131,072 with its factors, 96 of 128 dims
# rotating, tie) at a test's size: heads of 128 as the real model's, two layers
# tokenizer_config.json's class where the real model's is not PreTrainedTokenizerFast and a
# consumer reads it: llama.cpp's converter takes a Phi-3 directory's vocabulary from
# tokenizer.model (SentencePiece, Phi-3's) unless the class is GPT2Tokenizer (Phi-4-mini's)
TOKENIZER_CLASS = {"phi-4-mini": "GPT2Tokenizer", "phi-4-mini-test": "GPT2Tokenizer"}
SHAPES["phi-4-mini-test"] = ("Phi3Config", "Phi3ForCausalLM", {
    **SHAPES["phi-4-mini"][2], "vocab_size": 512, "hidden_size": 256, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1})


def save(name: str, out: Path, seed: int = 0, layers: int | None = None) -> Path:
    """The directory of shape `name` at `out`; `layers`: fewer layers than the real model (the
    rest of the shape and settings unchanged), where the whole one does not fit a machine."""
    import torch
    import transformers as T

    from tinyt.tokenizer import Tokenizer

    config_class, model_class, settings = SHAPES[name]
    if layers is not None:
        if not 1 <= layers <= settings["num_hidden_layers"]:
            raise SystemExit(f"--layers {layers}: {name} has 1 to "
                             f"{settings['num_hidden_layers']} layers")
        settings = {**settings, "num_hidden_layers": layers}
        if "layer_types" in settings:  # the real model's first layers
            settings["layer_types"] = settings["layer_types"][:layers]
    tok = Tokenizer.train_bpe(
        (p.read_text(encoding="utf-8", errors="replace")
         for p in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:200]),
        min(TOKENIZER_VOCAB, settings["vocab_size"]))
    eos, reach = tok.eos_id, tok.vocab_size
    tok = _cover(tok, settings["vocab_size"])
    config = getattr(T, config_class)(**settings, bos_token_id=eos, eos_token_id=eos)
    torch.manual_seed(seed)
    model = getattr(T, model_class)(config).eval()
    with torch.no_grad():  # the padding rows: zero, so no engine's argmax lands there
        for table in {id(t): t for t in (model.get_input_embeddings().weight,
                                         model.get_output_embeddings().weight)}.values():
            table[reach:] = 0
    model.generation_config.bos_token_id = model.generation_config.eos_token_id = eos
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.hf.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": TOKENIZER_CLASS.get(name, "PreTrainedTokenizerFast"),
        "eos_token": "<|endoftext|>",
        "model_max_length": settings["max_position_embeddings"]}))
    return out


def _cover(tok, vocab_size: int):
    """`tok` with BPE vocabulary entries `<unused_N>` for the ids past its own up to
    `vocab_size`: entries no merge makes, so no text encodes to them."""
    from tokenizers import Tokenizer as HFTokenizer

    from tinyt.tokenizer import Tokenizer

    data = tok.to_json_dict()
    vocab = data["model"]["vocab"]
    taken = set(vocab.values()) | {t["id"] for t in data.get("added_tokens", [])}
    for i in range(vocab_size):
        if i not in taken:
            vocab[f"<unused_{i}>"] = i
    return Tokenizer(HFTokenizer.from_str(json.dumps(data)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=None,
                    help="fewer layers than the real model (the rest of its shape unchanged)")
    args = ap.parse_args()
    print(save(args.shape, args.out, layers=args.layers))


if __name__ == "__main__":
    main()
