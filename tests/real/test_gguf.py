"""The real SmolLM2-135M-Instruct Q4_1 GGUF through tinyt's own GGUF import (issue 51),
against transformers' GGUF loader on the same file (smollm2_dir: tests/real/build.py).

Bounds: the weights are transformers' dequantized ones bit for bit (both are gguf's fp32
d·q + m, with llama.cpp's q / k permutation undone); the logits then differ only by the
order of fp32 sums, held to compare.reorder_bound as test_smollm2.py holds the directory's
import (measured 7.6e-5 on 41 tokens, largest logit 41.6, AMD EPYC AVX2)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.real, pytest.mark.slow]

TEXTS = ["def fibonacci(n):\n    return n if n < 2 else fibonacci(n-1) + fibonacci(n-2)\n",
         "The year 2026 had 365 days; pi is 3.14159.",
         "Hello, world! Ça va? 日本語のテキスト <|im_start|>user\nhi<|im_end|>\n",
         "  leading spaces\n\n\ttabs and    runs   "]


@pytest.fixture(scope="module")
def imported_dir(smollm2_gguf, tmp_path_factory):
    from tinyt.hf import import_hf

    return import_hf(smollm2_gguf, tmp_path_factory.mktemp("gguf") / "ck")


def test_gguf_import_is_transformers_gguf_model(imported_dir, smollm2_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tinyt.checkpoint import load_checkpoint
    from tinyt.export.compare import reorder_bound
    from tinyt.hf import LLAMA, read_hf_weights, state_from_hf

    imported = load_checkpoint(imported_dir)
    cfg = imported.config
    assert (cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_kv_head, cfg.block_size,
            cfg.vocab_size, cfg.tie_weights) == (30, 576, 9, 3, 8192, 49152, True)
    theirs = state_from_hf(LLAMA, read_hf_weights(smollm2_dir), cfg, str(smollm2_dir))
    ours = imported.model.state_dict()
    differ = [k for k, v in theirs.items() if not torch.equal(ours[k], v)]
    assert not differ, f"not transformers' dequantized weights: {differ[:5]}"
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    for text in TEXTS:  # transformers adds a BOS the file's add_bos_token=false does not ask for
        assert imported.tokenizer.encode(text) == tok.encode(text, add_special_tokens=False)
    ref = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32,
                                               attn_implementation="eager").eval()
    ids = torch.tensor([imported.tokenizer.encode(TEXTS[0] + TEXTS[3])])
    with torch.no_grad():
        want = ref(ids).logits[0]
        got = imported.model.eval()(ids)[0][0]
    assert got.shape == want.shape and got.dtype == want.dtype
    worst, bound = float((got - want).abs().max()), reorder_bound(cfg, float(want.abs().max()))
    assert worst <= bound, (worst, bound)
    assert np.array_equal(got.argmax(-1).numpy(), want.argmax(-1).numpy())


def test_kept_blocks_make_the_checkpoints_weights(imported_dir):
    """Every kept matrix (120 Q4_1, the tied Q8_0 table) as the MatMulNBits table quantize
    --gguf-blocks writes: Q8_0 bit for bit; Q4_1 bit for bit but in the blocks whose float
    zero point cannot give -m exactly (measured 9.8% of 3,317,760), there one rounding of m."""
    from safetensors.numpy import load_file

    from tinyt.export.gguf_blocks import dequantize_table, nbits_table
    from tinyt.hf.gguf import read_blocks

    blocks = read_blocks(imported_dir)
    weights = load_file(str(imported_dir / "model.safetensors"))
    assert sorted({kind for kind, _ in blocks.values()}) == ["Q4_1", "Q8_0"]
    assert len(blocks) == 121 and blocks["transformer.wte.weight"][0] == "Q8_0"
    inexact = total = 0
    for name, (kind, raw) in blocks.items():
        table = nbits_table(kind, raw)
        got, want = dequantize_table(table), weights[name]
        assert got.shape == want.shape and got.dtype == want.dtype, name
        if kind == "Q8_0":
            assert np.array_equal(got, want), name
        else:
            assert float(np.abs(got - want).max()) <= 2.0 ** -23 * float(np.abs(want).max())
        inexact, total = inexact + table.inexact_blocks, total + table.scales.size * (
            kind == "Q4_1")
    assert inexact < 0.15 * total, (inexact, total)
