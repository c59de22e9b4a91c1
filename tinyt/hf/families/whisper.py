"""Whisper (WhisperForConditionalGeneration): OpenAI's speech recogniser, an encoder-decoder
whose source is audio. BART's layout pre-norm (LayerNorm, each stack's final layer_norm, GELU),
with an audio front end in place of the encoder's token table:

    input_features (B, n_mels, 3000)     log-mel, 100 frames a second (runtime/audio.log_mel)
      -> gelu(conv1) -> gelu(conv2, stride 2)  (B, 1500, d_model)    model.encoder.conv1 / conv2
      + embed_positions.weight (1500 rows)     a fixed sinusoid, stored (tinyt: a table)
      -> pre-norm blocks -> layer_norm         the memory the decoder attends over
    decoder: token table + a learned table of max_target_positions (448) rows, pre-norm
      blocks with cross-attention, layer_norm; proj_out tied to the token table

    traits      n_mels (num_mel_bins: 80, large-v3's 128), source_positions
                (max_source_positions), shared_embeddings false (the encoder has no tokens)
    k_proj      no bias, in self- and cross-attention: tinyt's fused q, k, v holds zeros there
                (a key bias shifts every score of a query alike; the softmax cancels it)
    real shapes tiny 4+4 x 384 (6 heads), base 6+6 x 512 (8), small 12+12 x 768 (12),
                large-v3-turbo 32+4 x 1280 (20 heads, 128 mel bins); 51,865 ids (v3: 51,866)

The decoder starts at <|startoftranscript|> (decoder_start_token_id); the end and the padding
are <|endoftext|>. scale_embedding is not read: transformers' Whisper never applies it.
"""
from __future__ import annotations

from typing import Any

from tinyt.config import ModelConfig
from tinyt.errors import ConversionError
from tinyt.hf.common import ACT_FN, SEQ2SEQ_HOLDS, decoder_layers, decoder_start, same_stacks
from tinyt.hf.family import Family
from tinyt.hf.tensors import bart_layout, weights
from tinyt.hf.tokens import read_tokenizer
from tinyt.tokenizer import EOS_TOKEN, Tokenizer

KEYS = {"d_model": "n_embd", "encoder_layers": "n_layer", "encoder_attention_heads": "n_head",
        "encoder_ffn_dim": "n_inner", "max_target_positions": "block_size",
        "vocab_size": "vocab_size", "tie_word_embeddings": "tie_weights",
        "num_mel_bins": "n_mels", "max_source_positions": "source_positions"}
DEFAULTS = {"max_target_positions": 448, "max_source_positions": 1500, "num_mel_bins": 80,
            "tie_word_embeddings": True}
# the parts of the fused q, k, v the class has no tensor for (Family.absent)
NO_K_BIAS = ("self_attn.k_proj.bias", "encoder_attn.k_proj.bias")


def layout() -> dict[str, str | tuple[str, ...]]:
    """BART's names (tinyt/hf/tensors.py) less the encoder's token table and the embeddings'
    norm, with the stem and the head's own name."""
    out = {k: v for k, v in bart_layout("model.").items()
           if k not in ("enc.token_embd", "enc.embd_norm", "dec.embd_norm", "logits_bias")}
    out.update({"enc.conv1": "model.encoder.conv1.{w}", "enc.conv2": "model.encoder.conv2.{w}",
                "output": "proj_out.weight"})
    return out


def read_whisper_tokenizer(directory, hf_cfg: dict[str, Any], log) -> Tokenizer:
    """tokenizer.json (GPT-2's byte-level BPE and Whisper's special tokens as added tokens),
    ending at <|endoftext|>, which is also the padding (pad_token_id)."""
    tok = read_tokenizer(directory, hf_cfg, log)
    pad = hf_cfg.get("pad_token_id")
    if pad is not None and pad != tok.eos_id:
        raise ConversionError(f"{directory}: config.json's pad_token_id={pad} is not the "
                              f"tokenizer's end {tok.eos_token!r} ({tok.eos_id}); Whisper pads "
                              "with its end of text")
    return tok


def special_tokens(tok: Tokenizer) -> dict[str, Any]:
    """tokenizer_config.json's roles as Whisper's: <|endoftext|> the end, begin, unknown and
    padding; transformers' WhisperTokenizer (its prefix tokens, timestamps) the class."""
    end = tok.eos_token or EOS_TOKEN
    return {**tok.settings, "eos_token": end, "bos_token": tok.bos_token or end,
            "unk_token": end, "pad_token": end, "tokenizer_class": "WhisperTokenizer"}


def misfit(cfg: ModelConfig) -> str | None:
    if cfg.n_mels is None:
        return "its source is audio (num_mel_bins), not token ids"
    return None


def written(cfg: ModelConfig, eos_id: int | None) -> dict[str, Any]:
    return {"decoder_layers": cfg.decoder_layers, "decoder_attention_heads": cfg.n_head,
            "encoder_ffn_dim": cfg.mlp_width, "decoder_ffn_dim": cfg.mlp_width,
            "decoder_start_token_id": cfg.decoder_start_id, "scale_embedding": False,
            "dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0,
            "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0, "use_cache": True}


WHISPER = Family(
    model_type="whisper", architecture="WhisperForConditionalGeneration",
    keys=KEYS, defaults=DEFAULTS, spelled={"activation_function": ACT_FN},
    features={"task": "seq2seq", "norm": "layernorm", "norm_eps": 1e-5, "bias": True,
              "pos_encoding": "learned", "norm_placement": "pre", "shared_embeddings": False},
    refuses=(same_stacks,),
    reads=(decoder_layers("encoder_layers", "decoder_layers"),
           decoder_start(lambda hf: 50257)),  # WhisperConfig's own default
    holds=SEQ2SEQ_HOLDS | {"n_mels", "source_positions"}, misfit=misfit, written=written,
    weights=weights(layout()), base="model.", head="proj_out.weight", absent=NO_K_BIAS,
    read_tokenizer=read_whisper_tokenizer, special_tokens=special_tokens, task="seq2seq",
)
