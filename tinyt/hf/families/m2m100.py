"""M2M100 and NLLB (M2M100ForConditionalGeneration, model_type m2m_100: NLLB-200 is the same
class): BART's layout pre-norm, with each stack's final layer_norm, fairseq's sinusoid for
positions, embeddings scaled by sqrt(d_model), ReLU, no bias on the logits.

    positions   sin then cos at tensor2tensor's spacing 10000^(-i / (d_model/2 - 1))
                ("sinusoidal_fairseq"), a real token's from pad_token_id + 1 (position_offset);
                computed, never stored
    generation  decoder_start_token_id (</s>, 2) is ModelConfig.decoder_start_id; the target
                language is the first token generated, forced: forced_bos_token_id
                (forced_bos_id) where the directory sets one, else a greedy call's choice

transformers numbers the positions from the ids (a <pad> inside a target takes the padding
row); tinyt from the attention mask, which is the same for a right-padded source and a target
without <pad>. M2M100's own tokenizer (sentencepiece.bpe.model) has no tokenizer.json form;
NLLB's has.
"""
from __future__ import annotations

from typing import Any

from tinyt.config import ModelConfig
from tinyt.errors import ConversionError
from tinyt.hf.common import (
    ACT_FN,
    BART_DEFAULTS,
    BART_KEYS,
    SEQ2SEQ_HOLDS,
    bad_words,
    bart_written,
    decoder_layers,
    decoder_start,
    embedding_scale,
    same_stacks,
    scale_misfit,
)
from tinyt.hf.family import Family, Spelling
from tinyt.hf.tensors import bart_layout, bart_shared, weights
from tinyt.hf.tokens import read_seq2seq_tokenizer, seq2seq_special_tokens


def read_positions(hf: dict[str, Any]) -> dict[str, Any]:
    pad = hf.get("pad_token_id", 1)
    if not isinstance(pad, int) or isinstance(pad, bool) or pad < 0:
        raise ConversionError(f"pad_token_id={pad!r} must be an integer >= 0 (M2M100's "
                              "positions start after it)")
    return {"position_offset": pad + 1}


def m2m100_misfit(cfg: ModelConfig) -> str | None:
    if cfg.position_offset < 1:
        return "M2M100's positions start after its padding row (position_offset >= 1)"
    return scale_misfit(cfg)


def m2m100_written(cfg: ModelConfig, eos_id: int | None) -> dict[str, Any]:
    out = {**bart_written(cfg, eos_id), "pad_token_id": cfg.position_offset - 1}
    del out["forced_eos_token_id"]  # M2M100Config has none
    return out


M2M100 = Family(
    model_type="m2m_100", architecture="M2M100ForConditionalGeneration",
    keys=BART_KEYS, defaults=BART_DEFAULTS,
    spelled={"activation_function": Spelling("activation", ACT_FN.names, default="relu")},
    features={"task": "seq2seq", "norm": "layernorm", "norm_eps": 1e-5, "bias": True,
              "pos_encoding": "sinusoidal_fairseq", "norm_placement": "pre",
              "shared_embeddings": True},
    refuses=(same_stacks,),
    reads=(bad_words, decoder_layers("encoder_layers", "decoder_layers"), embedding_scale(True),
           decoder_start(lambda hf: 2), read_positions),  # M2M100Config's </s>
    holds=SEQ2SEQ_HOLDS | {"embedding_multiplier", "position_offset"}, misfit=m2m100_misfit,
    written=m2m100_written,
    weights=weights(bart_layout()), base="model.", shared=bart_shared(),
    read_tokenizer=read_seq2seq_tokenizer, special_tokens=seq2seq_special_tokens,
    task="seq2seq",
)
