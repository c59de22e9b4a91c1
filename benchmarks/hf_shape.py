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
# Encoder-decoders (the seq2seq peer benchmark, benchmarks/peers/seq2seq_peers.py). Their
# generation settings are left out (Opus-MT's num_beams 4, bad_words_ids, forced_eos_token_id):
# every engine is given them per call, and forcing </s> at the length limit is a rule tinyt's
# import does not carry. Helsinki-NLP/opus-mt-en-de's config.json: 6 + 6 layers, 512 wide, 8
# heads, FFN 2048, 58,101 ids (</s> 0, <unk> 1, <pad> 58,100 the decoder's start), 512 static
# sinusoid positions, scale_embedding, swish, one table for both stacks and the head. Its
# weights N(0, 0.05), not MarianConfig's 0.02: at 0.02 attention is near uniform and the fed
# token's embedding (times sqrt(512), tied to the head) outweighs every layer, so all 16 sources
# of the peers' check gave one token repeated; at 0.05 the tokens differ by source (T5's own
# init gives that). At 0.1, optimize's own check refused the fused graphs (0.0118 on the
# decoder's logits, padded source, against a bound of 0.0034; 8.3e-6 at 0.05)
SHAPES["opus-mt-en-de"] = ("MarianConfig", "MarianMTModel", dict(
    vocab_size=58101, decoder_vocab_size=58101, d_model=512, encoder_layers=6, decoder_layers=6,
    encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048,
    decoder_ffn_dim=2048, max_position_embeddings=512, scale_embedding=True,
    static_position_embeddings=True, activation_function="swish",
    share_encoder_decoder_embeddings=True, normalize_before=False, pad_token_id=58100,
    decoder_start_token_id=58100, eos_token_id=0, forced_eos_token_id=None, init_std=0.05))
# google/flan-t5-small's config.json: 8 + 8 layers, 512 wide, 6 heads of d_kv 64 (384, not
# 512), gated-gelu d_ff 1024, an lm_head of its own, 32 buckets to distance 128, 32,128 ids
# (<pad> 0 the decoder's start, </s> 1, <unk> 2)
SHAPES["flan-t5-small"] = ("T5Config", "T5ForConditionalGeneration", dict(
    vocab_size=32128, d_model=512, d_kv=64, d_ff=1024, num_layers=8, num_decoder_layers=8,
    num_heads=6, relative_attention_num_buckets=32, relative_attention_max_distance=128,
    feed_forward_proj="gated-gelu", tie_word_embeddings=False, layer_norm_epsilon=1e-6,
    n_positions=512, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0))
# the same settings at a test's size (the seq2seq peers' tests and README test)
# (Opus-MT's at width 64 with N(0, 0.1): at 0.05 every source gave one output there, as 0.02 at
# width 512)
SHAPES["opus-mt-test"] = ("MarianConfig", "MarianMTModel", {
    **SHAPES["opus-mt-en-de"][2], "vocab_size": 512, "decoder_vocab_size": 512, "d_model": 64,
    "encoder_layers": 2, "decoder_layers": 2, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128,
    "pad_token_id": 511, "decoder_start_token_id": 511, "init_std": 0.1})
SHAPES["flan-t5-test"] = ("T5Config", "T5ForConditionalGeneration", {
    **SHAPES["flan-t5-small"][2], "vocab_size": 512, "d_model": 64, "d_kv": 16, "d_ff": 128,
    "num_layers": 2, "num_decoder_layers": 2})
# an encoder-decoder's special pieces: (first ids, last ids), as its SentencePiece vocabulary
SEQ2SEQ = {"opus-mt-en-de": (("</s>", "<unk>"), ("<pad>",)),
           "flan-t5-small": (("<pad>", "</s>", "<unk>"), ())}
SEQ2SEQ.update({"opus-mt-test": SEQ2SEQ["opus-mt-en-de"],
                "flan-t5-test": SEQ2SEQ["flan-t5-small"]})

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
    if name in SEQ2SEQ:
        if layers is not None:
            raise SystemExit(f"--layers: {name} is an encoder-decoder; its shapes are whole")
        return save_seq2seq(name, out, seed)
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


def save_seq2seq(name: str, out: Path, seed: int = 0) -> Path:
    """An encoder-decoder of shape `name` at `out`: transformers' own initialization, a
    SentencePiece-like Unigram tokenizer.json (`_unigram`) with the real model's special ids,
    the padding rows zero (as save's) and the head's </s> row zero: every engine's greedy and
    beams then run to the length asked (a random model ends at a random step otherwise; a
    zero row's logit, 0, is below the largest of thousands of random ones)."""
    import torch
    import transformers as T

    config_class, model_class, settings = SHAPES[name]
    first, last = SEQ2SEQ[name]
    size = settings["vocab_size"]
    reach = min(TOKENIZER_VOCAB, size)
    tok = _unigram(first, last, size, reach)
    config = getattr(T, config_class)(**settings)
    torch.manual_seed(seed)
    model = getattr(T, model_class)(config).eval()
    eos = settings["eos_token_id"]
    with torch.no_grad():
        for table in {id(t): t for t in (model.get_input_embeddings().weight,
                                         model.get_output_embeddings().weight)}.values():
            table[reach:] = 0
        model.get_output_embeddings().weight[eos] = 0  # tied (Marian): the source's </s> too
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "</s>",
        "unk_token": "<unk>", "pad_token": "<pad>", "model_max_length": 512}))
    return out


def _unigram(first: tuple[str, ...], last: tuple[str, ...], size: int, reach: int):
    """A Unigram tokenizer.json as SentencePiece models convert (Metaspace, "$A </s>") of
    `size` ids: the special pieces `first`, then characters and the standard library's
    commonest words up to `reach` ids, then unreachable `<unused_N>` entries, then `last`
    (Marian's <pad>, its final id)."""
    import re
    from collections import Counter

    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, processors

    words = Counter(w for p in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:200]
                    for w in re.findall(r"[A-Za-z]+", p.read_text(encoding="utf-8",
                                                                  errors="replace")))
    chars = sorted({c for w in words for c in w} | set(".,:;!?'\"()-0123456789"))
    pieces = [(p, 0.0) for p in first]
    pieces += [(c, -10.0) for c in chars] + [("\u2581" + c, -9.0) for c in chars]
    have = {p for p, _ in pieces}
    common = [w for w, _ in words.most_common() if "\u2581" + w not in have]
    room = reach - len(pieces) - (len(last) if reach == size else 0)  # the last ids: `last`'s
    pieces += [("\u2581" + w, -1.0 - i / 1e4) for i, w in enumerate(common[:room])]
    pieces += [(f"<unused_{i}>", -100.0) for i in range(len(pieces), size - len(last))]
    pieces += [(p, 0.0) for p in last]
    tok = HFTokenizer(models.Unigram(pieces, unk_id=first.index("<unk>"), byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", first.index("</s>"))])
    tok.add_special_tokens([*first, *last])
    if tok.get_vocab_size() != size:
        raise ValueError(f"the tokenizer has {tok.get_vocab_size()} ids, the model {size}")
    return tok


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
