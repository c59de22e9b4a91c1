import pickle

import pytest
import torch
from conftest import assert_close
from nanogpt_reference import nanogpt_ckpt

from tinyt.checkpoint import load_checkpoint
from tinyt.errors import CheckpointError
from tinyt.nanogpt import import_nanogpt
from tinyt.tokenizer import Tokenizer

IMPORT_TOL = 1e-5  # imported tinyt model vs nanoGPT's architecture, logits max abs diff


@pytest.mark.parametrize("compiled,bias", [(False, True), (True, False)])
def test_import_matches_nanogpt_logits(tmp_path, compiled, bias):
    ref = nanogpt_ckpt(tmp_path / "ckpt.pt", compiled=compiled, bias=bias)
    out = import_nanogpt(tmp_path / "ckpt.pt", tmp_path / "tinyt", tokenizer="byte")
    ck = load_checkpoint(out)
    assert ck.config.tie_weights and ck.config.pos_encoding == "learned"
    assert ck.config.bias == bias and ck.config.vocab_size == 320
    assert ck.meta["metrics"]["iter_num"] == 250
    x = torch.randint(0, 320, (3, 24))
    with torch.no_grad():
        expected = ref(x)
        got, _ = ck.model(x)
    assert_close(got, expected, IMPORT_TOL, "imported vs nanoGPT logits")


def test_unexpected_keys_are_named(tmp_path):
    nanogpt_ckpt(tmp_path / "ckpt.pt", extra_key="transformer.h.0.attn.rotary.freq")
    with pytest.raises(CheckpointError, match=r"unexpected \['transformer.h.0.attn.rotary.freq'\]"):
        import_nanogpt(tmp_path / "ckpt.pt", tmp_path / "out", tokenizer="byte")
    assert not (tmp_path / "out").exists()


def test_tokenizer_larger_than_vocab(tmp_path, corpus_dir):
    nanogpt_ckpt(tmp_path / "ckpt.pt", vocab=200)
    texts = [p.read_text() for p in corpus_dir.iterdir()]
    tok_path = tmp_path / "tok.json"
    Tokenizer.train_bpe(texts, 300).save(tok_path)
    with pytest.raises(CheckpointError, match="tokenizer has 300 tokens but the model's vocab"):
        import_nanogpt(tmp_path / "ckpt.pt", tmp_path / "out", tokenizer=str(tok_path))
    nanogpt_ckpt(tmp_path / "ckpt.pt", vocab=320)
    ck = load_checkpoint(import_nanogpt(tmp_path / "ckpt.pt", tmp_path / "ok",
                                        tokenizer=str(tok_path)))
    assert ck.tokenizer.vocab_size <= 300


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_arbitrary_pickles_are_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("owned",))

    with open(tmp_path / "evil.pt", "wb") as f:
        pickle.dump({"model": Evil(), "model_args": {}}, f)
    with pytest.raises(CheckpointError, match="weights_only=True"):
        import_nanogpt(tmp_path / "evil.pt", tmp_path / "out", tokenizer="byte")


def test_import_never_replaces_a_directory(tmp_path):
    nanogpt_ckpt(tmp_path / "ckpt.pt")
    with pytest.raises(CheckpointError, match="exists and is not empty"):
        import_nanogpt(tmp_path / "ckpt.pt", tmp_path, tokenizer="byte")
    assert (tmp_path / "ckpt.pt").is_file()


def test_not_a_nanogpt_file(tmp_path):
    torch.save({"state_dict": {}}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="expected a dict with 'model' and 'model_args'"):
        import_nanogpt(tmp_path / "other.pt", tmp_path / "out", tokenizer="byte")
    with pytest.raises(CheckpointError, match="does not exist"):
        import_nanogpt(tmp_path / "missing.pt", tmp_path / "out", tokenizer="byte")


def test_bad_model_args(tmp_path):
    torch.save({"model": {}, "model_args": {"n_layer": 2, "n_head": 3, "n_embd": 32,
                                            "block_size": 8, "vocab_size": 300}},
               tmp_path / "bad.pt")
    with pytest.raises(CheckpointError, match="n_embd=32 is invalid: must be divisible"):
        import_nanogpt(tmp_path / "bad.pt", tmp_path / "out", tokenizer="byte")
    torch.save({"model": {}, "model_args": {"n_layer": 2}}, tmp_path / "few.pt")
    with pytest.raises(CheckpointError, match="missing \\['n_head'"):
        import_nanogpt(tmp_path / "few.pt", tmp_path / "out", tokenizer="byte")
