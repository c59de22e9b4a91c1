"""A context costs only what is used: a model with Llama-3.2's 131,072-token context through
`tinyt pipeline --skip-train` and generation within a bounded peak RSS; the stages' reports
name the sizes they checked; the runtime's KV buffers sized by the call or by max_context;
a cache that cannot fit refused in one line before it is allocated; import-hf --context."""
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hf_fixtures import save_hf

import tinyt.runtime as rt
from tinyt.errors import ConfigError
from tinyt.runtime.feeds import CHECK_TOKENS

ROOT = Path(__file__).resolve().parents[2]
CONTEXT = 131_072  # llama-131k's max_position_embeddings (Llama-3.2's)
PEAK_RSS = 2 << 30  # bytes: a 2-layer, 64-wide model; the full-block checks asked for 824 GB


# A small launcher runs the command and writes its child's peak RSS to a file: a child spawned
# straight from this test process (vfork, then exec) starts its ru_maxrss at this process's
# high-water mark, which under pytest-xdist is the worker's after every earlier test (2 GiB).
LAUNCH = ("import os, subprocess, sys\n"
          "p = subprocess.Popen(sys.argv[2:])\n"
          "_, status, usage = os.wait4(p.pid, 0)\n"
          "open(sys.argv[1], 'w').write(str(usage.ru_maxrss * 1024))\n"
          "sys.exit(os.waitstatus_to_exitcode(status))\n")


def measured(*args: str) -> tuple[subprocess.CompletedProcess, int, float]:
    """`python -m tinyt ARGS` in a child; (its result, its peak RSS in bytes, wall seconds).
    os.wait4 in the launcher reads that child's own peak (its waited-for descendants
    included), not that of every child the launcher had (RUSAGE_CHILDREN)."""
    import tempfile

    t = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        peak = Path(tmp) / "peak"
        proc = subprocess.run([sys.executable, "-c", LAUNCH, str(peak), sys.executable, "-m",
                               "tinyt", *args], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT)
        rss = int(peak.read_text())
    return proc, rss, time.perf_counter() - t


@pytest.fixture(scope="module")
def long_ckpt(tmp_path_factory):
    from tinyt.hf import import_hf

    root = tmp_path_factory.mktemp("long")
    save_hf("llama-131k", root / "hf")
    return import_hf(root / "hf", root / "ck")


@pytest.fixture(scope="module")
def pipeline_run(long_ckpt, corpus_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("long-run") / "out"
    proc, rss, wall = measured("pipeline", "--skip-train", str(long_ckpt), "--out", str(out),
                               "--data", str(corpus_dir), "--no-bench")
    print(f"pipeline --skip-train at context {CONTEXT}: {wall:.1f} s, peak RSS "
          f"{rss / 2**20:.0f} MiB")
    return out, proc, rss


@pytest.mark.slow
def test_a_131k_context_goes_through_the_pipeline_and_generates_in_bounded_memory(
        pipeline_run):
    out, proc, rss = pipeline_run
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert rss <= PEAK_RSS, f"peak RSS {rss / 2**20:.0f} MiB"
    for name in ("onnx", "onnx-opt"):
        assert json.loads((out / f"{name}-verify.json").read_text())["passed"], name
    for artifact in ("onnx-int8", "onnx-int8-gqa", "onnx-int8-rows-gqa"):
        gen, rss, wall = measured("generate", str(out / artifact), "def ", "--max-new-tokens",
                                  "24", "--temperature", "0", "--threads", "1")
        print(f"generate on {artifact}: {wall:.1f} s, peak RSS {rss / 2**20:.0f} MiB")
        assert gen.returncode == 0, gen.stdout[-2000:]
        assert gen.stdout.startswith("def ") and rss <= PEAK_RSS


@pytest.mark.slow
def test_the_stages_report_the_sizes_they_checked(pipeline_run, corpus_dir, tmp_path):
    """Bounded by CHECK_TOKENS whatever the context, and reaching its last position."""
    from tinyt.export.quantize import quantize

    out, proc, _ = pipeline_run
    assert proc.returncode == 0, proc.stdout[-3000:]
    verify = json.loads((out / "onnx-verify.json").read_text())["sizes"]
    assert verify == {"longest_sequence": CHECK_TOKENS, "context": CONTEXT, "batch": 3,
                      "highest_position": CONTEXT - 1, "generated_tokens": 64}
    opt = json.loads((out / "onnx-opt" / "manifest.json").read_text())
    assert opt["equivalence"]["sizes"] == {"longest_sequence": CHECK_TOKENS, "context": CONTEXT,
                                           "highest_position": CONTEXT - 1, "batch": 4}
    int8 = json.loads((out / "onnx-int8" / "manifest.json").read_text())
    assert (int8["accuracy"]["window"], int8["accuracy"]["context"]) == (CHECK_TOKENS, CONTEXT)
    # static INT8 is not the main job's (tinyt.artifacts): made here, as a user would
    quantize(out / "onnx", tmp_path / "static", mode="static", data=str(corpus_dir))
    static = json.loads((tmp_path / "static" / "manifest.json").read_text())
    assert static["quantization"]["calibration_window"] == CHECK_TOKENS
    gqa = json.loads((out / "onnx-int8-gqa" / "manifest.json").read_text())["equivalence"]
    assert gqa["sizes"]["context"] == CONTEXT
    assert gqa["sizes"]["longest_sequence"] <= CHECK_TOKENS


@pytest.mark.slow
def test_max_context_bounds_the_context_and_buffers_follow_the_call(pipeline_run):
    out, proc, _ = pipeline_run
    assert proc.returncode == 0, proc.stdout[-3000:]
    lm = rt.load(out / "onnx-int8-gqa", threads=1, tune=False)
    assert lm.context == CONTEXT
    lm.generate_ids([[5, 6, 7]], max_new_tokens=20, temperature=0)
    (cache,) = lm._caches.free  # what the call needed, rounded up: 256 tokens, not 131,072
    cfg = lm.config
    assert cache.capacity == 256
    assert cache.kv[0].shape == (1, cfg.kv_heads, 256, cfg.head_dim)
    lm.generate_ids([[5] * 300], max_new_tokens=10, temperature=0)  # 310: a 512 cache
    assert sorted(c.capacity for c in lm._caches.free) == [256, 512]

    small = rt.load(out / "onnx-int8-gqa", threads=1, tune=False, max_context=1000)
    assert small.context == 1000
    assert small.new_cache(2).kv[0].shape == (2, cfg.kv_heads, 1000, cfg.head_dim)
    with pytest.raises(ConfigError, match="reads at most 999"):
        small.generate_ids([[5] * 1000], max_new_tokens=1)
    (r,) = small.generate_ids([[5] * 990], max_new_tokens=50, temperature=0)
    assert r.finish_reason == "context" and len(r.token_ids) == 10
    # steps() told nothing: its cache starts small and grows as the steps go
    from tinyt.contract import DECODER_WITH_PAST
    from tinyt.runtime.feeds import prefill_feeds

    plain = rt.load(out / "onnx-int8-gqa", threads=1, tune=False)
    ids = np.full((1, 250), 5, dtype=np.int64)
    steps = plain.steps(prefill_feeds(cfg, DECODER_WITH_PAST, ids))
    logits, one = next(steps), np.ones(1, bool)
    for _ in range(10):  # past the first cache's 256 tokens
        logits = steps.send((logits[:, -1].argmax(-1), one))
    steps.close()
    assert [c.capacity for c in plain._caches.free] == [512, 256]


@pytest.mark.parametrize("bad", [1, 0, True, 2.5, "8"])
def test_max_context_is_validated(lm_onnx, bad):
    with pytest.raises(ConfigError, match="max_context="):
        rt.load(lm_onnx, max_context=bad)


def test_max_context_of_a_contract_graph(lm_onnx):
    lm = rt.load(lm_onnx, threads=1, max_context=12)
    assert lm.context == 12
    (r,) = lm.generate_ids([[3, 4, 5, 6]], max_new_tokens=40, temperature=0)
    assert r.finish_reason == "context" and len(r.token_ids) == 8


def test_a_cache_that_cannot_fit_is_refused_before_it_is_allocated(lm_onnx, tmp_path,
                                                                   monkeypatch):
    import tinyt.hardware
    from tinyt.errors import MemoryLimitError
    from tinyt.export.optimize import optimize
    from tinyt.runtime.cache import kv_bytes
    from tinyt.runtime.engine import Engine

    gqa = optimize(optimize(lm_onnx, tmp_path / "opt"), tmp_path / "gqa", target="gqa")
    lm = rt.load(gqa, threads=1, tune=False)
    need = kv_bytes(lm.config, 8, lm.context)
    monkeypatch.setattr(tinyt.hardware, "available_memory", lambda meminfo=None: need - 1)
    allocated = []
    monkeypatch.setattr(np, "zeros", lambda *a, **k: allocated.append(a) or 1 / 0)
    with pytest.raises(MemoryLimitError) as e:
        Engine(lm, max_batch=8)
    monkeypatch.undo()
    line = str(e.value)
    assert "\n" not in line and not allocated
    assert f"KV buffers of 8 row(s) x {lm.context} tokens" in line
    assert "lower max_batch (--max-batch) or the context" in line and "available" in line


def test_the_cli_refuses_in_one_line_exit_2(lm_onnx, monkeypatch, capsys):
    """A KV cache over the machine's memory, and ONNX Runtime failing to allocate."""
    import tinyt.hardware
    from tinyt.app import cli

    monkeypatch.setattr(tinyt.hardware, "available_memory", lambda meminfo=None: 1024)
    monkeypatch.setattr(sys, "argv", ["tinyt", "generate", str(lm_onnx), "def ",
                                      "--max-new-tokens", "8"])
    with pytest.raises(SystemExit) as e:
        cli.run([])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("error: KV buffers of 1 row(s)") and "lower the prompts" in err

    monkeypatch.undo()

    def fail(*args, **kwargs):
        raise RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code "
                           "returned while running MatMul node. Name:'/m' Status Message: "
                           "Failed to allocate memory for requested buffer of size "
                           "824633720832\nstack trace ...")
    monkeypatch.setattr(rt, "load", fail)
    monkeypatch.setattr(sys, "argv", ["tinyt", "generate", str(lm_onnx), "def "])
    with pytest.raises(SystemExit) as e:
        cli.run([])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    assert "requested buffer of size 824633720832" in err and "lower" in err


def test_available_memory_reads_meminfo_and_a_containers_limit(tmp_path):
    from tinyt.hardware import available_memory, memory_refusal

    none = tmp_path / "no-cgroup"
    assert available_memory("MemTotal: 100 kB\nMemAvailable:    2048 kB\n", none) == 2 << 20
    assert available_memory("MemTotal: 100 kB\n", none) is None
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.max").write_text("3145728\n")  # a 3 MiB container, 2 MiB of it in use
    (v2 / "memory.current").write_text("2097152\n")
    assert available_memory("MemAvailable: 2048 kB\n", v2) == 1 << 20  # the smaller one
    (v2 / "memory.max").write_text("max\n")  # no limit
    assert available_memory("MemAvailable: 2048 kB\n", v2) == 2 << 20
    v1 = tmp_path / "v1" / "memory"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text(str(4 << 20))
    (v1 / "memory.usage_in_bytes").write_text(str(1 << 20))
    assert available_memory("", tmp_path / "v1") == 3 << 20
    here = available_memory()
    assert here is None or here > 0
    assert memory_refusal(1, "one byte", "nothing") is None


def test_import_hf_keeps_a_shorter_context_exactly(long_ckpt, tmp_path):
    from tinyt.checkpoint import load_checkpoint
    from tinyt.hf import import_hf

    hf = long_ckpt.parent / "hf"
    short = import_hf(hf, tmp_path / "short", context=4096)
    meta = json.loads((short / "config.json").read_text())
    assert meta["model"]["block_size"] == 4096
    assert (meta["metrics"]["context"], meta["metrics"]["model_context"]) == (4096, CONTEXT)
    whole, kept = load_checkpoint(long_ckpt).model, load_checkpoint(short).model
    ids = torch.randint(0, 320, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # rotary positions are computed: the same numbers, bit for bit
        assert torch.equal(whole(ids)[0], kept(ids)[0])


def test_import_hf_context_is_checked_by_name(long_ckpt, tmp_path, monkeypatch, capsys):
    from tinyt.app import cli

    hf = long_ckpt.parent / "hf"
    for bad in ("1", str(CONTEXT + 1)):
        monkeypatch.setattr(sys, "argv", ["tinyt", "import-hf", str(hf), str(tmp_path / bad),
                                          "--context", bad])
        with pytest.raises(SystemExit) as e:
            cli.run([])
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and len(err.splitlines()) == 1, err
        assert f"--context {bad}" in err and str(CONTEXT) in err
        assert not (tmp_path / bad).exists()
    from typer.testing import CliRunner

    text = CliRunner().invoke(cli.app, ["import-hf", "--help"]).output
    assert "--context" in text and "max_position_embeddings" in text


def test_import_hf_context_slices_a_learned_table(corpus_dir, tmp_path):
    import transformers as T

    from tinyt.checkpoint import load_checkpoint
    from tinyt.hf import import_hf
    from tinyt.tokenizer import Tokenizer

    tok = Tokenizer.train_bpe([p.read_text() for p in sorted(corpus_dir.iterdir())], 300)
    torch.manual_seed(0)
    gpt2 = T.GPT2LMHeadModel(T.GPT2Config(
        vocab_size=tok.vocab_size, n_positions=64, n_embd=32, n_layer=2, n_head=2,
        bos_token_id=tok.eos_id, eos_token_id=tok.eos_id)).eval()
    gpt2.save_pretrained(tmp_path / "hf", safe_serialization=True)
    tok.save(tmp_path / "hf" / "tokenizer.json")
    ck = import_hf(tmp_path / "hf", tmp_path / "ck", context=16)
    model = load_checkpoint(ck).model
    assert model.config.block_size == 16
    assert model.transformer.wpe.weight.shape[0] == 16  # its first 16 rows: positions 0..15
    ids = torch.randint(0, tok.vocab_size, (1, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert float((model(ids)[0] - gpt2(ids).logits).abs().max()) <= 1e-5


def test_check_sizes_are_bounded_whatever_the_context():
    from tinyt.config import ModelConfig
    from tinyt.export.compare import grid, grid_sizes
    from tinyt.export.verifier import _cases, sizes

    long = ModelConfig(block_size=CONTEXT, vocab_size=320, n_layer=1, n_head=4, n_embd=64,
                       pos_encoding="rotary")
    for kind in ("decoder_with_past", "decoder"):
        got = grid_sizes(long, grid(long, kind))
        assert got["longest_sequence"] == CHECK_TOKENS
        assert got["highest_position"] == (CONTEXT - 1 if kind == "decoder_with_past"
                                           else CHECK_TOKENS - 1)
        assert sizes(long, _cases(long, kind))["longest_sequence"] == CHECK_TOKENS
    # a learned table of 64 positions: its whole block, as before
    gpt2 = ModelConfig(block_size=64, vocab_size=320, n_layer=1, n_head=2, n_embd=32)
    assert (3, 64, 0, 5) in grid(gpt2, "decoder_with_past")
    assert (1, 1, 63, 0) in grid(gpt2, "decoder_with_past")
    assert sizes(gpt2, _cases(gpt2, "decoder_with_past"))["highest_position"] == 63


@pytest.mark.slow
@pytest.mark.parametrize("name, context", [("qwen2.5", 32_768), ("smollm2", 8_192)])
def test_real_contexts_export_and_verify_at_their_end(name, context, tmp_path):
    """Qwen2.5's and SmolLM2's contexts: export, then verify against PyTorch with sequences of
    CHECK_TOKENS and a past placed at the context's end."""
    from tinyt.export import export_onnx, verify
    from tinyt.hf import import_hf

    save_hf(name, tmp_path / "hf")
    ck = import_hf(tmp_path / "hf", tmp_path / "ck")
    report = verify(ck, export_onnx(ck, tmp_path / "onnx"), gen_tokens=8)
    assert report["passed"], report["failures"]
    assert report["sizes"]["longest_sequence"] == CHECK_TOKENS
    assert report["sizes"]["highest_position"] == context - 1
    end = [c for c in report["cases"] if c["first_position"]]
    assert end and all(c["first_position"] + c["past"] + c["sequence"] == context for c in end)
