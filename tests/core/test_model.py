import pytest
import torch
from conftest import assert_close

from tinyt.config import ModelConfig
from tinyt.errors import ConfigError
from tinyt.model import TinyClassifier, TinyTransformer, build_model, generate

CACHE_TOL = 1e-5  # cached step-by-step decoding vs the full forward
PAD_TOL = 1e-5  # padding / batching vs one row alone (float summation order only)

BASE = dict(block_size=32, vocab_size=97, n_layer=2, n_head=4, n_embd=32)


def lm(pos="learned", **kw) -> TinyTransformer:
    torch.manual_seed(0)
    return TinyTransformer(ModelConfig(**{**BASE, "pos_encoding": pos, **kw})).eval()


@pytest.mark.parametrize("pos", ["learned", "sinusoidal"])
def test_forward_shapes_and_cache(pos):
    m = lm(pos)
    x = torch.randint(0, 97, (3, 20))
    logits, present = m(x)
    assert logits.shape == (3, 20, 97)  # every position, not only the last
    assert len(present) == 2 and present[0][0].shape == (3, 4, 20, 8)


@pytest.mark.parametrize("pos", ["learned", "sinusoidal"])
def test_causality_is_exact(pos):
    m = lm(pos)
    x = torch.randint(0, 97, (2, 24))
    t = 13
    y = x.clone()
    y[:, t] = (y[:, t] + 1) % 97
    a, _ = m(x)
    b, _ = m(y)
    assert torch.equal(a[:, :t], b[:, :t])  # nothing before t may see token t
    assert not torch.equal(a[:, t], b[:, t])


@pytest.mark.parametrize("pos", ["learned", "sinusoidal"])
def test_cached_decoding_equals_full_forward(pos):
    m = lm(pos)
    x = torch.randint(0, 97, (2, 32))
    full, _ = m(x)
    logits, cache = m(x[:, :7])  # prefill
    steps = [logits]
    for t in range(7, 32):
        logits, cache = m(x[:, t:t + 1], past_key_values=cache)
        steps.append(logits)
    assert_close(torch.cat(steps, dim=1), full, CACHE_TOL, "cached vs full")
    assert cache[0][0].shape == (2, 4, 32, 8)


def test_batch_of_rows_equals_rows_one_by_one():
    m = lm()
    x = torch.randint(0, 97, (4, 16))
    batch, _ = m(x)
    rows = torch.cat([m(x[i:i + 1])[0] for i in range(4)])
    assert_close(batch, rows, PAD_TOL, "batch vs rows")


def test_left_padding_with_mask_matches_unpadded():
    m = lm()
    a = torch.randint(0, 97, (1, 10))
    b = torch.randint(0, 97, (1, 16))
    x = torch.cat([torch.zeros(1, 6, dtype=torch.long), a], dim=1)
    batch = torch.cat([x, b])
    mask = torch.ones_like(batch)
    mask[0, :6] = 0
    logits, _ = m(batch, attention_mask=mask)
    assert not torch.isnan(logits).any()
    assert_close(logits[0:1, 6:], m(a)[0], PAD_TOL, "left-padded row")
    assert_close(logits[1:2], m(b)[0], PAD_TOL, "unpadded row")


def test_tied_weight_is_one_parameter():
    m = lm()
    assert m.lm_head.weight is m.transformer.wte.weight
    assert m.lm_head.weight.data_ptr() == m.transformer.wte.weight.data_ptr()
    untied = lm(tie_weights=False)
    assert untied.lm_head.weight.data_ptr() != untied.transformer.wte.weight.data_ptr()


@pytest.mark.parametrize("pos,tie,bias", [("learned", True, True), ("sinusoidal", False, False)])
def test_parameter_count(pos, tie, bias):
    V, T, L, C = 97, 32, 2, 32
    m = lm(pos, tie_weights=tie, bias=bias)
    b = 1 if bias else 0
    per_block = (2 * C * b + C * 2) + (C * 3 * C + 3 * C * b) + (C * C + C * b) \
        + (C * 4 * C + 4 * C * b) + (4 * C * C + C * b)  # 2 norms, qkv, proj, fc, proj
    expected = V * C + (T * C if pos == "learned" else 0) + L * per_block + (C + C * b)
    expected += 0 if tie else V * C
    assert m.num_parameters() == expected


def test_gpt2_init_scales_residual_projections():
    torch.manual_seed(0)
    m = TinyTransformer(ModelConfig(block_size=16, vocab_size=97, n_layer=8, n_head=4, n_embd=256))
    std_proj = m.transformer.h[0].attn.c_proj.weight.std().item()
    std_fc = m.transformer.h[0].mlp.c_fc.weight.std().item()
    assert abs(std_fc - 0.02) < 0.002
    assert abs(std_proj - 0.02 / 4) < 0.001  # 0.02 / sqrt(2 * 8)


def test_forward_prints_nothing(capsys):
    m = lm()
    m(torch.randint(0, 97, (1, 5)))
    assert capsys.readouterr().out == ""


def test_classifier_padding_does_not_change_logits():
    torch.manual_seed(0)
    cfg = ModelConfig(**BASE, task="classifier", num_labels=3)
    m = TinyClassifier(cfg).eval()
    rows = [torch.randint(0, 97, (n,)) for n in (5, 12, 9)]
    alone = torch.cat([m(r[None]) for r in rows])
    T = 12
    x = torch.zeros(3, T, dtype=torch.long)
    mask = torch.zeros(3, T, dtype=torch.long)
    for i, r in enumerate(rows):
        x[i, :len(r)] = r
        mask[i, :len(r)] = 1
    batched = m(x, mask)
    assert batched.shape == (3, 3)
    assert_close(batched, alone, PAD_TOL, "padded classifier batch")
    x[0, 5:] = 42  # what sits under padding must not matter
    assert_close(m(x, mask), batched, 0.0, "padding content")


def test_classifier_is_bidirectional():
    torch.manual_seed(0)
    m = TinyClassifier(ModelConfig(**BASE, task="classifier", num_labels=2)).eval()
    x = torch.randint(0, 97, (1, 10))
    y = x.clone()
    y[0, -1] = (y[0, -1] + 1) % 97
    assert not torch.equal(m(x), m(y))


def test_build_model_and_wrong_task():
    assert isinstance(build_model(ModelConfig(**BASE)), TinyTransformer)
    with pytest.raises(ConfigError, match="TinyEncoder needs task='classifier', 'encoder' "
                                          "or 'token_classifier'"):
        TinyClassifier(ModelConfig(**BASE))


def test_generate_greedy_matches_argmax_of_full_forward():
    m = lm()
    prompt = torch.randint(0, 97, (1, 5))
    out = generate(m, prompt, 10, temperature=0)
    assert out.shape == (1, 15) and torch.equal(out[:, :5], prompt)
    full, _ = m(out[:, :-1])
    assert torch.equal(full[0, 4:].argmax(-1), out[0, 5:])  # each step is the full-model argmax


def test_generate_stops_at_block_size():
    m = lm()
    out = generate(m, torch.randint(0, 97, (1, 30)), 50, temperature=1.0)
    assert out.shape[1] == 32
    with pytest.raises(ValueError, match="outside 1..block_size=32"):
        generate(m, torch.randint(0, 97, (1, 33)), 1)
