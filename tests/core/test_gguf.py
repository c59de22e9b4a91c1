"""GGUF files in (issue 51): `tinyt import-hf MODEL.gguf OUT` on a tiny Llama written by
gguf.GGUFWriter as llama.cpp's converter writes one (tests/gguf_fixtures.py: Q4_0 attention,
Q4_1 MLP, Q8_0 embedding, q / k rows permuted). The real SmolLM2 Q4_1 file: tests/real.

Bounds: the weights are the file's dequantized values exactly (gguf's fp32 d·q, d·q + m); tinyt
against transformers' GGUF-loaded model on them is the import's HF_LOGITS_ATOL (the same fp32
arithmetic in other orders; measured ~1e-6 here)."""
from __future__ import annotations

import struct

import numpy as np
import pytest
import torch
from conftest import run_tinyt
from gguf_fixtures import SIZE, hf_state, tokens, write_gguf

from tinyt.checkpoint import load_checkpoint
from tinyt.errors import CheckpointError, ConversionError
from tinyt.hf import HF_LOGITS_ATOL, LLAMA, import_hf, state_from_hf
from tinyt.hf.gguf import BLOCKS_FILE, read_blocks

TEXTS = ["the theory in 2026: 31,415 items", "<|im_start|>user\nhi there<|im_end|>\n",
         "  tabs\tand\nnew lines\n\n", "é ü 日本 ✓"]


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.Q4_0.gguf")


@pytest.fixture(scope="module")
def imported(gguf_file, tmp_path_factory):
    return import_hf(gguf_file, tmp_path_factory.mktemp("ck") / "ck")


def test_config_and_weights_are_the_files(imported, gguf_file):
    ck = load_checkpoint(imported)
    cfg = ck.config
    assert (cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_kv_head, cfg.block_size, cfg.vocab_size,
            cfg.tie_weights, cfg.rope_theta) == (SIZE["layers"], SIZE["width"], SIZE["heads"],
                                                 SIZE["kv_heads"], SIZE["context"],
                                                 len(tokens()[0]), True, 100000.0)
    want = state_from_hf(LLAMA, {k: torch.from_numpy(v) for k, v in hf_state(gguf_file).items()},
                         cfg, "fixture")
    got = ck.model.state_dict()
    for name, value in want.items():
        assert got[name].shape == value.shape, name
        assert got[name].dtype == value.dtype, name
        assert torch.equal(got[name], value), f"{name}: not the file's dequantized values"
    assert ck.meta["metrics"]["imported_from"] == "gguf"
    assert ck.meta["metrics"]["gguf_types"] == ["F32", "Q4_0", "Q4_1", "Q8_0"]


def test_tokenizer_follows_the_file(imported):
    """Specials whole, digits one by one (tokenizer.ggml.pre 'smollm'), no BOS added
    (add_bos_token false), the chat template and the end the file names."""
    tok = load_checkpoint(imported).tokenizer
    ids = tok.encode(TEXTS[0])
    assert [tok.hf.id_to_token(i) for i in ids[:3]] == ["t", "he", "Ġthe"]
    assert tok.decode(ids) == TEXTS[0]
    digits = tok.encode("2026")
    assert len(digits) == 4
    assert tok.encode(TEXTS[1])[0] == 1 and tok.encode_prompt("hi") == tok.encode("hi")
    assert (tok.eos_token, tok.bos_token) == ("<|im_end|>", "<|im_start|>")
    assert "<|im_start|>" in tok.chat_template
    for text in TEXTS:
        assert tok.decode(tok.encode(text)) == text


def test_blocks_are_kept_under_tinyts_names(imported):
    """The Q4_0 / Q4_1 / Q8_0 matrices' raw blocks, fused where tinyt fuses (c_attn: q, k, v
    rows stacked), their types recorded; each dequantizes to the checkpoint's fp32 weight."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    blocks = read_blocks(imported)
    state = load_checkpoint(imported).model.state_dict()
    assert (imported / BLOCKS_FILE).is_file()
    assert blocks["transformer.h.0.attn.c_attn.weight"][0] == "Q4_0"
    assert blocks["transformer.h.1.mlp.c_fc.weight"][0] == "Q4_1"
    assert blocks["transformer.wte.weight"][0] == "Q8_0"
    assert len(blocks) == 1 + 4 * SIZE["layers"]
    for name, (kind, rows) in blocks.items():
        values = dequantize(rows, GGMLQuantizationType[kind])
        assert torch.equal(torch.from_numpy(values), state[name]), name


def test_other_types_are_dequantized_and_left_to_the_recipe(tmp_path):
    """A type not carried (Q5_0 here) is read as its fp32 values; a fused matrix whose parts
    differ in type (c_attn: Q5_0 q, Q4_0 k, v) keeps no blocks."""
    path = write_gguf(tmp_path / "mixed.gguf", types={"attn_q": "Q5_0"})
    ck = load_checkpoint(import_hf(path, tmp_path / "ck"))
    want = state_from_hf(LLAMA, {k: torch.from_numpy(v) for k, v in hf_state(path).items()},
                         ck.config, "fixture")
    assert torch.equal(ck.model.state_dict()["transformer.h.0.attn.c_attn.weight"],
                       want["transformer.h.0.attn.c_attn.weight"])
    blocks = read_blocks(tmp_path / "ck")
    assert "transformer.h.0.attn.c_attn.weight" not in blocks
    assert blocks["transformer.h.0.attn.c_proj.weight"][0] == "Q4_0"


def test_logits_equal_transformers_gguf_loader(imported, gguf_file):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32,
        attn_implementation="eager").eval()
    ck = load_checkpoint(imported)
    ids = torch.tensor([ck.tokenizer.encode(" ".join(TEXTS))])
    with torch.no_grad():
        want = ref(ids).logits[0]
        got = ck.model.eval()(ids)[0][0]
    assert got.shape == want.shape and got.dtype == want.dtype
    worst = float((got - want).abs().max())
    assert worst <= HF_LOGITS_ATOL, worst


def test_cli_imports_a_gguf_file(gguf_file, tmp_path):
    """`tinyt import-hf MODEL.gguf OUT`, with import-hf's --context as for a directory."""
    done = run_tinyt("import-hf", gguf_file, tmp_path / "ck", "--context", "64")
    assert done.returncode == 0, done.stderr
    assert "Q4_0, Q4_1, Q8_0" in done.stderr and (tmp_path / "ck" / BLOCKS_FILE).is_file()
    metrics = load_checkpoint(tmp_path / "ck").meta["metrics"]
    assert (metrics["context"], metrics["model_context"]) == (64, SIZE["context"])


def _patch_type(data: bytes, tensor: str, kind: int) -> bytes:
    """The file with `tensor`'s GGML type id set to `kind` (tensor info: name, n_dims u32,
    dims u64 each, type u32, offset u64)."""
    at = data.index(tensor.encode()) + len(tensor)
    n_dims = struct.unpack_from("<I", data, at)[0]
    at += 4 + 8 * n_dims
    return data[:at] + struct.pack("<I", kind) + data[at + 4:]


@pytest.mark.parametrize("case", ["text", "truncated", "unknown type", "architecture",
                                  "tensor name", "empty"])
def test_bad_input_is_refused_by_name_and_writes_nothing(case, gguf_file, tmp_path):
    path = tmp_path / "bad.gguf"
    data = gguf_file.read_bytes()
    error, words = CheckpointError, "not a GGUF file"
    if case == "text":
        path.write_text("{\"model_type\": \"llama\"}\n")
    elif case == "empty":
        path.write_bytes(b"")
    elif case == "truncated":
        path.write_bytes(data[: len(data) // 2])
        words = "not a readable GGUF file"
    elif case == "unknown type":
        path.write_bytes(_patch_type(data, "blk.0.attn_q.weight", 99))
        words = "not a readable GGUF file"
    elif case == "architecture":
        write_gguf(path, arch="gpt2")
        error, words = ConversionError, "general.architecture='gpt2'; tinyt reads GGUF files " \
                                        "of llama"
    else:
        write_gguf(path, extra_tensors={"rope_freqs.weight": np.ones(8, np.float32)})
        error, words = ConversionError, "rope_freqs.weight"
    with pytest.raises(error, match=words.replace("(", r"\(").replace(".", r"\.")):
        import_hf(path, tmp_path / "ck")
    assert not (tmp_path / "ck").exists()
    assert not list(tmp_path.glob(".ck.tmp-*"))
