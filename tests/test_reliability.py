"""Hostile input: non-finite numbers, configs that disagree with their graph, bad arguments.
Each case here failed (crashed, hung, or answered garbage with exit 0) before it was fixed."""
from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from conftest import TINY_MODEL, TINY_TRAIN, assert_close, run_tinyt
from onnx import numpy_helper
from safetensors.torch import load_file, save_file

import tinyt.runtime as rt
from tinyt.checkpoint import load_checkpoint, save_checkpoint
from tinyt.config import ModelConfig, TrainConfig
from tinyt.errors import CheckpointError, ConfigError, NonFiniteError
from tinyt.fsutil import sha256_file
from tinyt.graphio import GraphError
from tinyt.manifest import ManifestError
from tinyt.runtime.sampling import SamplingParams, next_token


def rehash(directory: Path, *names: str) -> None:
    """Make the manifest agree with edited files, as a careless (or hostile) tool would."""
    manifest = json.loads((directory / "manifest.json").read_text())
    for name in names:
        manifest["files"][name] = {"sha256": sha256_file(directory / name),
                                   "bytes": (directory / name).stat().st_size}
    (directory / "manifest.json").write_text(json.dumps(manifest))


def one_line_error(proc, *needles: str) -> str:
    """The CLI failed with exit 2 and one 'error:' line (no traceback) holding every needle."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])
    return errors[0]


# -- numbers that are not finite ---------------------------------------------------------------
@pytest.mark.parametrize("field", ["learning_rate", "min_lr", "weight_decay", "grad_clip",
                                   "beta1", "beta2"])
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_non_finite_train_settings_are_refused(field, value):
    kw = {**TINY_TRAIN, "min_lr": 0.0, field: value}
    with pytest.raises(ConfigError, match=f"{field}=.*finite"):
        TrainConfig(**kw)


def test_non_finite_dropout_and_cli_lr_are_refused():
    with pytest.raises(ConfigError, match="dropout=nan"):
        ModelConfig(**{**TINY_MODEL, "dropout": math.nan})
    one_line_error(run_tinyt("train", "--preset", "test", "--lr", "inf"),
                   "learning_rate=inf", "finite")


def test_a_diverging_run_stops_and_keeps_its_last_good_checkpoint(corpus_dir, tmp_path):
    out = tmp_path / "ck"
    proc = run_tinyt("train", "--preset", "test", "--data", corpus_dir, "--out", out,
                     "--lr", "1e6", "--eval-interval", "1", "--max-steps", "20")
    line = one_line_error(proc, "training diverged at step", "lower --lr")
    step = int(re.search(r"diverged at step (\d+)", line).group(1))
    assert step >= 2, line  # this rate diverges after a step or two, not at once
    assert f"still holds the checkpoint of step {step - 1}" in line
    ck = load_checkpoint(out)  # the last good one: loads, finite, the step before
    assert ck.meta["metrics"]["step"] == step - 1
    assert all(bool(torch.isfinite(p).all()) for p in ck.model.parameters())


def test_divergence_before_any_checkpoint_writes_nothing(corpus_dir, tmp_path, tiny_cfgs):
    from tinyt.train import train
    model_cfg, train_cfg = tiny_cfgs
    cfg = TrainConfig(**{**train_cfg.to_dict(), "learning_rate": 1e30, "min_lr": 0.0,
                         "eval_interval": 8})
    with pytest.raises(NonFiniteError, match="no checkpoint was written"):
        train(model_cfg, cfg, tmp_path / "ck", data=str(corpus_dir), log=lambda s: None)
    assert not (tmp_path / "ck").exists()


@pytest.fixture()
def nan_ckpt(tiny_ckpt, tmp_path) -> Path:
    """The tiny checkpoint with one NaN in a LayerNorm gain."""
    copy = tmp_path / "nan-ck"
    shutil.copytree(tiny_ckpt, copy)
    tensors = load_file(str(copy / "model.safetensors"))
    tensors["transformer.h.1.ln_2.weight"][3] = math.nan
    save_file(tensors, str(copy / "model.safetensors"))
    return copy


def test_a_checkpoint_with_a_nan_weight_is_refused_by_name(nan_ckpt, tmp_path):
    with pytest.raises(NonFiniteError, match=r"'transformer.h.1.ln_2.weight' has 1 NaN"):
        load_checkpoint(nan_ckpt)
    one_line_error(run_tinyt("export", nan_ckpt, tmp_path / "onnx"),
                   "transformer.h.1.ln_2.weight", "NaN")
    assert not (tmp_path / "onnx").exists()


def test_a_non_finite_model_is_never_saved(tiny_ckpt, tmp_path):
    ck = load_checkpoint(tiny_ckpt)
    with torch.no_grad():
        ck.model.transformer.wpe.weight[0, 0] = math.inf
    with pytest.raises(NonFiniteError, match=r"refusing to write .*wpe.weight' has 1 \+inf"):
        save_checkpoint(tmp_path / "out", ck.model, ck.tokenizer)
    assert not (tmp_path / "out").exists()


def _poisoned(lm_onnx: Path, tmp_path: Path, name: str, index, value=math.nan) -> Path:
    """A copy of an exported artifact whose initializer `name` holds `value` at `index`, with
    a manifest that agrees (the file was changed by someone who re-hashed it)."""
    copy = tmp_path / f"poisoned-{name}"
    shutil.copytree(lm_onnx, copy)
    model = onnx.load(str(copy / "model.onnx"))
    init = next(t for t in model.graph.initializer if t.name == name)
    array = numpy_helper.to_array(init).copy()
    array[index] = value
    init.CopyFrom(numpy_helper.from_array(array, name))
    onnx.save(model, str(copy / "model.onnx"))
    rehash(copy, "model.onnx")
    return copy


def test_onnx_stages_refuse_non_finite_weights_by_name(lm_onnx, tmp_path):
    from tinyt.export.optimize import optimize
    from tinyt.export.package import package
    from tinyt.export.quantize import quantize
    bad = _poisoned(lm_onnx, tmp_path, "model.transformer.h.0.ln_1.bias", 2, math.inf)
    for stage in (optimize, quantize, package):
        with pytest.raises(NonFiniteError, match=r"'model.transformer.h.0.ln_1.bias' has 1 \+inf"):
            stage(bad, tmp_path / stage.__name__)
        assert not (tmp_path / stage.__name__).exists()
    one_line_error(run_tinyt("quantize", bad, tmp_path / "q"), "ln_1.bias", "+inf")
    # Loading it runs one probe step: logits that are not finite refuse the artifact.
    with pytest.raises(NonFiniteError, match="non-finite logits on a probe input"):
        rt.load(bad)


def test_generation_stops_with_a_clear_error_on_non_finite_logits(lm_onnx, tmp_path):
    # A NaN in position 5's row passes the load-time probe (it runs the last position) and
    # reaches the logits only once a sequence gets there.
    bad = _poisoned(lm_onnx, tmp_path, "model.transformer.wpe.weight", (5, 0))
    lm = rt.load(bad, threads=1)
    assert lm.generate_details(["ab"], max_new_tokens=2, temperature=0)[0].token_ids
    for kw in ({"temperature": 0}, {"temperature": 0.8, "top_k": 5, "seed": 0},
               {"temperature": 0, "repetition_penalty": 1.3}):
        with pytest.raises(NonFiniteError, match="generation stopped at new token .* not finite"):
            lm.generate("ab", max_new_tokens=20, min_new_tokens=20, **kw)
    one_line_error(run_tinyt("generate", bad, "abcdefgh", "--max-new-tokens", "5"),
                   "logits are not finite", "tinyt verify")


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_next_token_refuses_non_finite_logits(value):
    logits = np.zeros(50, dtype=np.float32)
    logits[7] = value
    for params in (SamplingParams(), SamplingParams(temperature=1.0, seed=0),
                   SamplingParams(repetition_penalty=1.2)):
        with pytest.raises(NonFiniteError, match="not finite"):
            next_token(logits, params, np.random.default_rng(0), [1, 2])
    logits[7] = -math.inf  # one token ruled out: fine
    assert next_token(logits, SamplingParams(), None, []) != 7


# -- an artifact whose config disagrees with its graph -----------------------------------------
def _edited_config(lm_onnx: Path, tmp_path: Path, **changes) -> Path:
    copy = tmp_path / ("config-" + "-".join(f"{k}{v}" for k, v in changes.items()))
    shutil.copytree(lm_onnx, copy)
    config = json.loads((copy / "config.json").read_text())
    config["tinyt"]["model"].update(changes)
    (copy / "config.json").write_text(json.dumps(config))
    rehash(copy, "config.json")
    return copy


@pytest.mark.parametrize("changes, needle", [
    ({"vocab_size": TINY_MODEL["vocab_size"] + 10}, "vocab_size="),
    ({"n_head": 4}, "head"),
    ({"n_layer": 3}, "n_layer=3"),
    ({"n_embd": 64, "n_head": 2}, "head_dim="),
    ({"block_size": 64}, "block_size=64"),
])
def test_a_config_that_disagrees_with_the_graph_is_refused_at_load(lm_onnx, tmp_path, changes,
                                                                   needle):
    with pytest.raises(ManifestError, match=f"{needle}.*does not belong to this graph"):
        rt.load(_edited_config(lm_onnx, tmp_path, **changes))


def test_a_config_that_disagrees_is_refused_for_every_kind(lm_onnx, tiny_clf, tmp_path):
    from tinyt.export import export_onnx
    from tinyt.export.optimize import optimize
    gqa = optimize(optimize(lm_onnx, tmp_path / "opt"), tmp_path / "gqa", target="gqa")
    clf = export_onnx(tiny_clf, tmp_path / "clf")
    for artifact in (gqa, clf):
        with pytest.raises(ManifestError, match="block_size=64.*does not belong"):
            rt.load(_edited_config(artifact, tmp_path / artifact.name, block_size=64))
    assert rt.load(gqa).generate("ab", max_new_tokens=3)  # the untouched ones load


@pytest.mark.parametrize("changes", [{"n_layer": 3}, {"block_size": 64}, {"n_head": 4}])
def test_stages_refuse_a_source_whose_config_disagrees_with_its_graph(lm_onnx, tmp_path, changes):
    from tinyt.export.optimize import optimize
    from tinyt.export.package import package
    from tinyt.export.quantize import quantize
    bad = _edited_config(lm_onnx, tmp_path, **changes)
    for stage in (optimize, quantize, package):
        with pytest.raises(ManifestError, match="does not belong to this graph"):
            stage(bad, tmp_path / stage.__name__)
    one_line_error(run_tinyt("optimize", bad, tmp_path / "o"), "does not belong to this graph")


def test_random_bytes_for_a_model_file_are_not_an_onnx_model(lm_onnx, tmp_path):
    from tinyt.export.optimize import optimize
    copy = tmp_path / "random"
    shutil.copytree(lm_onnx, copy)
    (copy / "model.onnx").write_bytes(np.random.default_rng(0).bytes(4096))
    rehash(copy, "model.onnx")
    with pytest.raises(GraphError, match="model.onnx is not a valid ONNX model"):
        rt.load(copy)
    with pytest.raises(GraphError, match="model.onnx is not a valid ONNX model"):
        optimize(copy, tmp_path / "opt")


# -- arguments -----------------------------------------------------------------------------------
@pytest.mark.parametrize("threads", [-1, 0, "2", 2.5, True])
def test_threads_must_be_a_positive_int(lm_onnx, threads):
    with pytest.raises(ConfigError, match=f"threads={threads!r} is invalid: a positive integer"):
        rt.load(lm_onnx, threads=threads)


@pytest.mark.parametrize("args, option", [
    (("train", "--preset", "test", "--stop-after", "-1"), "--stop-after"),
    (("train", "--preset", "test", "--max-steps", "0"), "--max-steps"),
    (("train", "--preset", "test", "--seed", "-3"), "--seed"),
    (("generate", "x", "y", "--threads", "-1"), "--threads"),
    (("generate", "x", "y", "--max-new-tokens", "-5"), "--max-new-tokens"),
    (("sample", "x", "--top-k", "0"), "--top-k"),
    (("package", "x", "y", "--instances", "0"), "--instances"),
    (("bench", "--rounds", "-1"), "--rounds"),
])
def test_integer_options_have_their_range_checked(args, option):
    proc = run_tinyt(*args)
    assert proc.returncode == 2, proc.stderr
    text = " ".join(proc.stderr.replace("│", " ").split())  # the message box wraps lines
    assert f"Invalid value for '{option}'" in text and "greater than or equal to" in text, text


# -- vocabularies that do not match --------------------------------------------------------------
def test_a_vocabulary_padded_beyond_the_tokenizer_never_samples_the_padding(tmp_path):
    from nanogpt_reference import nanogpt_ckpt

    from tinyt.export import export_onnx
    from tinyt.model import generate
    nanogpt_ckpt(tmp_path / "ckpt.pt", vocab=320)  # random weights: padded ids are likely picks
    proc = run_tinyt("import-nanogpt", tmp_path / "ckpt.pt", tmp_path / "ck", "--tokenizer",
                     "byte")
    assert proc.returncode == 0, proc.stderr
    assert "ids 257..319 are padding" in proc.stderr
    ck = load_checkpoint(tmp_path / "ck")
    assert ck.meta["vocab_padding"] == 63 and ck.config.vocab_size == 320
    ids = torch.tensor([ck.tokenizer.encode("hello")])
    for temperature in (0, 2.0):
        gen = torch.Generator().manual_seed(0)
        free = generate(ck.model, ids, 18, temperature=temperature, generator=gen)
        gen = torch.Generator().manual_seed(0)
        masked = generate(ck.model, ids, 18, temperature=temperature, generator=gen,
                          vocab_limit=257)
        assert int(masked[0, 5:].max()) < 257
    assert int(free[0, 5:].max()) >= 257  # unmasked, the padding does come up
    lm = rt.load(export_onnx(tmp_path / "ck", tmp_path / "onnx"), threads=1)
    for kw in ({"temperature": 0}, {"temperature": 2.0, "seed": 1}):
        res = lm.generate_details(["hello", "x"], max_new_tokens=18, min_new_tokens=18, **kw)
        for r in res:
            assert max(r.token_ids) < 257 and len(r.token_ids) == 18, r.token_ids


def test_a_byte_level_model_without_end_of_text_imports_and_runs(tmp_path):
    from nanogpt_reference import nanogpt_ckpt

    from tinyt.export import export_onnx
    from tinyt.nanogpt import import_nanogpt
    ref = nanogpt_ckpt(tmp_path / "ckpt.pt", vocab=256)
    ck = load_checkpoint(import_nanogpt(tmp_path / "ckpt.pt", tmp_path / "ck", tokenizer="byte"))
    assert ck.tokenizer.vocab_size == 256 and ck.tokenizer.eos_id is None
    assert ck.tokenizer.encode("é!") == list("é!".encode())
    x = torch.tensor([ck.tokenizer.encode("print(1)")])
    with torch.no_grad():
        assert_close(ck.model(x)[0], ref(x), 1e-5, "byte-level import vs nanoGPT")
    lm = rt.load(export_onnx(tmp_path / "ck", tmp_path / "onnx"), threads=1)
    res = lm.generate_details(["print("], max_new_tokens=10, temperature=0)[0]
    assert len(res.token_ids) == 10 and res.finish_reason == "length"
    nanogpt_ckpt(tmp_path / "small.pt", vocab=65)  # shakespeare_char's size
    with pytest.raises(CheckpointError, match="vocab_size is 65.*meta.pkl.*--tokenizer"):
        import_nanogpt(tmp_path / "small.pt", tmp_path / "small", tokenizer="byte")
