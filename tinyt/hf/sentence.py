"""sentence-transformers directories: the modules around the transformer, as tinyt settings.

    modules.json          Transformer (path "" or a folder), Pooling, Normalize, in order
    1_Pooling/config.json  mean | cls | lasttoken (the legacy booleans or `pooling_mode`)
    sentence_bert_config.json  max_seq_length: where texts are cut (tokens)
    config_sentence_transformers.json  prompts: only with no default prompt (each text as given)

Read into the encoder's `pooling` and `normalize` and the tokenizer's truncation; every other
module (Dense, LayerNorm, WeightedLayerPooling, Router, ...) and every other pooling (max,
mean_sqrt_len, weighted mean, several at once, include_prompt false) is refused by name.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tinyt.errors import CheckpointError, ConversionError
from tinyt.fsutil import read_json_object

MODULES = "modules.json"
# sentence-transformers' names of the pooling modes tinyt runs -> ModelConfig.pooling
POOLING = {"mean": "mean", "cls": "cls", "lasttoken": "last"}
LEGACY = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls",
          "pooling_mode_lasttoken": "lasttoken", "pooling_mode_max_tokens": "max",
          "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
          "pooling_mode_weightedmean_tokens": "weightedmean"}


@dataclass(frozen=True)
class SentenceModules:
    pooling: str  # ModelConfig.pooling
    normalize: bool
    max_seq_length: int | None  # texts cut to this many tokens (None: the model's context)
    transformer: Path  # the folder holding the transformer's config.json and weights


def _kind(entry: dict[str, Any]) -> str:
    """The module's class name, in the legacy (`sentence_transformers.models.Pooling`) and the
    newer (`...modules.pooling.Pooling`) spellings alike."""
    return str(entry.get("type", "")).rsplit(".", 1)[-1]


def _pooling(folder: Path, source: str) -> str:
    cfg = read_json_object(folder / "config.json", CheckpointError)
    if "pooling_mode" in cfg:
        modes = cfg["pooling_mode"]
        modes = [modes] if isinstance(modes, str) else list(modes or [])
    else:
        modes = [mode for key, mode in LEGACY.items() if cfg.get(key)] or ["mean"]
    if len(modes) != 1:
        raise ConversionError(f"{source}: pooling {modes} concatenates several poolings; tinyt "
                              f"pools one way: {', '.join(POOLING)}")
    if modes[0] not in POOLING:
        raise ConversionError(f"{source}: pooling {modes[0]!r} is not implemented by tinyt's "
                              f"encoder; allowed: {', '.join(POOLING)}")
    if cfg.get("include_prompt", True) is False:
        raise ConversionError(f"{source}: include_prompt=false (the prompt's tokens left out "
                              "of the pooling) is not implemented by tinyt's encoder")
    return POOLING[modes[0]]


def read_sentence_modules(directory: Path) -> SentenceModules | None:
    """The modules of a sentence-transformers directory, or None where it has no modules.json."""
    path = directory / MODULES
    if not path.is_file():
        return None
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path} is not JSON: {e}") from None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise CheckpointError(f"{path} must be a list of modules")
    entries = sorted(entries, key=lambda e: int(e.get("idx", 0)))
    kinds = [_kind(e) for e in entries]
    source = str(path)
    if not kinds or kinds[0] != "Transformer":
        raise ConversionError(f"{source}: modules {kinds}; tinyt reads a Transformer first")
    other = [k for k in kinds[1:] if k not in ("Pooling", "Normalize")]
    if other or kinds.count("Pooling") != 1 or kinds[1] != "Pooling" \
            or kinds[2:] not in ([], ["Normalize"]):
        raise ConversionError(f"{source}: modules {kinds}; tinyt runs Transformer, Pooling and "
                              f"an optional Normalize, in that order"
                              + (f" ({', '.join(other)} not implemented)" if other else ""))
    transformer = (directory / str(entries[0].get("path", ""))).resolve()
    if not transformer.is_relative_to(directory.resolve()) or not transformer.is_dir():
        raise CheckpointError(f"{source}: the Transformer's path {entries[0].get('path')!r} is "
                              "not a folder inside the directory")
    pooling = _pooling(directory / str(entries[1].get("path", "1_Pooling")),
                       str(directory / str(entries[1].get("path", "1_Pooling")) / "config.json"))
    st_config = directory / "config_sentence_transformers.json"
    if st_config.is_file():  # a default prompt goes before every text sentence-transformers
        data = read_json_object(st_config, CheckpointError)  # embeds: not in tokenizer.json
        if data.get("default_prompt_name"):
            raise ConversionError(
                f"{st_config}: default_prompt_name={data['default_prompt_name']!r} puts a "
                "prompt before every text, outside the model and its tokenizer; tinyt embeds "
                "texts as given: set it to null and add the prompt to your texts")
    max_len = None
    for folder in (transformer, directory):
        bert_cfg = folder / "sentence_bert_config.json"
        if bert_cfg.is_file():
            data = read_json_object(bert_cfg, CheckpointError)
            if data.get("do_lower_case"):
                raise ConversionError(f"{bert_cfg}: do_lower_case=true lower-cases texts before "
                                      "the tokenizer, outside tokenizer.json; tinyt runs the "
                                      "tokenizer as tokenizer.json defines it")
            value = data.get("max_seq_length")
            if value is not None and not (isinstance(value, int) and value >= 1):
                raise ConversionError(f"{bert_cfg}: max_seq_length={value!r} must be an "
                                      "integer >= 1")
            max_len = value
            break
    return SentenceModules(pooling, kinds[-1] == "Normalize", max_len, transformer)
