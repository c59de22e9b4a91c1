"""Hugging Face GPT-2 directories in (`tinyt import-hf`) and out (`tinyt export-hf`). There is
no network here: the directories are made with transformers (random weights, several shapes)
and tokenizer files trained on the test corpus."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the peers / optimum extra")

from conftest import assert_close, run_tinyt  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

import tinyt.runtime as rt  # noqa: E402
from tinyt.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from tinyt.errors import CheckpointError, ConversionError  # noqa: E402
from tinyt.hf import import_hf, to_hf_gpt2  # noqa: E402
from tinyt.model import TinyTransformer, generate  # noqa: E402
from tinyt.tokenizer import Tokenizer  # noqa: E402

IMPORT_ATOL = 1e-4  # the bound; measured differences are below 1e-6


@pytest.fixture(scope="module")
def bpe(corpus_dir) -> Tokenizer:
    return Tokenizer.train_bpe([p.read_text() for p in sorted(corpus_dir.iterdir())], 300)


def hf_dir(path, tok: Tokenizer, *, vocab_files=False, shard=None, seed=0, **config):
    """A GPT2LMHeadModel directory as save_pretrained writes it, with tokenizer files."""
    torch.manual_seed(seed)
    kw = dict(n_layer=2, n_head=2, n_embd=32, n_positions=48, vocab_size=tok.vocab_size,
              eos_token_id=tok.eos_id, bos_token_id=tok.eos_id)
    model = GPT2LMHeadModel(GPT2Config(**{**kw, **config})).eval()
    model.save_pretrained(path, safe_serialization=True,
                          **({"max_shard_size": shard} if shard else {}))
    if vocab_files:  # GPT-2's original layout: vocab.json + merges.txt
        tok.hf.model.save(str(path))
    else:
        tok.save(path / "tokenizer.json")
    return model


def assert_same_model(ck, hf, cfg_tokens: int, steps: int = 8) -> None:
    """Logits over a full sequence, logits through the KV cache step by step, greedy tokens."""
    T = ck.config.block_size
    x = torch.randint(0, cfg_tokens, (2, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert_close(ck.model(x)[0], hf(x).logits, IMPORT_ATOL, "full-sequence logits")
        ours, cache = ck.model(x[:, :5])
        theirs = hf(x[:, :5], use_cache=True)
        past = theirs.past_key_values
        for t in range(5, 5 + steps):
            ours, cache = ck.model(x[:, t:t + 1], past_key_values=cache)
            theirs = hf(x[:, t:t + 1], past_key_values=past, use_cache=True)
            past = theirs.past_key_values
            assert_close(ours, theirs.logits, IMPORT_ATOL, f"cached logits at {t}")
        prompt = x[:1, :6]
        want = hf.generate(prompt, max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                           pad_token_id=0, attention_mask=torch.ones_like(prompt))
    assert torch.equal(generate(ck.model, prompt, steps, temperature=0), want)


@pytest.mark.parametrize("config", [
    {},  # GPT-2's defaults: gelu_new, eps 1e-5
    {"activation_function": "gelu", "layer_norm_epsilon": 1e-6, "n_inner": 100, "n_head": 4},
    {"activation_function": "gelu_pytorch_tanh", "tie_word_embeddings": False, "n_layer": 1,
     "vocab_size": 320},  # untied head, a vocabulary padded beyond the tokenizer
])
def test_import_equals_transformers(bpe, tmp_path, config):
    hf = hf_dir(tmp_path / "hf", bpe, **config)
    proc = run_tinyt("import-hf", tmp_path / "hf", tmp_path / "ck")
    assert proc.returncode == 0, proc.stderr
    ck = load_checkpoint(tmp_path / "ck")
    cfg = ck.config
    assert cfg.activation == ("gelu" if config.get("activation_function") == "gelu"
                              else "gelu_tanh")
    assert cfg.norm_eps == config.get("layer_norm_epsilon", 1e-5)
    assert cfg.n_inner == config.get("n_inner") and cfg.block_size == 48
    assert cfg.tie_weights == config.get("tie_word_embeddings", True)
    assert ("padding" in proc.stderr) == (cfg.vocab_size > bpe.vocab_size)
    assert_same_model(ck, hf, bpe.vocab_size)


def test_sharded_weights_and_vocab_merges_files(bpe, tmp_path):
    hf_dir(tmp_path / "one", bpe)
    hf_dir(tmp_path / "sharded", bpe, shard="40KB", vocab_files=True)
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    assert not (tmp_path / "sharded" / "tokenizer.json").exists()
    one = load_checkpoint(import_hf(tmp_path / "one", tmp_path / "ck1"))
    sharded = load_checkpoint(import_hf(tmp_path / "sharded", tmp_path / "ck2"))
    for (name, a), (_, b) in zip(one.model.state_dict().items(),
                                 sharded.model.state_dict().items()):
        assert torch.equal(a, b), name
    text = "def alpha_3(beta, n=3):\n    return beta  # é"
    assert sharded.tokenizer.encode(text) == one.tokenizer.encode(text)
    assert sharded.tokenizer.decode(one.tokenizer.encode(text)) == text
    assert sharded.tokenizer.eos_id == one.tokenizer.eos_id


def test_pickled_weights_are_refused_with_the_conversion_command(bpe, tmp_path):
    model = hf_dir(tmp_path / "hf", bpe)
    (tmp_path / "hf" / "model.safetensors").unlink()
    model.save_pretrained(tmp_path / "hf", safe_serialization=False)
    assert (tmp_path / "hf" / "pytorch_model.bin").is_file()
    with pytest.raises(CheckpointError, match=r"pytorch_model.bin, a pickle.*safe_serialization"):
        import_hf(tmp_path / "hf", tmp_path / "ck")
    assert not (tmp_path / "ck").exists()


@pytest.mark.parametrize("option, value", [
    ("scale_attn_by_inverse_layer_idx", True), ("reorder_and_upcast_attn", True),
    ("add_cross_attention", True), ("scale_attn_weights", False),
    ("activation_function", "relu"), ("activation_function", "quick_gelu"),
])
def test_options_tinyt_does_not_implement_are_refused_by_name(bpe, tmp_path, option, value):
    hf_dir(tmp_path / "hf", bpe)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config[option] = value
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConversionError, match=f"{option}={value!r}"):
        import_hf(tmp_path / "hf", tmp_path / "ck")
    one_line = run_tinyt("import-hf", tmp_path / "hf", tmp_path / "ck")
    assert one_line.returncode == 2 and option in one_line.stderr


@pytest.mark.slow
def test_the_chain_runs_on_an_import(bpe, tmp_path, monkeypatch, corpus_dir):
    """export, verify, optimize (FastGelu fused), quantize, generate, Optimum's loader."""
    import onnx

    from tinyt.export import export_onnx, verify
    from tinyt.export.optimize import optimize
    from tinyt.export.quantize import quantize
    hf_dir(tmp_path / "hf", bpe)
    ck = import_hf(tmp_path / "hf", tmp_path / "ck")
    onnx_dir = export_onnx(ck, tmp_path / "onnx")
    assert verify(ck, onnx_dir)["passed"]
    opt = optimize(onnx_dir, tmp_path / "opt")
    ops = {n.op_type for n in onnx.load(str(opt / "model.onnx")).graph.node}
    assert "FastGelu" in ops and "MultiHeadAttention" in ops
    assert verify(ck, opt)["passed"]
    q = quantize(opt, tmp_path / "int8", data=str(corpus_dir))
    model = load_checkpoint(ck)
    prompt = model.tokenizer.encode("def alpha")
    want = generate(model.model, torch.tensor([prompt]), 10, temperature=0)[0, len(prompt):]
    assert rt.load(opt, threads=1).generate_ids([prompt], max_new_tokens=10,
                                                min_new_tokens=10)[0].token_ids == want.tolist()
    assert rt.load(q, threads=1).generate("def alpha", max_new_tokens=5)
    pytest.importorskip("optimum.onnxruntime")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from optimum.onnxruntime import ORTModelForCausalLM
    ort_model = ORTModelForCausalLM.from_pretrained(onnx_dir, provider="CPUExecutionProvider")
    ids = torch.tensor([prompt])
    got = ort_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10,
                             min_new_tokens=10, do_sample=False, pad_token_id=0)
    assert got[0, len(prompt):].tolist() == want.tolist()


# -- out ------------------------------------------------------------------------------------------
def _same_checkpoint(a, b) -> None:
    assert a.config == b.config
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name
    assert a.tokenizer.hf.to_str() == b.tokenizer.hf.to_str()


def test_export_hf_round_trip_is_bit_identical(tiny_ckpt, tmp_path):
    proc = run_tinyt("export-hf", tiny_ckpt, tmp_path / "hf")
    assert proc.returncode == 0, proc.stderr
    hf = GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    ck = load_checkpoint(tiny_ckpt)
    x = torch.randint(0, ck.config.vocab_size, (2, ck.config.block_size))
    with torch.no_grad():
        assert_close(hf(x).logits, ck.model(x)[0], 1e-5, "exported vs tinyt logits")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["activation_function"] \
        == "gelu"
    _same_checkpoint(ck, load_checkpoint(import_hf(tmp_path / "hf", tmp_path / "back")))


def test_export_hf_round_trip_of_a_bias_free_untied_tanh_model(tiny_ckpt, tmp_path):
    from tinyt.config import ModelConfig
    tok = load_checkpoint(tiny_ckpt).tokenizer
    cfg = ModelConfig(block_size=16, vocab_size=tok.vocab_size, n_layer=1, n_head=2, n_embd=16,
                      bias=False, tie_weights=False, activation="gelu_tanh", norm_eps=1e-6,
                      n_inner=40)
    torch.manual_seed(0)
    src = save_checkpoint(tmp_path / "ck", TinyTransformer(cfg), tok)
    out = to_hf_gpt2(src, tmp_path / "hf")
    assert json.loads((out / "config.json").read_text())["activation_function"] == "gelu_new"
    _same_checkpoint(load_checkpoint(src), load_checkpoint(import_hf(out, tmp_path / "back")))


def test_export_hf_refuses_what_gpt2_cannot_express(tiny_ckpt, tiny_clf, tmp_path):
    from tinyt.config import ModelConfig
    tok = load_checkpoint(tiny_ckpt).tokenizer
    cfg = ModelConfig(block_size=16, vocab_size=tok.vocab_size, n_layer=1, n_head=2, n_embd=16,
                      pos_encoding="sinusoidal")
    src = save_checkpoint(tmp_path / "sin", TinyTransformer(cfg), tok)
    with pytest.raises(ConversionError, match="sinusoidal positions"):
        to_hf_gpt2(src, tmp_path / "hf")
    with pytest.raises(ConversionError, match="is a classifier"):
        to_hf_gpt2(tiny_clf, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
    shutil.rmtree(tmp_path / "sin")
