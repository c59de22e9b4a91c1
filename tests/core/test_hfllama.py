"""Llama-family models in and out of Hugging Face's layout (tinyt.hf): random-weight
LlamaForCausalLM and Qwen2ForCausalLM directories saved here (no network) import with logits
equal to transformers' over a sequence and through the cache and the same greedy tokens as
its generate; sharded saves import the same; tinyt -> HF -> tinyt is bit-identical; the
tokenizer's end token and chat template travel; what tinyt does not implement is refused by
name, with no directory written. And every catalogue entry (GPT-2's too) maps its config.json
and its weight names both ways, without transformers."""
import json
import re

import pytest
import torch
from conftest import assert_close, run_tinyt
from llama_reference import HF_ATOL, hf_reference, small_llama

from tinyt.checkpoint import load_checkpoint, save_checkpoint, unique_state_dict
from tinyt.errors import CheckpointError, ConversionError
from tinyt.hf import import_hf, to_hf
from tinyt.model import build_model, generate
from tinyt.tokenizer import Tokenizer

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _tokenizer() -> Tokenizer:
    """The 256 bytes, <|endoftext|> (256) and a chat model's two markers (257, 258)."""
    tok = Tokenizer.byte_level()
    tok.hf.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    return Tokenizer(tok.hf, eos_token="<|im_end|>", bos_token="<|im_start|>",
                     chat_template=TEMPLATE)


def _save_hf(kind: str, path, *, shard: str | None = None, **shape):
    """A random-weight transformers model saved as a Hub directory would hold it."""
    cfg = small_llama(vocab_size=300, **shape)
    hf = hf_reference(kind, cfg)
    hf.config.bos_token_id, hf.config.eos_token_id = 257, 258
    hf.generation_config.bos_token_id, hf.generation_config.eos_token_id = 257, 258
    hf.save_pretrained(path, safe_serialization=True,
                       **({"max_shard_size": shard} if shard else {}))
    tok = _tokenizer()
    tok.hf.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": TEMPLATE,
        "eos_token": {"content": "<|im_end|>", "special": True}, "bos_token": None}))
    return hf, cfg


@pytest.mark.parametrize("kind, shape", [
    ("llama", dict()),  # grouped heads, tied
    ("llama", dict(n_kv_head=1, tie_weights=False)),  # multi-query, untied
    ("qwen2", dict(qkv_bias=True, n_head=6, n_kv_head=2, n_embd=48)),
])
def test_import_equals_transformers_and_carries_the_tokenizer(kind, shape, tmp_path):
    hf, cfg = _save_hf(kind, tmp_path / "hf", **shape)
    ck = load_checkpoint(import_hf(tmp_path / "hf", tmp_path / "ck"))
    assert ck.config == cfg  # every option read back from config.json
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = hf(ids).logits
        assert_close(ck.model(ids)[0], want, HF_ATOL, f"{kind} logits")
        logits, cache = ck.model(ids[:, :16])
        assert cache[0][0].shape == (2, cfg.kv_heads, 16, cfg.head_dim)
        for t in range(16, 24):
            logits, cache = ck.model(ids[:, t:t + 1], past_key_values=cache)
            assert_close(logits[:, 0], want[:, t], HF_ATOL, f"{kind} cached logits at {t}")
        prompt = ids[:1, :10]
        theirs = hf.generate(prompt, max_new_tokens=20, do_sample=False,
                             pad_token_id=256)[0, 10:].tolist()
        ours = generate(ck.model, prompt, 20, temperature=0, eos_id=258)[0, 10:].tolist()
    assert ours == theirs  # HF stops at its eos 258 as tinyt does
    tok = ck.tokenizer  # the model's end token (258), not <|endoftext|>, and the template
    assert (tok.eos_token, tok.eos_id, tok.chat_template) == ("<|im_end|>", 258, TEMPLATE)
    assert ck.meta["metrics"]["architecture"] == hf.__class__.__name__


def test_a_sharded_save_imports_the_same(tmp_path):
    hf, _ = _save_hf("llama", tmp_path / "hf", shard="40KB")
    assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    one = tmp_path / "one"
    hf.save_pretrained(one, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (one / f).write_bytes((tmp_path / "hf" / f).read_bytes())
    a = unique_state_dict(load_checkpoint(import_hf(tmp_path / "hf", tmp_path / "a")).model)
    b = unique_state_dict(load_checkpoint(import_hf(one, tmp_path / "b")).model)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("shape", [
    dict(),  # Llama, tied
    dict(tie_weights=False, n_kv_head=1),
    dict(bias=True),  # Llama with attention_bias and mlp_bias
    dict(qkv_bias=True),  # Qwen2
])
def test_tinyt_to_hf_to_tinyt_is_bit_identical(shape, tmp_path):
    cfg = small_llama(vocab_size=300, **shape)
    torch.manual_seed(0)
    src = save_checkpoint(tmp_path / "src", build_model(cfg), _tokenizer())
    out = to_hf(src, tmp_path / "hf")
    meta = json.loads((out / "config.json").read_text())
    assert meta["architectures"] == ["Qwen2ForCausalLM" if shape.get("qkv_bias")
                                     else "LlamaForCausalLM"]
    assert meta["tinyt"]["logits_max_abs_diff"] <= 1e-5
    back = load_checkpoint(import_hf(out, tmp_path / "back"))
    a, b = unique_state_dict(load_checkpoint(src).model), unique_state_dict(back.model)
    assert back.config == cfg and a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]
    assert back.tokenizer.settings == load_checkpoint(src).tokenizer.settings


@pytest.mark.parametrize("change, says", [
    (dict(rope_scaling={"rope_type": "llama3", "factor": 32.0}),
     "rope_scaling 'llama3' lacks ['high_freq_factor', 'low_freq_factor', "
     "'original_max_position_embeddings']"),
    (dict(rope_scaling={"rope_type": "longrope", "factor": 2.0}),
     "rope_scaling type 'longrope' is read for Phi3ForCausalLM only"),
    (dict(rope_scaling={"rope_type": "su2", "factor": 2.0}),
     "rope_scaling type 'su2' is not one tinyt computes; allowed: linear, dynamic, llama3, "
     "yarn, longrope"),
    (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0, "alpha": 1}),
     "rope_scaling 'yarn' has ['alpha']"),
    (dict(rope_scaling={"type": "linear", "factor": float("nan")}), "rope_scaling.factor=nan"),
    (dict(hidden_act="gelu"), "hidden_act='gelu' is not implemented"),
    (dict(attention_bias=True, mlp_bias=False), "attention_bias=True with mlp_bias=False"),
    (dict(sliding_window=16), "is not part of LlamaForCausalLM; a windowed model is a "
                              "MistralForCausalLM"),
    (dict(architectures=["LlamaForSequenceClassification"]), "tinyt imports LlamaForCausalLM"),
    (dict(model_type="olmo"), "model_type 'olmo' is not one tinyt imports"),
    (dict(num_key_value_heads=3), "n_kv_head=3 is invalid"),
])
def test_what_tinyt_does_not_implement_is_refused_by_name(change, says, tmp_path):
    _save_hf("llama", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(ConversionError, match=says.replace("[", r"\[").replace("(", r"\(")):
        import_hf(tmp_path / "hf", tmp_path / "ck")
    assert not (tmp_path / "ck").exists()


def test_qwen2_uneven_heads_odd_layer_types_and_missing_files_are_refused(tmp_path):
    _save_hf("qwen2", tmp_path / "hf", qkv_bias=True)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    for change, says in ((dict(head_dim=16), "head_dim=16 with 4 heads is not hidden_size=32"),
                         (dict(use_sliding_window=True, sliding_window=8,
                               layer_types=["chunked_attention", "full_attention"]),
                          "layer_types ['chunked_attention'] is not implemented")):
        (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(ConversionError, match=re.escape(says)):
            import_hf(tmp_path / "hf", tmp_path / "ck")
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    (tmp_path / "hf" / "tokenizer.json").rename(tmp_path / "hf" / "tokenizer.model")
    with pytest.raises(CheckpointError, match=r"no tokenizer.json \(only a SentencePiece"):
        import_hf(tmp_path / "hf", tmp_path / "ck")
    (tmp_path / "hf" / "tokenizer.model").rename(tmp_path / "hf" / "tokenizer.json")
    (tmp_path / "hf" / "model.safetensors").rename(tmp_path / "hf" / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="a pickle"):
        import_hf(tmp_path / "hf", tmp_path / "ck")
    assert not (tmp_path / "ck").exists()


def test_mixed_forms_and_unsupported_biases_are_not_written_as_llama(tmp_path):
    for kw, says in ((dict(pos_encoding="learned"), "pos_encoding='learned'"),
                     (dict(bias=True, qkv_bias=False), "bias=True with qkv_bias=False")):
        src = save_checkpoint(tmp_path / f"src{len(says)}", build_model(small_llama(vocab_size=300, **kw)),
                              Tokenizer.byte_level())
        with pytest.raises(ConversionError, match=says):
            to_hf(src, tmp_path / "hf")
        assert not (tmp_path / "hf").exists()


@pytest.mark.slow
def test_cli_imports_and_exports_a_llama_model(tmp_path):
    _save_hf("llama", tmp_path / "hf")
    r = run_tinyt("import-hf", str(tmp_path / "hf"), str(tmp_path / "ck"))
    assert r.returncode == 0, r.stderr
    r = run_tinyt("export-hf", str(tmp_path / "ck"), str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    assert "logits max abs diff vs tinyt" in r.stdout
    saved = json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())
    assert saved["chat_template"] == TEMPLATE and saved["eos_token"] == "<|im_end|>"


GPT2_FORM = dict(pos_encoding="learned", norm="layernorm", n_kv_head=None, rope_theta=10000.0)


@pytest.mark.parametrize("entry, shape", [
    ("GPT2", dict(GPT2_FORM, activation="gelu", bias=True)),
    ("GPT2", dict(GPT2_FORM, activation="gelu_tanh", n_inner=None, bias=False,
                  tie_weights=False)),  # zero biases in HF's layout
    ("LLAMA", dict()),
    ("LLAMA", dict(bias=True, tie_weights=False, n_kv_head=1)),
    ("QWEN2", dict(qkv_bias=True)),
])
def test_every_catalogue_entry_maps_its_config_and_weights_both_ways(entry, shape):
    """No transformers needed: config.json written from a config reads back as it, each HF
    name is used once, and tinyt -> HF names -> tinyt gives every tensor back unchanged."""
    import tinyt.hf as hf
    from tinyt.hf.weights import pairs

    family, cfg = getattr(hf, entry), small_llama(vocab_size=300, **shape)
    assert hf.writer_for(cfg, "the test model") is family
    written = hf.hf_config(family, cfg, 256)
    if family.zero_biases:  # as export-hf's tinyt block says it
        written["tinyt"] = {"bias": cfg.bias}
    assert hf.config_from_hf(family, written, "config.json") == cfg
    names = [name for p in pairs(family, cfg) for name in p.theirs]
    assert len(names) == len(set(names)), "an HF name mapped twice"
    torch.manual_seed(0)
    model = build_model(cfg)
    theirs = hf.hf_state(family, model)
    assert sorted(theirs) == sorted(names)
    back, ours = hf.state_from_hf(family, theirs, cfg, "test"), unique_state_dict(model)
    assert back.keys() == ours.keys()
    assert [k for k in ours if not torch.equal(back[k], ours[k])] == []
