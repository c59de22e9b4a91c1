"""The Llama-family options of the one model (RMSNorm, rotary positions, SwiGLU, grouped-query
attention, q/k/v-only biases): equal to transformers' LlamaForCausalLM and Qwen2ForCausalLM on
the same random weights, over a whole sequence and step by step through the cache; what the
options mean (grouped heads, positions relative, left padding); training; and the stages that
do not take them yet refuse them by name."""
import math

import pytest
import torch
from conftest import assert_close
from llama_reference import HF_ATOL, from_hf, hf_reference, small_llama

from tinyt.config import ModelConfig, TrainConfig
from tinyt.errors import ConfigError
from tinyt.model import build_model

CACHE_TOL = 1e-5  # tinyt against itself: cached vs full, padded vs alone (as test_model.py)
@pytest.mark.parametrize("kind, shape", [
    ("llama", dict()),  # grouped: 4 query heads, 2 key/value heads
    ("llama", dict(n_kv_head=1, tie_weights=False)),  # multi-query, untied head
    ("llama", dict(n_kv_head=4, n_head=4, n_embd=48, n_inner=64)),  # one kv head per head
    ("qwen2", dict(qkv_bias=True, n_head=6, n_kv_head=2, n_embd=48)),  # q/k/v biases only
])
def test_equal_to_transformers_over_a_sequence_and_through_the_cache(kind, shape):
    cfg = small_llama(**shape)
    hf = hf_reference(kind, cfg)
    ours = from_hf(hf, cfg)
    ids = torch.randint(0, cfg.vocab_size, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(ids).logits
        assert_close(ours(ids)[0], want, HF_ATOL, f"{kind} full-sequence logits")
        logits, cache = ours(ids[:, :12])
        assert cache[0][0].shape == (2, cfg.kv_heads, 12, cfg.head_dim)  # n_kv_head heads
        for t in range(12, 20):  # step by step through the cache
            logits, cache = ours(ids[:, t:t + 1], past_key_values=cache)
            assert_close(logits[:, 0], want[:, t], HF_ATOL, f"{kind} cached logits at {t}")


def test_grouped_heads_equal_full_heads_with_each_key_value_head_repeated():
    """Query head i reads key/value head i // (n_head / n_kv_head): the same model with every
    key/value head copied out to its group's query heads gives the same logits."""
    cfg = small_llama(n_head=4, n_kv_head=2)
    torch.manual_seed(0)
    grouped = build_model(cfg).eval()
    full = build_model(small_llama(n_head=4, n_kv_head=4)).eval()
    sd = grouped.state_dict()
    C, hs = cfg.n_embd, cfg.head_dim
    for i in range(cfg.n_layer):
        w = sd[f"transformer.h.{i}.attn.c_attn.weight"]
        q, k, v = w[:C], w[C:C + 2 * hs], w[C + 2 * hs:]
        rep = lambda x: x.view(2, hs, C).repeat_interleave(2, dim=0).reshape(4 * hs, C)  # noqa
        sd[f"transformer.h.{i}.attn.c_attn.weight"] = torch.cat([q, rep(k), rep(v)])
    full.load_state_dict(sd)
    ids = torch.randint(0, cfg.vocab_size, (3, 17))
    with torch.no_grad():
        assert_close(grouped(ids)[0], full(ids)[0], CACHE_TOL, "grouped vs repeated heads")


def test_rotary_positions_are_relative_and_left_padding_keeps_them():
    cfg = small_llama()
    torch.manual_seed(0)
    m = build_model(cfg).eval()
    ids = torch.randint(1, cfg.vocab_size, (1, 9))
    pos = torch.arange(9).unsqueeze(0)
    with torch.no_grad():  # only differences of positions enter attention
        assert_close(m(ids, position_ids=pos + 7)[0], m(ids, position_ids=pos)[0], CACHE_TOL,
                     "positions shifted by 7")
        padded = torch.cat([torch.zeros(1, 4, dtype=torch.long), ids], dim=1)
        mask = torch.cat([torch.zeros(1, 4), torch.ones(1, 9)], dim=1).long()
        assert_close(m(padded, attention_mask=mask)[0][:, 4:], m(ids)[0], CACHE_TOL,
                     "left-padded row vs alone")
        differs = (m(ids, position_ids=pos.flip(-1))[0] - m(ids)[0]).abs().max()
        assert differs > 1e-3  # and positions do matter


def test_options_are_validated_by_name():
    for kw, says in ((dict(n_kv_head=3), "n_kv_head=3 is invalid: must be null"),
                     (dict(norm="batchnorm"), "norm='batchnorm' is invalid: allowed: layernorm"),
                     (dict(rope_theta=float("nan")), "rope_theta=nan is invalid"),
                     (dict(n_embd=36, n_head=4, n_kv_head=2), "even head_dim for rotary"),
                     (dict(qkv_bias="yes"), "qkv_bias='yes' is invalid"),
                     (dict(activation="relu"), "activation='relu' is invalid")):
        with pytest.raises(ConfigError, match=says):
            small_llama(**kw)
    cfg = small_llama(qkv_bias=True)
    assert cfg.kv_cache_bytes_per_token() == 2 * 2 * 2 * 8 * 4  # layers, k+v, kv heads, hs
    assert ModelConfig().llama_options == [] and "n_kv_head=2" in cfg.llama_options
    assert ModelConfig.from_json(cfg.to_json()) == cfg  # checkpoints keep every option


@pytest.mark.slow
def test_a_llama_model_trains_saves_and_reloads(corpus_dir, tmp_path):
    from tinyt.checkpoint import load_checkpoint
    from tinyt.train import train

    cfg = small_llama(block_size=32, vocab_size=300)
    out = train(cfg, TrainConfig(max_steps=30, batch_size=8, warmup_steps=2, eval_interval=15,
                                 eval_batches=2, learning_rate=3e-3, min_lr=3e-4),
                tmp_path / "ck", data=str(corpus_dir), log=lambda s: None)
    ck = load_checkpoint(out)
    history = ck.meta["metrics"]
    assert ck.config.llama_options == cfg.llama_options and history["step"] == 30
    ids = torch.randint(0, ck.config.vocab_size, (1, 10))
    with torch.no_grad():
        again = load_checkpoint(out).model(ids)[0]
        assert torch.equal(ck.model(ids)[0], again)
    # it learned: below the loss of a uniform guess over the vocabulary, ln(V), by a margin
    assert history["val_loss"] < math.log(ck.config.vocab_size) - 1.0
