"""Every list of families agrees with the catalogue (tinyt/hf/catalogue.py's CATALOGUE): the
CLI's help of import-hf and export-hf, README's and docs' tables, tinyt.hf's names. A family
added to the catalogue and forgotten in one of them fails here, naming the list."""
import re
from pathlib import Path

import pytest

import tinyt.hf as hf
from tinyt.config import BASE_OPTIONS, FAMILY_OPTIONS, GROUPS, ModelConfig
from tinyt.hf import catalogue
from tinyt.hf.family import misfit

ROOT = Path(__file__).resolve().parents[2]


def _help(verb: str) -> str:
    from typer.testing import CliRunner

    from tinyt.app import cli

    text = CliRunner().invoke(cli.app, [verb, "--help"], terminal_width=400).output
    return re.sub(r"[\s│]+", " ", text)  # rich wraps the docstring into a box


@pytest.mark.parametrize("where", ["import-hf --help", "export-hf --help", "README.md",
                                   "docs/model.md|docs/encoders.md"])
def test_every_catalogue_class_is_in_each_list(where):
    if where.endswith("--help"):
        text = _help(where.split()[0])
    else:
        text = " ".join((ROOT / doc).read_text() for doc in where.split("|"))
    missing = [f.architecture for f in catalogue.CATALOGUE if f.architecture not in text]
    assert not missing, f"{where} leaves out {missing}"


def test_tinyt_hf_names_every_entry():
    entries = {name for name, v in vars(catalogue).items() if isinstance(v, hf.Family)}
    assert {f for f in entries} == {name for name in hf.__all__
                                    if isinstance(getattr(hf, name), hf.Family)}
    assert len(entries) == len(catalogue.CATALOGUE)


def test_family_options_are_every_field_beyond_the_base_ones_at_their_defaults():
    """A new ModelConfig field is a family option by default: no catalogue entry writes a
    model using it until the entry says it holds it (a named refusal, never another class)."""
    import dataclasses

    fields = {f.name: f for f in dataclasses.fields(ModelConfig)}
    assert set(FAMILY_OPTIONS) == set(fields) - BASE_OPTIONS
    assert all(FAMILY_OPTIONS[k] == fields[k].default for k in FAMILY_OPTIONS)
    assert {f.metadata["group"] for f in fields.values()} == set(GROUPS)
    cfg = ModelConfig(norm="rmsnorm", pos_encoding="rotary", activation="swiglu", bias=False,
                      qk_norm="projection", post_norms=True, pre_norms=False)
    assert misfit(catalogue.LLAMA, cfg) == ("a LlamaForCausalLM has no qk_norm='projection', "
                                             "pre_norms=False, post_norms=True")
    assert misfit(catalogue.OLMO2, cfg) is None


def test_a_config_written_before_the_groups_reads_back_the_same():
    """Checkpoints and artifacts carry ModelConfig's flat JSON: the older spelling of qk_norm
    (true / false) and a config without pre_norms read as they always did."""
    old = {"block_size": 64, "vocab_size": 300, "n_layer": 2, "n_head": 4, "n_embd": 64,
           "dropout": 0.0, "bias": False, "pos_encoding": "rotary", "tie_weights": True,
           "task": "causal_lm", "num_labels": 0, "activation": "swiglu", "norm_eps": 1e-6,
           "n_inner": 96, "norm": "rmsnorm", "n_kv_head": 2, "rope_theta": 1e6,
           "qkv_bias": None, "head_size": 32, "qk_norm": True, "rope_scaling": None,
           "sliding_window": None, "full_attention_layers": [], "nope_layers": [],
           "embedding_multiplier": 1.0, "residual_multiplier": 1.0,
           "attention_multiplier": None, "logits_scaling": 1.0, "norm_offset": 0.0,
           "post_norms": False, "attn_softcap": None, "final_softcap": None,
           "rope_local_theta": None, "rotary_dim": None, "norm_placement": "pre",
           "embedding_norm": False, "type_vocab_size": 0, "position_offset": 0,
           "pooling": "mean", "normalize": False, "pooler_activation": None,
           "pooler_norm": False, "first_block_norm": True}  # a Qwen3 import's, before
    cfg = ModelConfig.from_dict(old)
    assert cfg.qk_norm == "head" and cfg.pre_norms and cfg.norms_per_block == 2
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    assert ModelConfig.from_dict({**old, "qk_norm": False}).qk_norm is None
    assert cfg.group("attention")["head_size"] == 32
