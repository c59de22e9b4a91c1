"""The families beyond Llama and Qwen2 as users bring them (tests/hf_fixtures.py: random-weight
transformers models with the real models' settings and contexts): Llama 3.x's rope scaling
(llama3, linear, dynamic, yarn), Mistral's sliding window, Qwen2's windowed upper layers, Qwen3's
head_dim and q/k norms, SmolLM3's layers without rotary, Granite's multipliers. Each imports with
logits equal to transformers' over a sequence longer than its window and step by step through
the cache, the same greedy tokens as its generate, and goes back to its class bit-identically;
the rotary frequencies equal transformers' own; what tinyt does not compute is refused by name.

Tolerance: the same float32 kernels on the same weights, summed in another order where tinyt
fuses q, k, v (llama_reference.HF_ATOL, 1e-4; measured at or below 1e-6 here). A wrong window,
norm, frequency or multiplier moves logits by 1e-2 or more (a window one key off: 0.47)."""
import json
import math
import re

import pytest
import torch
from hf_fixtures import REAL, hf_model, save_hf
from llama_reference import HF_ATOL

import tinyt.hf as hf
from tinyt.checkpoint import load_checkpoint, save_checkpoint, unique_state_dict
from tinyt.config import ModelConfig
from tinyt.errors import ConfigError, ConversionError
from tinyt.hf import import_hf, to_hf
from tinyt.hf.family import misfit
from tinyt.model import build_model
from tinyt.rope import rope_frequencies

SEQ = 40  # tokens compared: longer than every window below
GEMMA = {"norm_offset", "post_norms", "head_size", "embedding_multiplier",
         "attention_multiplier", "sliding_window", "full_attention_layers"}  # both Gemmas'

WINDOWS = {"mistral": dict(sliding_window=12)}  # Mistral's 4096 would need 4096 tokens to matter
CASES = {  # name: (fixture, overrides, the options tinyt reads)
    "smollm2": ("smollm2", {}, set()),
    "qwen2.5": ("qwen2.5", {}, set()),
    "llama3.2": ("llama3.2", {}, {"rope_scaling"}),
    "qwen3": ("qwen3", {}, {"head_size", "qk_norm"}),
    "mistral": ("mistral", WINDOWS["mistral"], {"sliding_window"}),
    "smollm3": ("smollm3", {}, {"nope_layers"}),
    "granite": ("granite", {}, {"embedding_multiplier", "residual_multiplier",
                                "attention_multiplier", "logits_scaling"}),
    "qwen2.5-window": ("qwen2.5", dict(use_sliding_window=True, sliding_window=10,
                                       max_window_layers=1),
                       {"sliding_window", "full_attention_layers"}),
    "smollm3-window": ("smollm3", dict(use_sliding_window=True, sliding_window=8),
                       {"nope_layers", "sliding_window", "full_attention_layers"}),
    "llama-yarn": ("llama-131k", dict(rope_scaling={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
        {"rope_scaling"}),
    "llama-linear": ("llama-131k", dict(rope_scaling={"type": "linear", "factor": 2.0}),
                     {"rope_scaling"}),
    "llama-dynamic": ("llama-131k", dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
                      {"rope_scaling"}),
    # Gemma's windows (512, 4096) shortened so that the 40 tokens cross them; Gemma 3's layer
    # 5 (every 6th) global, the others windowed at their own rotary base
    "gemma3": ("gemma3", dict(sliding_window=12), GEMMA | {"qk_norm", "rope_local_theta"}),
    "gemma3-linear": ("gemma3", dict(sliding_window=12, rope_scaling={
        "rope_type": "linear", "factor": 8.0}), GEMMA | {"qk_norm", "rope_local_theta",
                                                         "rope_scaling"}),
    "gemma2": ("gemma2", dict(sliding_window=10), GEMMA | {"attn_softcap", "final_softcap"}),
    # Phi-3.5 / Phi-4-mini at their 131,072 tokens with LongRoPE (the long factors past 4,096:
    # test_longrope_switches_and_recomputes_as_transformers); Phi-3-mini-4k's window (2,047)
    # shortened so that the 40 tokens cross it, without the scaling it does not have
    "phi3.5": ("phi3.5", {}, {"rope_scaling", "sliding_window"}),
    "phi4-mini": ("phi4-mini", {}, {"rope_scaling", "sliding_window", "rotary_dim"}),
    "phi3-window": ("phi3.5", dict(rope_scaling=None, max_position_embeddings=4096,
                                   sliding_window=12), {"sliding_window"}),
    # OLMo-2: norms after the branches only, q/k norms over the whole projection (with fewer
    # key/value heads too: k's norm is then over n_kv * head_dim)
    "olmo2": ("olmo2", {}, {"qk_norm", "pre_norms", "post_norms"}),
    "olmo2-gqa": ("olmo2", dict(num_key_value_heads=2), {"qk_norm", "pre_norms", "post_norms"}),
}


def _imported(case: str, tmp_path):
    name, overrides, _ = CASES[case]
    model, _ = save_hf(name, tmp_path / "hf", **json.loads(json.dumps(overrides)))
    return model, import_hf(tmp_path / "hf", tmp_path / "ck", log=lambda s: None)


@pytest.mark.parametrize("case", sorted(CASES))
def test_import_equals_transformers_full_cached_and_greedy(case, tmp_path):
    theirs, ck_dir = _imported(case, tmp_path)
    ck = load_checkpoint(ck_dir)
    cfg, ours = ck.config, ck.model.eval()
    assert {o.split("=")[0] for o in cfg.family_options} == CASES[case][2]
    assert cfg.block_size == theirs.config.max_position_embeddings  # the real context, kept
    ids = torch.randint(0, cfg.vocab_size, (2, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = theirs(ids).logits
        assert float((ours(ids)[0] - want).abs().max()) <= HF_ATOL
        logits, cache = ours(ids[:, :SEQ - 12])  # a prompt, then one token at a time
        worst = float((logits - want[:, :SEQ - 12]).abs().max())
        for t in range(SEQ - 12, SEQ):
            logits, cache = ours(ids[:, t:t + 1], past_key_values=cache)
            worst = max(worst, float((logits[:, 0] - want[:, t]).abs().max()))
        assert worst <= HF_ATOL, worst
        prompt = ids[:1, :20]
        greedy = theirs.generate(prompt, max_new_tokens=16, do_sample=False, eos_token_id=None,
                                 pad_token_id=0)
        from tinyt.model import generate
        assert generate(ours, prompt, 16, temperature=0).tolist() == greedy.tolist()


@pytest.mark.parametrize("case", ["llama3.2", "qwen3", "mistral", "smollm3-window", "granite",
                                  "qwen2.5-window", "llama-yarn", "gemma3", "gemma2",
                                  "phi3.5", "phi4-mini", "olmo2-gqa"])
def test_each_goes_back_to_its_class_bit_identically(case, tmp_path):
    _, src = _imported(case, tmp_path)
    out = to_hf(src, tmp_path / "out")
    meta = json.loads((out / "config.json").read_text())
    assert meta["architectures"] == [f"{hf.family_of(meta, 'x').architecture}"]
    assert meta["model_type"] == REAL[CASES[case][0]][0]
    assert meta["tinyt"]["logits_max_abs_diff"] <= HF_ATOL
    back = load_checkpoint(import_hf(out, tmp_path / "back", log=lambda s: None))
    a, b = unique_state_dict(load_checkpoint(src).model), unique_state_dict(back.model)
    assert back.config == load_checkpoint(src).config and a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_phi_export_names_its_byte_level_tokenizer_as_llama_cpp_reads_it(tmp_path):
    """A Phi-3 export's byte-level BPE is GPT2Tokenizer (Phi-4-mini's class: without it
    llama.cpp's converter asks for Phi-3-mini's SentencePiece tokenizer.model), and
    transformers' tokenizer of that class reads the exported tokenizer.json to tinyt's ids."""
    from transformers import AutoTokenizer

    _, src = _imported("phi4-mini", tmp_path)
    out = to_hf(src, tmp_path / "out")
    saved = json.loads((out / "tokenizer_config.json").read_text())
    assert saved["tokenizer_class"] == "GPT2Tokenizer"
    ours = load_checkpoint(src).tokenizer
    theirs = AutoTokenizer.from_pretrained(out)
    assert type(theirs).__name__ == "GPT2TokenizerFast"
    for text in ("def f(x):\n    return x  # ok", " leading space, ünïcödé and 数字 42"):
        assert theirs(text)["input_ids"] == ours.encode(text)
    llama = to_hf(_imported("llama3.2", tmp_path / "l")[1], tmp_path / "llama-out")
    assert json.loads((llama / "tokenizer_config.json").read_text())["tokenizer_class"] == \
        "PreTrainedTokenizerFast"  # other families keep the generic class


@pytest.mark.slow  # 4,102-token forwards in transformers and tinyt: ~20-30 s each
@pytest.mark.parametrize("case", ["phi3.5", "phi4-mini"])
def test_longrope_switches_and_recomputes_as_transformers(case, tmp_path):
    """LongRoPE at Phi's real 4,096-token original context: a sequence within it turns at the
    short factors, one past it at the long ones (logits equal transformers' on both sides);
    and a generation whose sequence crosses it recomputes the whole sequence at the long
    factors there: the greedy tokens of transformers' forward over each whole sequence.
    (transformers 4.57's Phi-3 generate drops its cache at the crossing but passes the one
    cache_position of the new token with the 4,097 tokens it recomputes, so the cache it
    keeps is not its own forward's and its tokens part from it a step later.)"""
    from tinyt.model import generate

    theirs, ck_dir = _imported(case, tmp_path)
    ours = load_checkpoint(ck_dir).model.eval()
    original = theirs.config.original_max_position_embeddings
    assert original == 4096
    # ids from 1: generate takes id 0 for padding (pad_token_id) and would mask it out
    ids = torch.randint(1, 318, (1, original + 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        for n in (original, original + 6):
            want = theirs(ids[:, :n]).logits
            assert float((ours(ids[:, :n])[0] - want).abs().max()) <= HF_ATOL, n
        prompt = ids[:, :original - 4]  # 4 tokens within, then past the original context
        greedy = prompt
        for _ in range(10):
            nxt = theirs(greedy).logits[:, -1].argmax(-1, keepdim=True)
            greedy = torch.cat([greedy, nxt], dim=1)
        assert generate(ours, prompt, 10, temperature=0).tolist() == greedy.tolist()


@pytest.mark.parametrize("scaling", [
    None,
    {"rope_type": "linear", "factor": 8.0},
    {"rope_type": "dynamic", "factor": 4.0},
    {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192},  # Llama-3.2
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192},  # Llama-3.1
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},  # Qwen2.5
    {"rope_type": "yarn", "factor": 40.0, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
     "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096},  # DeepSeek's kind
    {"rope_type": "yarn", "factor": 2.0, "attention_factor": 1.2, "truncate": False},
])
@pytest.mark.parametrize("head_dim, theta", [(64, 500000.0), (128, 1000000.0)])
def test_rotary_frequencies_are_transformers_own(scaling, head_dim, theta):
    """inv_freq and the attention factor at real head sizes and bases, against
    transformers' ROPE_INIT_FUNCTIONS: equal but for powf's rounding (one ulp, ~6e-8)."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = ModelConfig(n_embd=head_dim * 4, n_head=4, pos_encoding="rotary", norm="rmsnorm",
                      rope_theta=theta, block_size=131072, rope_scaling=scaling)
    hf_cfg = LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, rope_theta=theta,
                         max_position_embeddings=131072, rope_scaling=scaling)
    want, want_factor = ROPE_INIT_FUNCTIONS[(scaling or {}).get("rope_type", "default")](
        hf_cfg, "cpu")
    inv, factor = rope_frequencies(cfg)
    assert inv.dtype.name == "float32" and inv.shape == (head_dim // 2,)
    rel = (torch.from_numpy(inv) - want).abs() / want
    assert float(rel.max()) <= 2.5e-7, float(rel.max())
    assert math.isclose(factor, want_factor, rel_tol=1e-12)


@pytest.mark.parametrize("settings, says", [
    (dict(rope_scaling={"rope_type": "longrope", "short_factor": [1.0]}),
     "rope_scaling 'longrope' lacks ['factor', 'long_factor', 'original_max_position_embed"),
    (dict(rope_scaling={"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0],
                        "factor": 32.0, "original_max_position_embeddings": 4096}),
     "rope_scaling.long_factor=[2.0] is invalid: must be 8 finite numbers > 0"),
    (dict(rotary_dim=12, rope_scaling={"rope_type": "yarn", "factor": 2.0}),
     "with yarn's rope_scaling is not implemented"),
    (dict(rotary_dim=33), "rotary_dim=33 is invalid: must be null (head_dim) or an even"),
    (dict(rope_scaling={"rope_type": "linear"}), "rope_scaling 'linear' lacks ['factor']"),
    (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
                        "high_freq_factor": 1.0, "original_max_position_embeddings": 8192}),
     "must be > low_freq_factor=4.0"),
    (dict(rope_scaling={"rope_type": "linear", "factor": 2.0}, pos_encoding="learned"),
     "it needs pos_encoding='rotary'"),
    (dict(nope_layers=[5]), "nope_layers=(5,) is invalid: must be increasing layer indices in "
                            "0..1"),
    (dict(full_attention_layers=[0]), "only means something with a sliding_window"),
    (dict(sliding_window=0), "sliding_window=0 is invalid"),
    (dict(qk_norm=True, norm="layernorm"), "they need norm='rmsnorm'"),
    (dict(logits_scaling=0.0), "logits_scaling=0.0 is invalid"),
    (dict(n_embd=60, n_head=8), "head_size set"),
    (dict(norm_offset=1.0, norm="layernorm"), "offsets an RMSNorm's gain"),
    (dict(attn_softcap=0.0), "attn_softcap=0.0 is invalid"),
    (dict(final_softcap=float("inf")), "final_softcap=inf is invalid"),
    (dict(rope_local_theta=10000.0), "it needs pos_encoding='rotary' and a sliding_window"),
    (dict(activation="reglu"), "allowed: gelu, gelu_tanh, swiglu, geglu_tanh, geglu"),
])
def test_family_options_are_validated_by_name(settings, says):
    base = dict(n_layer=2, n_embd=64, n_head=4, pos_encoding="rotary", norm="rmsnorm")
    with pytest.raises(ConfigError, match=re.escape(says)):
        ModelConfig(**{**base, **settings})
    # an encoder's window is symmetric (ModernBERT's): allowed, as a causal LM's
    assert ModelConfig(task="classifier", num_labels=2, sliding_window=8).windowed(0)
    cfg = ModelConfig(**base, head_size=32, nope_layers=[1], sliding_window=8,
                      full_attention_layers=[0])  # JSON's lists come back as tuples
    assert ModelConfig.from_json(cfg.to_json()) == cfg and cfg.q_width == 128


GEMMA_LIKE = dict(norm_offset=1.0, post_norms=True, activation="geglu_tanh", head_size=32,
                  embedding_multiplier=8.0, attention_multiplier=256 ** -0.5,
                  sliding_window=16, full_attention_layers=(1,))  # sqrt(64): the width's


@pytest.mark.parametrize("entry, settings", [
    ("LLAMA", dict(head_size=32, rope_scaling={"rope_type": "linear", "factor": 4.0})),
    ("MISTRAL", dict(sliding_window=16)),
    ("QWEN2", dict(qkv_bias=True, sliding_window=16, full_attention_layers=(0,))),
    ("QWEN3", dict(qk_norm=True, head_size=32)),
    ("SMOLLM3", dict(nope_layers=(1,))),
    ("GRANITE", dict(embedding_multiplier=12.0, residual_multiplier=0.22,
                     attention_multiplier=0.015625, logits_scaling=8.0)),
    ("GEMMA3", dict(GEMMA_LIKE, qk_norm=True, rope_local_theta=10000.0, final_softcap=30.0)),
    ("GEMMA2", dict(GEMMA_LIKE, attn_softcap=50.0, final_softcap=30.0, tie_weights=False)),
])
def test_new_entries_map_their_config_and_weights_both_ways(entry, settings):
    """Without transformers: the entry writes the model, its config.json reads back as it,
    and every tensor comes back unchanged through the entry's names."""
    from llama_reference import small_llama

    from tinyt.hf.weights import pairs

    family = getattr(hf, entry)
    cfg = small_llama(vocab_size=300, n_embd=64, n_inner=96, **settings)
    assert hf.writer_for(cfg, "the test model") is family
    assert hf.config_from_hf(family, hf.hf_config(family, cfg, 256), "config.json") == cfg
    torch.manual_seed(0)
    model = build_model(cfg)
    theirs = hf.hf_state(family, model)
    assert sorted(theirs) == sorted(n for p in pairs(family, cfg) for n in p.theirs)
    back, ours = hf.state_from_hf(family, theirs, cfg, "test"), unique_state_dict(model)
    assert back.keys() == ours.keys() and all(torch.equal(back[k], ours[k]) for k in ours)


def test_a_model_no_class_holds_is_refused_with_each_reason(tmp_path):
    from llama_reference import small_llama

    from tinyt.tokenizer import Tokenizer

    cfg = small_llama(vocab_size=300, qk_norm=True, nope_layers=(1,))  # Qwen3 + SmolLM3
    src = save_checkpoint(tmp_path / "src", build_model(cfg), Tokenizer.byte_level())
    with pytest.raises(ConversionError) as e:
        to_hf(src, tmp_path / "out")
    assert "a LlamaForCausalLM has no qk_norm='head', nope_layers=(1,)" in str(e.value)
    assert "Qwen3ForCausalLM" in str(e.value) and not (tmp_path / "out").exists()
    cfg = small_llama(vocab_size=300, sliding_window=8, full_attention_layers=(0,))
    assert "MistralForCausalLM's window covers every layer; this one leaves out [0]" in \
        str(misfit(hf.MISTRAL, cfg))  # but SmolLM3's layer_types say which layers
    src = save_checkpoint(tmp_path / "src2", build_model(cfg), Tokenizer.byte_level())
    meta = json.loads((to_hf(src, tmp_path / "out") / "config.json").read_text())
    assert meta["architectures"] == ["SmolLM3ForCausalLM"] and meta["no_rope_layers"] == [1, 1]
    assert meta["layer_types"] == ["full_attention", "sliding_attention"]
    assert load_checkpoint(import_hf(tmp_path / "out", tmp_path / "back")).config == cfg


def test_transformers_reads_the_fixture_configs_as_the_real_models_settings():
    """The fixtures carry what the real config.json files say (their contexts included)."""
    assert hf_model("llama3.2").config.rope_scaling["rope_type"] == "llama3"
    assert hf_model("smollm3").config.no_rope_layers == [1, 1, 1, 0]
    assert hf_model("qwen3").config.head_dim == 32 != 64 // 4
    assert {n: REAL[n][1]["max_position_embeddings"] for n in ("llama3.2", "qwen3", "mistral",
                                                               "smollm3", "granite")} == \
        {"llama3.2": 131072, "qwen3": 40960, "mistral": 32768, "smollm3": 65536,
         "granite": 131072}


def test_the_window_counts_positions_not_slots():
    """A pinned-shape graph's layout (runtime/fixed.py): the past right-aligned in its slots,
    a step of S slots with the token last behind padding. The window must count the keys'
    positions, not their slots: the last token's logits equal a contiguous run's."""
    torch.manual_seed(0)
    cfg = ModelConfig(block_size=64, vocab_size=50, n_layer=2, n_head=2, n_embd=32,
                      norm="rmsnorm", pos_encoding="rotary", activation="swiglu", bias=False,
                      sliding_window=4)
    model = build_model(cfg).eval()
    x = torch.randint(0, 50, (1, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = model(x)[0][0, -1]
        P, S = 12, 4  # 9 real tokens in 12 slots, then the tenth behind 3 slots of padding
        past_ids = torch.cat([torch.zeros(1, P - 9, dtype=torch.long), x[:, :9]], dim=1)
        past_mask = torch.tensor([[0] * (P - 9) + [1] * 9])
        _, cache = model(past_ids, attention_mask=past_mask,
                         position_ids=torch.tensor([[0] * (P - 9) + list(range(9))]))
        step = torch.cat([torch.zeros(1, S - 1, dtype=torch.long), x[:, 9:]], dim=1)
        mask = torch.cat([past_mask, torch.tensor([[0] * (S - 1) + [1]])], dim=1)
        got = model(step, attention_mask=mask, position_ids=torch.tensor([[9] * S]),
                    past_key_values=cache)[0][0, -1]
    assert float((got - want).abs().max()) <= 1e-5
