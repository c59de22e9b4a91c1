"""Hugging Face directories in and out: `tinyt import-hf` and `tinyt export-hf` (torch).

    HF dir (config.json, model.safetensors | shards, tokenizer files)
        ──import_hf──▶ tinyt checkpoint ──to_hf──▶ HF dir (logits checked, HF_LOGITS_ATOL)

Each architecture is one entry of the catalogue (`CATALOGUE`, assembled in catalogue.py from
one file a family under families/), a frozen `Family` naming its config keys, value
spellings, traits, weight names both ways, readers, refusals and tokenizer kind. Reading,
checks and both tails are shared:

    families/    one file a family (gpt2, llama, gemma, phi3, olmo2, bert, modernbert, bart,
                 marian, m2m100, t5, whisper)
    family.py    the entry's dataclasses; config.json <-> ModelConfig through an entry
    common.py    what several families' config.json files share (rotary keys, windows, the
                 encoder-decoders' keys)
    tensors.py   tinyt's tensors by role: the one table every family's names are written to
    weights.py   safetensors (and shards) in; tensors under an entry's names both ways
    tokens.py    tokenizer files: GPT-2's, and the Hub's tokenizer_config.json kind
    sentence.py  sentence-transformers directories (pooling, normalisation)
    catalogue.py the entries in order, and which one writes a model (writer_for)
    convert.py   import_hf, to_hf and their tails

Options tinyt's model does not implement are refused by name, never approximated.
"""
from tinyt.errors import ConversionError  # what the refusals raise (defined in tinyt.errors)
from tinyt.hf.catalogue import (
    BART,
    BERT,
    CATALOGUE,
    DISTILBERT,
    GEMMA2,
    GEMMA3,
    GPT2,
    GRANITE,
    LLAMA,
    M2M100,
    MARIAN,
    MBART,
    MISTRAL,
    MODERNBERT,
    OLMO2,
    PHI3,
    QWEN2,
    QWEN3,
    ROBERTA,
    SMOLLM3,
    T5,
    WHISPER,
    XLM_ROBERTA,
    encoder_config,
    family_of,
    gpt2_config,
    llama_config,
    seq2seq_config,
    state_from_llama,
    writer_for,
)
from tinyt.hf.convert import HF_LOGITS_ATOL, import_hf, to_hf, to_hf_gpt2
from tinyt.hf.family import Family, Spelling, Weight, config_from_hf, hf_config
from tinyt.hf.weights import hf_state, read_hf_weights, state_from_hf

__all__ = ["BART", "BERT", "CATALOGUE", "DISTILBERT", "GEMMA2", "GEMMA3", "GPT2", "GRANITE",
           "HF_LOGITS_ATOL", "LLAMA", "M2M100", "MARIAN", "MBART", "MISTRAL", "MODERNBERT",
           "OLMO2", "PHI3", "QWEN2", "QWEN3", "ROBERTA", "SMOLLM3", "T5", "WHISPER",
           "XLM_ROBERTA", "ConversionError", "Family", "Spelling", "Weight", "config_from_hf",
           "encoder_config", "family_of", "gpt2_config", "hf_config", "hf_state", "import_hf",
           "llama_config", "read_hf_weights", "seq2seq_config", "state_from_hf",
           "state_from_llama", "to_hf", "to_hf_gpt2", "writer_for"]
