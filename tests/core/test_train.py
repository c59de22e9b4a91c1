import dataclasses
import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from tinyt.checkpoint import MODEL_FILE, load_checkpoint, save_checkpoint, unique_state_dict
from tinyt.config import ModelConfig, TrainConfig
from tinyt.errors import CheckpointError, ConfigError, DataError
from tinyt.train import lr_at, make_optimizer, train

QUIET = dict(log=lambda s: None)


def weights(path):
    return load_file(str(path / MODEL_FILE))


def test_lr_schedule_warmup_then_cosine():
    cfg = TrainConfig(max_steps=100, warmup_steps=10, learning_rate=1.0, min_lr=0.1)
    assert lr_at(0, cfg) == pytest.approx(0.1)
    assert lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(55, cfg) == pytest.approx(0.55)  # halfway down the cosine
    assert lr_at(100, cfg) == pytest.approx(0.1)
    assert all(lr_at(s, cfg) >= lr_at(s + 1, cfg) for s in range(10, 100))


def test_weight_decay_on_matrices_only():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    decay, no_decay = make_optimizer(model, TrainConfig(weight_decay=0.1)).param_groups
    assert all(p.dim() == 2 for p in decay["params"]) and decay["weight_decay"] == 0.1
    assert len(no_decay["params"]) == 3 and no_decay["weight_decay"] == 0.0


def test_training_lowers_validation_loss(tiny_ckpt):
    meta = json.loads((tiny_ckpt / "config.json").read_text())
    ckpt = load_checkpoint(tiny_ckpt)
    assert meta["metrics"]["step"] == 8 and meta["metrics"]["tokens_per_s"] > 0
    assert meta["metrics"]["val_loss"] < math.log(ckpt.config.vocab_size) - 0.5
    assert 0 < meta["metrics"]["val_nats_per_byte"] < meta["metrics"]["val_loss"]
    assert ckpt.config.vocab_size == ckpt.tokenizer.vocab_size  # the model got the real size


def test_checkpoint_round_trip_and_tied_matrix_stored_once(tiny_ckpt, tmp_path):
    ckpt = load_checkpoint(tiny_ckpt)
    stored = weights(tiny_ckpt)
    assert "lm_head.weight" not in stored and "transformer.wte.weight" in stored
    assert ckpt.model.lm_head.weight is ckpt.model.transformer.wte.weight
    save_checkpoint(tmp_path / "again", ckpt.model, ckpt.tokenizer)
    again = load_checkpoint(tmp_path / "again")
    x = torch.randint(0, ckpt.config.vocab_size, (2, 9))
    assert torch.equal(ckpt.model(x)[0], again.model(x)[0])


def test_training_is_deterministic(tiny_cfgs, corpus_dir, tmp_path):
    m, t = tiny_cfgs
    t = dataclasses.replace(t, max_steps=4)
    train(m, t, tmp_path / "a", data=str(corpus_dir), **QUIET)
    train(m, t, tmp_path / "b", data=str(corpus_dir), **QUIET)
    a, b = weights(tmp_path / "a"), weights(tmp_path / "b")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_continues_the_same_run(tiny_cfgs, corpus_dir, tmp_path):
    m, t = tiny_cfgs
    m = dataclasses.replace(m, dropout=0.1)  # the torch RNG state must come back too
    train(m, t, tmp_path / "straight", data=str(corpus_dir), **QUIET)
    train(m, t, tmp_path / "split", data=str(corpus_dir), stop_after=4, **QUIET)
    half = json.loads((tmp_path / "split" / "config.json").read_text())
    assert half["metrics"]["step"] == 4
    train(m, t, tmp_path / "split", resume=True, **QUIET)
    a, b = weights(tmp_path / "straight"), weights(tmp_path / "split")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs after resume"
    sa = load_file(str(tmp_path / "straight" / "train_state.safetensors"))
    sb = load_file(str(tmp_path / "split" / "train_state.safetensors"))
    assert all(torch.equal(sa[k], sb[k]) for k in sa)  # optimizer moments and RNG too


def test_refuses_to_overwrite_a_run(tiny_cfgs, corpus_dir, tiny_ckpt):
    m, t = tiny_cfgs
    with pytest.raises(ConfigError, match="is not empty; pass --resume"):
        train(m, t, tiny_ckpt, data=str(corpus_dir), **QUIET)


def test_resume_needs_a_saved_run(tiny_cfgs, tmp_path):
    m, t = tiny_cfgs
    with pytest.raises(CheckpointError, match="does not exist"):
        train(m, t, tmp_path / "none", resume=True, **QUIET)


def test_failed_run_leaves_no_checkpoint(tiny_cfgs, tmp_path):
    m, t = tiny_cfgs
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="empty holds no readable UTF-8 text files"):
        train(m, t, tmp_path / "out", data=str(tmp_path / "empty"), **QUIET)
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["empty"]  # no temporary leftovers


def test_interrupted_save_leaves_previous_checkpoint(tiny_ckpt, tmp_path, monkeypatch):
    import shutil

    import tinyt.checkpoint as C
    target = tmp_path / "ck"
    shutil.copytree(tiny_ckpt, target)
    before = weights(target)
    ckpt = load_checkpoint(target)

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(C, "write_json", boom)  # dies after the weights are written
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(target, ckpt.model, ckpt.tokenizer)
    after = weights(target)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def test_bad_checkpoints_are_named(tiny_ckpt, tmp_path):
    import shutil
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nope")
    broken = tmp_path / "broken"
    shutil.copytree(tiny_ckpt, broken)
    (broken / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match="missing tokenizer.json"):
        load_checkpoint(broken)

    shape = tmp_path / "shape"
    shutil.copytree(tiny_ckpt, shape)
    meta = json.loads((shape / "config.json").read_text())
    meta["model"]["n_embd"] = 64
    (shape / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="shapes that do not match.*transformer.wte.weight"):
        load_checkpoint(shape)

    corrupt = tmp_path / "corrupt"
    shutil.copytree(tiny_ckpt, corrupt)
    (corrupt / MODEL_FILE).write_bytes(b"\x00" * 50)
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_checkpoint(corrupt)

    extra = tmp_path / "extra"
    shutil.copytree(tiny_ckpt, extra)
    tensors = weights(extra)
    tensors["transformer.h.9.mlp.c_fc.weight"] = torch.zeros(2)
    save_file(tensors, str(extra / MODEL_FILE))
    with pytest.raises(CheckpointError, match=r"unexpected \['transformer.h.9.mlp.c_fc.weight'\]"):
        load_checkpoint(extra)


def test_unique_state_dict_drops_only_aliases():
    torch.manual_seed(0)
    from tinyt.model import TinyTransformer
    m = TinyTransformer(ModelConfig(block_size=8, vocab_size=50, n_layer=1, n_head=1, n_embd=8,
                                    tie_weights=False))
    assert "lm_head.weight" in unique_state_dict(m)


def test_classifier_training(labelled_dir, tmp_path):
    m = ModelConfig(block_size=48, vocab_size=300, n_layer=1, n_head=2, n_embd=32,
                    task="classifier", num_labels=2)
    t = TrainConfig(max_steps=30, batch_size=16, warmup_steps=3, eval_interval=30,
                    learning_rate=3e-3, min_lr=3e-4)
    train(m, t, tmp_path / "clf", data=str(labelled_dir), **QUIET)
    ckpt = load_checkpoint(tmp_path / "clf")
    meta = json.loads((tmp_path / "clf" / "config.json").read_text())
    assert ckpt.labels == ["maths", "strings"]
    assert meta["metrics"]["val_accuracy"] >= 0.9  # the two labels differ in every line
