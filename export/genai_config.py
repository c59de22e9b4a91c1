"""genai_config.json: what ONNX Runtime GenAI needs to run a tinyt decoder directory unchanged
(torch-free).

GenAI (`onnxruntime_genai`, and its C, C#, Java and mobile APIs) drives the graph itself:
it feeds input_ids, attention_mask, position_ids and the past, and reads logits and the
presents. Type "llama" is GenAI's generic decoder with Optimum's names
(past_key_values.%d.key, present.%d.key), which are tinyt's contract names; type "gpt2"
expects the older combined `past_%d` cache and fails at the first step.
A pinned-shape graph (tinyt package --fixed) is not described: GenAI grows the cache itself.
"""
from __future__ import annotations

import json
from pathlib import Path

from tinyt.config import ModelConfig
from tinyt.contract import DECODER_WITH_PAST
from tinyt.fsutil import write_json

GENAI_CONFIG = "genai_config.json"
GENAI_TYPE = "llama"  # GenAI's generic decoder with Optimum's I/O names


def genai_config(cfg: ModelConfig, *, eos_id: int, model_file: str = "model.onnx") -> dict:
    """The genai_config.json of a KV-cache decoder graph (greedy search by default)."""
    return {
        "model": {
            "type": GENAI_TYPE,
            "bos_token_id": eos_id, "eos_token_id": eos_id, "pad_token_id": eos_id,
            "vocab_size": cfg.vocab_size, "context_length": cfg.block_size,
            "decoder": {
                "filename": model_file,
                "session_options": {"log_id": "tinyt", "provider_options": []},
                "head_size": cfg.head_dim, "hidden_size": cfg.n_embd,
                "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.kv_heads,
                "num_hidden_layers": cfg.n_layer,
                "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                           "position_ids": "position_ids",
                           "past_key_names": "past_key_values.%d.key",
                           "past_value_names": "past_key_values.%d.value"},
                "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                            "present_value_names": "present.%d.value"},
            },
        },
        "search": {"do_sample": False, "num_beams": 1, "max_length": cfg.block_size,
                   "min_length": 0, "past_present_share_buffer": False,
                   "repetition_penalty": 1.0, "temperature": 1.0, "top_k": 1, "top_p": 1.0,
                   "num_return_sequences": 1, "length_penalty": 1.0, "early_stopping": True,
                   "no_repeat_ngram_size": 0, "diversity_penalty": 0.0},
    }


def write_genai_config(directory: Path, cfg: ModelConfig, *, kind: str,
                       model_file: str = "model.onnx", fixed: dict | None = None) -> bool:
    """Write genai_config.json into an artifact directory being built, if GenAI can run its
    graph (a KV-cache decoder with dynamic shapes). The end-of-text id comes from the
    directory's generation_config.json. Returns whether it wrote one."""
    if kind != DECODER_WITH_PAST or fixed:
        return False
    gen = json.loads((Path(directory) / "generation_config.json").read_text(encoding="utf-8"))
    eos = gen.get("eos_token_id")
    # A tokenizer without <|endoftext|> has no end token: -1 matches no token id.
    write_json(Path(directory) / GENAI_CONFIG,
               genai_config(cfg, eos_id=-1 if eos is None else int(eos), model_file=model_file))
    return True
