import dataclasses

import pytest

from tinyt.config import PRESETS, ModelConfig, TrainConfig, preset
from tinyt.errors import ConfigError


def test_model_config_json_round_trip():
    cfg = ModelConfig(block_size=64, vocab_size=300, n_layer=3, n_head=2, n_embd=48,
                      dropout=0.1, bias=False, pos_encoding="sinusoidal", tie_weights=False)
    again = ModelConfig.from_json(cfg.to_json())
    assert again == cfg
    assert again.head_dim == 24


def test_train_config_json_round_trip():
    cfg = TrainConfig(max_steps=7, batch_size=4, seed=3, tokenizer="byte")
    assert TrainConfig.from_json(cfg.to_json()) == cfg


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        ModelConfig().n_layer = 3  # type: ignore[misc]


@pytest.mark.parametrize("field,value,needle", [
    ("n_layer", 0, "n_layer=0"),
    ("n_head", 3, "n_embd=128 is invalid: must be divisible by n_head=3"),
    ("dropout", 1.0, "dropout=1.0"),
    ("pos_encoding", "alibi", "allowed: learned, sinusoidal, rotary"),
    ("task", "translation", "allowed: causal_lm, classifier, encoder, token_classifier, seq2seq"),
    ("block_size", 2.5, "block_size=2.5"),
    ("bias", "yes", "bias='yes'"),
    ("num_labels", 3, "num_labels=3 is invalid: must be 0 for task='causal_lm'"),
])
def test_model_config_errors_name_the_field(field, value, needle):
    with pytest.raises(ConfigError) as e:
        ModelConfig(**{field: value})
    assert needle in str(e.value)


def test_classifier_needs_labels():
    with pytest.raises(ConfigError, match="num_labels=1 is invalid: a classifier needs"):
        ModelConfig(task="classifier", num_labels=1)
    assert ModelConfig(task="classifier", num_labels=4).num_labels == 4


@pytest.mark.parametrize("kw,needle", [
    (dict(min_lr=1.0, learning_rate=0.1), "min_lr=1.0 is invalid: must be <= learning_rate"),
    (dict(tokenizer="wordpiece"), "allowed: bpe, byte"),
    (dict(device="tpu"), "allowed: cpu, cuda"),
    (dict(batch_size=0), "batch_size=0"),
])
def test_train_config_errors(kw, needle):
    with pytest.raises(ConfigError) as e:
        TrainConfig(**kw)
    assert needle in str(e.value)


def test_unknown_json_field_is_refused():
    with pytest.raises(ConfigError, match=r"unknown ModelConfig field\(s\) \['n_layers'\]"):
        ModelConfig.from_dict({"n_layers": 4})
    with pytest.raises(ConfigError, match="malformed"):
        ModelConfig.from_json("{not json")


def test_presets():
    assert {"test", "demo", "article"} <= set(PRESETS)
    m, t = preset("article")
    assert (m.n_layer, m.n_head, m.n_embd) == (4, 4, 768)  # the seed article's shape
    m, t = preset("test", n_layer=3, max_steps=5)
    assert m.n_layer == 3 and t.max_steps == 5
    with pytest.raises(ConfigError, match="unknown preset 'huge'; available presets: test, demo"):
        preset("huge")
    with pytest.raises(ConfigError, match="unknown setting 'layers'"):
        preset("test", layers=2)
