"""The real SmolLM2-135M-Instruct (scripts/setup-real.sh: its Q4_1 GGUF through transformers'
GGUF loader) through import-hf and the main job, `tinyt pipeline --skip-train`, as a user runs
them (issue 48).

Bounds:
- tinyt's PyTorch model against transformers' (eager attention): the same fp32 arithmetic in
  other orders, held to compare.reorder_bound (30 layers, widest sum 1,536, logits up to ~40:
  ~0.04; measured 1.1e-4).
- Every INT8 artifact the pipeline keeps: perplexity at most +0.5% over fp32 on held-out text
  (issue 48's target, tinyt.artifacts.INT8_PERPLEXITY_BUDGET), in its own report and
  recomputed here through tinyt.runtime on prose no tinyt corpus holds (Python's pydoc
  topics). A real-model figure, not tuned: CTranslate2's int8 costs +15.5% on these weights.
- The web package of the pair against tinyt.runtime: greedy tokens equal, or where a row first
  differs a tie of the runtime's own logits at the graph's precision (export/web's
  greedy_ties: WebAssembly's kernels and the native ones round in other orders); the package
  stage checks two prompts' ids under Node, the page in Chromium a text here. Measured: the
  stage's check equal, no ties, on this AVX2 machine.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tinyt.artifacts import INT8_PERPLEXITY_BUDGET, made_by

pytestmark = [pytest.mark.real, pytest.mark.slow]

TEXT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"


def test_import_matches_transformers(smollm2_dir, tmp_path):
    """Tokenizer ids, and every position's logits of tinyt's PyTorch model against
    transformers' on the same directory."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tinyt.benchmarks.real_quality import heldout_text as held_out_prose
    from tinyt.checkpoint import load_checkpoint
    from tinyt.export.compare import reorder_bound
    from tinyt.hf import import_hf

    ck = load_checkpoint(import_hf(smollm2_dir, tmp_path / "ck", log=lambda s: None))
    text = TEXT + held_out_prose()[:1500]
    theirs = AutoTokenizer.from_pretrained(smollm2_dir)
    want_ids = theirs.encode(text)  # with the special tokens the tokenizer adds (its BOS)
    assert ck.tokenizer.encode_prompt(text) == want_ids
    assert ck.tokenizer.encode(text) == theirs.encode(text, add_special_tokens=False)
    cfg = ck.config
    assert (cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_kv_head, cfg.block_size,
            cfg.vocab_size, cfg.tie_weights) == (30, 576, 9, 3, 8192, 49152, True)
    ref = AutoModelForCausalLM.from_pretrained(smollm2_dir, torch_dtype=torch.float32,
                                               attn_implementation="eager").eval()
    ids = torch.tensor([want_ids[:256]])
    with torch.no_grad():
        want = ref(ids).logits[0].numpy()
        got = ck.model.eval()(ids)[0][0].numpy()
    assert got.shape == want.shape and got.dtype == want.dtype
    bound = reorder_bound(cfg, float(np.abs(want).max()))
    assert float(np.abs(got - want).max()) <= bound, (float(np.abs(got - want).max()), bound)
    assert (got.argmax(-1) == want.argmax(-1)).all()


# The main job on real SmolLM2 took 26.6 min on 2 shared cores (AMD EPYC, AVX2 only; 26 min of
# CPU time: six quantize / shared-cache stages with their reports at 135 M parameters),
# beyond what CI's 90 minutes leave beside the rest of the suite (~60 min with its setup on
# this CPU). CI (CI=true) runs the import test above and the MiniLM main job; these run
# wherever CI is not set (README's test command on a developer's machine), or with
# TINYT_REAL_MAIN_JOB=1.
IN_CI = os.environ.get("CI") == "true" and os.environ.get("TINYT_REAL_MAIN_JOB") != "1"


@pytest.fixture(scope="module")
def smol_run(smollm2_dir, tmp_path_factory, main_job):
    """(the work folder, the main job's CompletedProcess) on the real SmolLM2."""
    if IN_CI:
        pytest.skip("the main job on real SmolLM2 (~27 min on 2 cores) does not fit CI's 90 "
                    "minutes beside the suite: TINYT_REAL_MAIN_JOB=1 runs it (docs/testing.md)")
    work = tmp_path_factory.mktemp("smollm2")
    return work, main_job(smollm2_dir, work)


def _perplexity(path, windows) -> float:
    import tinyt.runtime as rt

    lm = rt.load(path, threads=2, tune=False)
    nll = count = 0
    for w in windows:
        lp = lm.prompt_logprobs(w)[1:]
        nll -= sum(p.logprob for p in lp)
        count += len(lp)
    return float(np.exp(nll / count))


def test_pipeline_takes_real_smollm2(smol_run):
    work, run = smol_run
    assert run.returncode == 0, run.stderr[-3000:]
    out = work / "out"
    for name in ("onnx", "onnx-opt"):
        assert json.loads((out / f"{name}-verify.json").read_text())["passed"], name
    kept = [v for v in made_by("pipeline") if (out / v.dir / "manifest.json").is_file()]
    assert {"onnx-int8", "onnx-int8-gqa"} <= {v.dir for v in kept}
    for v in kept:
        m = json.loads((out / v.dir / "manifest.json").read_text())
        if "accuracy" not in m:
            continue
        a = m["accuracy"]
        assert a["perplexity_change"] <= INT8_PERPLEXITY_BUDGET, (v.dir, a)
        if v.kind == "decoder_gqa":  # the pair's report is its own, not its sources'
            assert a["measured_on"].startswith("this artifact"), (v.dir, a)
    report = (out / "report.md").read_text()
    assert "FAILED" not in report and "onnx-int8-static: not built" in report


def test_int8_holds_on_held_out_prose(smol_run):
    """Perplexity of the kept INT8 artifacts recomputed through tinyt.runtime on text no tinyt
    corpus holds: within the budget of the fp32 graph's."""
    import tinyt.runtime as rt
    from tinyt.benchmarks.real_quality import heldout_text as held_out_prose

    out = smol_run[0] / "out"
    tok = rt.load(out / "onnx-opt", threads=2, tune=False).tokenizer
    ids = tok.encode(held_out_prose())
    windows = [ids[i * 500: i * 500 + 512] for i in range(4)]
    fp32 = _perplexity(out / "onnx-opt", windows)
    assert 5 < fp32 < 60, fp32  # a real model on English prose (random weights: ~49,000)
    for name in ("onnx-int8", "onnx-int8-gqa"):
        change = _perplexity(out / name, windows) / fp32 - 1
        assert change <= INT8_PERPLEXITY_BUDGET, (name, change)


def test_generate_from_the_pair(smol_run):
    out = smol_run[0] / "out"
    done = subprocess.run([sys.executable, "-m", "tinyt", "generate", out / "onnx-int8-gqa",
                           "The capital of France is", "--max-new-tokens", "8"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Paris" in done.stdout, done.stdout


def test_serve_and_package_the_pair(smol_run, tmp_path):
    """`tinyt serve` answers a completion with the pair's own greedy tokens; `tinyt package
    --format ort` packages it and the package generates the same tokens."""
    from live_server import Server

    import tinyt.runtime as rt

    out = smol_run[0] / "out"
    want = rt.load(out / "onnx-int8-gqa", threads=1, tune=False).generate(
        "The capital of France is", max_new_tokens=6)
    s = Server(out / "onnx-int8-gqa")
    try:
        model = json.loads(s.get("/v1/models")[1])["data"][0]["id"]
        status, text, _ = s.post("/v1/completions", {"model": model, "max_tokens": 6,
                                                     "prompt": "The capital of France is",
                                                     "temperature": 0})
        assert status == 200, text
        assert json.loads(text)["choices"][0]["text"] == want
    finally:
        assert s.stop() in (0, -15)
    done = subprocess.run([sys.executable, "-m", "tinyt", "package", out / "onnx-int8-gqa",
                           tmp_path / "ort", "--format", "ort"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    got = rt.load(tmp_path / "ort", threads=1, tune=False).generate(
        "The capital of France is", max_new_tokens=6)
    assert got == want


def test_web_package_of_the_pair(smol_run, tmp_path):
    """`tinyt package OUT/onnx-int8-gqa WEB --format web` takes the pair (on SmolLM2 its step
    graph alone: the pipeline keeps no qgemm prompt graph, beyond the perplexity budget) and
    records its own check under Node: token ids, and greedy tokens equal tinyt.runtime's (on
    prompt ids). Then the page in headless Chromium, given a text, generates what
    tinyt.runtime generates from that text. Measured on this loaded 2-core machine: the
    package 16-43 s (135M parameters, MatMulNBits int8), the page 6 s (load 1.8 s, 0.36 s a
    token on one WebAssembly thread)."""
    import tinyt.runtime as rt
    from tinyt.contract import SHARED_CACHE_KIND
    from tinyt.export.web import greedy_ties

    from .web_page import page_result

    pair, web = smol_run[0] / "out" / "onnx-int8-gqa", tmp_path / "web"
    done = subprocess.run([sys.executable, "-m", "tinyt", "package", pair, web, "--format",
                           "web"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "tokenizer ids and greedy tokens equal tinyt's" in done.stdout, done.stdout
    m = json.loads((web / "manifest.json").read_text())
    assert (m["package_format"], m["graph"]) == ("web", SHARED_CACHE_KIND), m["graph"]
    checked = m["web"]["checked"]
    assert checked["runtime"].startswith("node ") and checked["greedy_equal"], checked
    assert (checked["prompts"], checked["greedy_tokens"]) == (2, 8), checked
    assert checked["greedy_ties"] <= checked["prompts"], checked  # rows ending at a tie
    # onnxruntime-web's GroupQueryAttention predates query_seqlens: dropped from the step graph
    assert "model.onnx" in m["web"]["gqa_query_seqlens_dropped"], m["web"]
    # A user's text, as `tinyt generate` and `tinyt serve` take it: tokenizer.json's
    # post-processor adds SmolLM2's BOS (<|im_start|>, as transformers' tokenizer(text) does)
    text = "The capital of France is"
    lm = rt.load(pair, threads=1, tune=False)
    want = lm.generate_details([text], max_new_tokens=6)[0]
    prompt = lm.tokenizer.encode_prompt(text)
    got = page_result(web, {"prompt": text, "max_new_tokens": 6, "threads": 1})
    assert got["prompt_tokens"] == len(prompt), (
        "the page encodes a text prompt otherwise than tinyt.runtime (tokenizer.json's "
        "post-processor adds SmolLM2's BOS)", got, prompt)
    greedy_ties(lm, [prompt], [got["token_ids"]], [want.token_ids])  # raises on a difference
