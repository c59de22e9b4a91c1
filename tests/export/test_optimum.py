"""Interop: Hugging Face Optimum's ORTModelForCausalLM loads tinyt's exported directory and
its greedy generate() gives the tokens tinyt's PyTorch model gives. Skipped only when the
`optimum` extra is not installed (CI installs it)."""
import pytest
import torch

pytest.importorskip("optimum.onnxruntime", reason="the optimum extra is not installed")

from tinyt.checkpoint import load_checkpoint  # noqa: E402
from tinyt.export import export_onnx  # noqa: E402
from tinyt.model import generate  # noqa: E402


@pytest.mark.parametrize("prompt", ["def ", "import os\n", "    return alpha"])
def test_optimum_greedy_generate_matches_tinyt(tiny_ckpt, tmp_path_factory, prompt, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a local directory: nothing to fetch
    from optimum.onnxruntime import ORTModelForCausalLM

    out = tmp_path_factory.getbasetemp() / "optimum-onnx"
    if not out.exists():
        export_onnx(tiny_ckpt, out)
    ck = load_checkpoint(tiny_ckpt)
    model = ORTModelForCausalLM.from_pretrained(out, provider="CPUExecutionProvider")
    ids = torch.tensor([ck.tokenizer.encode(prompt)])
    steps = ck.config.block_size - ids.shape[1]
    got = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=steps,
                         do_sample=False, eos_token_id=None, pad_token_id=ck.tokenizer.eos_id)
    want = generate(ck.model, ids, steps, temperature=0)
    assert got.shape == want.shape == (1, ck.config.block_size)
    assert torch.equal(got, want)
