"""Peers on the same weights: the Hugging Face GPT-2 conversion, CTranslate2 and ONNX Runtime
GenAI computing tinyt's tokens, held-out prompts, and the side-by-side peer benchmark."""
import json
import math
from pathlib import Path

import numpy as np
import onnxruntime_genai as og
import pytest
import torch
from conftest import assert_close

import tinyt.runtime as rt
from tinyt.benchmarks import peers
from tinyt.checkpoint import load_checkpoint
from tinyt.data import DataError, held_out_prompts
from tinyt.errors import ConversionError
from tinyt.export.genai_config import GENAI_CONFIG
from tinyt.export.optimize import optimize
from tinyt.export.package import package
from tinyt.export.quantize import quantize
from tinyt.hf import HF_LOGITS_ATOL, to_hf_gpt2
from tinyt.manifest import check_manifest

PROMPTS = ["def alpha", "import os\n", "    return ", "x"]


@pytest.fixture(scope="module")
def lm_opt(lm_onnx, tmp_path_factory):
    return optimize(lm_onnx, tmp_path_factory.mktemp("peers") / "opt")


@pytest.fixture(scope="module")
def lm_int8(lm_opt, corpus_dir, tmp_path_factory):
    return quantize(lm_opt, tmp_path_factory.mktemp("peers") / "int8", data=str(corpus_dir))


def genai_greedy(path, ids, n):
    config = og.Config(str(path))
    config.clear_providers()
    return peers.genai_greedy(og.Model(config), ids, n)


def test_every_decoder_stage_writes_a_genai_config(lm_onnx, lm_opt, lm_int8, tmp_path):
    for path in (lm_onnx, lm_opt, lm_int8):
        cfg = json.loads((path / GENAI_CONFIG).read_text())
        assert cfg["model"]["type"] == "llama"  # "gpt2" wants the old combined past_%d cache
        assert cfg["model"]["decoder"]["inputs"]["past_key_names"] == "past_key_values.%d.key"
        assert GENAI_CONFIG in check_manifest(path)["files"]  # hashed like every file
    edge = package(lm_int8, tmp_path / "edge", format="ort")
    assert json.loads((edge / GENAI_CONFIG).read_text())["model"]["decoder"]["filename"] \
        == "model.ort"
    pinned = package(lm_onnx, tmp_path / "pinned", format="onnx",
                     fixed=["batch_size=1", "sequence_length=1", "past_sequence_length=16"])
    assert not (pinned / GENAI_CONFIG).exists()  # GenAI grows the cache itself: not for pins


@pytest.mark.parametrize("which", ["fp32", "int8"])
def test_genai_runs_the_artifact_unchanged_with_tinyts_tokens(lm_onnx, lm_int8, which):
    path = lm_onnx if which == "fp32" else lm_int8
    lm = rt.load(path, threads=1)
    for prompt in PROMPTS:
        ids = lm.tokenizer.encode(prompt)
        n = lm.config.block_size - len(ids)
        want = lm.generate_ids([ids], max_new_tokens=n)[0]
        got = genai_greedy(path, ids, n)
        eos = lm.tokenizer.eos_id
        got = got[:got.index(eos)] if eos in got else got  # tinyt stops before eos
        assert got == want.token_ids, prompt


def test_hf_gpt2_has_tinyts_logits(tiny_ckpt, tmp_path):
    from transformers import GPT2LMHeadModel

    out = to_hf_gpt2(tiny_ckpt, tmp_path / "hf")
    hf = GPT2LMHeadModel.from_pretrained(out).eval()
    ck = load_checkpoint(tiny_ckpt)
    ids = torch.randint(0, ck.config.vocab_size, (3, ck.config.block_size),
                        generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert_close(hf(ids).logits, ck.model.eval()(ids)[0], HF_LOGITS_ATOL, "HF vs tinyt")
    assert hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr()  # still tied
    assert json.loads((out / "config.json").read_text())["activation_function"] == "gelu"


def test_hf_gpt2_refuses_a_classifier(tiny_clf, tmp_path):  # more in test_hf.py
    with pytest.raises(ConversionError, match="causal LMs"):
        to_hf_gpt2(tiny_clf, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_ctranslate2_float32_computes_tinyts_tokens(tiny_ckpt, lm_onnx, tmp_path):
    import ctranslate2
    from ctranslate2.converters import TransformersConverter

    hf = to_hf_gpt2(tiny_ckpt, tmp_path / "hf")
    TransformersConverter(str(hf)).convert(str(tmp_path / "ct2"), quantization="float32")
    gen = ctranslate2.Generator(str(tmp_path / "ct2"), intra_threads=1)
    vocab = json.loads((tmp_path / "ct2" / "vocabulary.json").read_text())
    lm = rt.load(lm_onnx, threads=1)
    for prompt in PROMPTS:
        ids = lm.tokenizer.encode(prompt)
        n = lm.config.block_size - len(ids)
        want = lm.generate_ids([ids], max_new_tokens=n, min_new_tokens=n)[0].token_ids
        got = gen.generate_batch([[vocab[i] for i in ids]], max_length=n, min_length=n,
                                 sampling_topk=1, include_prompt_in_result=False)
        assert got[0].sequences_ids[0] == want, prompt


def test_min_new_tokens_holds_back_the_end_token(lm_onnx):
    lm = rt.load(lm_onnx, threads=1)
    eos = lm.tokenizer.eos_id
    ids = lm.tokenizer.encode("    return alpha")
    free = lm.generate_ids([ids], max_new_tokens=20)[0]
    forced = lm.generate_ids([ids], max_new_tokens=20, min_new_tokens=20)[0]
    assert len(forced.token_ids) == 20 and eos not in forced.token_ids
    assert forced.token_ids[:len(free.token_ids)] == free.token_ids  # same until eos would be
    if free.finish_reason == "eos":
        assert len(free.token_ids) < 20
    with pytest.raises(ValueError, match="min_new_tokens"):
        lm.generate_ids([ids], max_new_tokens=4, min_new_tokens=5)


def test_held_out_prompts(lm_onnx, corpus_dir):
    from tinyt.data import load_corpus

    tok = rt.load(lm_onnx).tokenizer
    val = load_corpus(str(corpus_dir)).val
    a = held_out_prompts(tok, val, 5, 12)
    assert a == held_out_prompts(tok, val, 5, 12)  # deterministic
    assert len(a) == 5 and all(len(p) == 12 and tok.eos_id not in p for p in a)
    assert len({tuple(p) for p in a}) == 5
    with pytest.raises(DataError, match="windows of"):
        held_out_prompts(tok, val, 10_000, 12)


@pytest.mark.slow  # a whole run with worker processes: ~15 s
def test_peer_benchmark_proves_then_times(tiny_ckpt, lm_opt, lm_int8, tmp_path, monkeypatch):
    (tmp_path / "art").mkdir()  # the layout tinyt pipeline writes
    for name, src in (("checkpoint", tiny_ckpt), ("onnx-opt", lm_opt), ("onnx-int8", lm_int8)):
        (tmp_path / "art" / name).symlink_to(src)
    monkeypatch.chdir(tmp_path)
    art = Path("art")  # relative, as on the command line: the workers run elsewhere
    result = peers.run(art, tmp_path / "out", threads=[1], rounds=1, block=1,
                       agreement_prompts=2, agreement_tokens=8, long_context=32,
                       engines=["tinyt-fp32", "tinyt-int8", "genai-int8", "ct2-float32",
                                "torch-eager", "llama.cpp-q8_0"])
    agree = result["agreement"]
    for name in ("ct2-float32", "torch-eager", "tinyt-fp32"):  # fp32: the same tokens
        assert agree[name]["identical_to"] is True and agree[name]["agreement_with_fp32"] == 1
        # and the same distributions: float32 rounding only (logits ~1e-5 apart give a KL
        # of their square's order, ~1e-10; a different model, ~1)
        assert 0 <= agree[name]["kl_vs_fp32"] < 1e-6
    assert agree["tinyt-fp32"]["kl_vs_fp32"] == 0  # the reference against itself
    for name in ("tinyt-int8", "genai-int8"):  # INT8: near, not equal; GenAI on the same graph
        assert 0 < agree[name]["kl_vs_fp32"] < 0.05
    assert agree["genai-int8"]["kl_vs_fp32"] == pytest.approx(agree["tinyt-int8"]["kl_vs_fp32"],
                                                              rel=1e-3, abs=1e-7)
    assert agree["genai-int8"]["must_equal"] == "tinyt-int8"
    assert agree["genai-int8"]["identical_to"] is True  # the same graph, the same tokens
    assert result["mismatched"] == []
    rows = result["rows"]
    cpp = _llama_cpp_here()  # opt-in (scripts/setup-llama-cpp.sh): used when present
    assert set(rows) == {f"{e}@1t" for e in ("tinyt-fp32", "tinyt-int8", "genai-int8",
                                             "ct2-float32", "torch-eager")
                         + (("llama.cpp-q8_0",) if cpp else ())}
    for row in rows.values():
        assert row["generate_ms"] > 0 and row["first_token_ms"] > 0  # (one round: no order)
        # the context filled to 32 (the whole block): a 17-token prompt, then 15 new tokens
        # ... its steps timed inside each engine's own loop: a time, never a difference
        assert row["first_token_at_32_ms"] > 0 and row["decode_at_32_ms_per_token"] > 0
    assert result["method"]["long_context"] == 32
    assert result["targets"]["decode_at_32_ms_per_token@1t"]["ratio"] > 0
    for mem in result["memory"].values():  # every worker's resident memory, Linux /proc
        assert 0 < mem["loaded"]["rss"] <= mem["loaded"]["peak_rss"]  # the load's own peak
        assert mem["peak_reset"] is True  # then the peak restarts: the calls' own
        assert 0 < mem["rss"] <= mem["peak_rss"]
    assert set(result["memory"]) == set(rows)
    assert result["files"]["tinyt-int8"] == sum(f.stat().st_size for f in lm_int8.rglob("*")
                                                if f.is_file())
    if cpp:  # q8_0 of a trained model: most greedy tokens as fp32's
        assert agree["llama.cpp-q8_0"]["agreement_with_fp32"] > 0.5
    else:
        assert "setup-llama-cpp.sh" in result["skipped"]["llama.cpp-q8_0"]
    loop = result["outside_run"]["tinyt-int8@1t"]
    assert 0 < loop["inside_run_ms"] < loop["total_ms"]
    # the per-step decode is always a time; the short decode, a difference of two calls of
    # one round on a tiny model, may be lost in a busy machine's noise: then it names who
    for key in ("decode_at_32_ms_per_token", "decode_ms_per_token"):
        t = result["targets"][f"{key}@1t"]
        if "unmeasured" in t:
            assert key == "decode_ms_per_token" and t["met"] is None
            assert t["unmeasured"] == sorted(k for k, r in rows.items() if not r[key] > 0)
            continue
        assert t["ratio"] == pytest.approx(rows[f"{t['tinyt']}@1t"][key]
                                           / rows[f"{t['fastest_peer']}@1t"][key])
    floor, cfg, m = result["memory_floor"], result["model"], result["method"]
    C, L, V = cfg["n_embd"], cfg["n_layer"], cfg["vocab_size"]
    assert floor["int8_weight_bytes"] == L * (4 * C * C + 2 * C * 4 * C) + C * V  # each once
    past = m["decode_prompt"] + m["decode_new"] / 2  # the mean past of the timed steps
    assert floor["kv_cache_bytes"] == int(L * 2 * C * past * 4)  # fp32 keys and values
    assert list(floor["read_gb_per_s"]) == ["1"]  # the run's thread counts
    assert floor["decode_ms"]["1"] == pytest.approx(
        (floor["int8_weight_bytes"] + floor["kv_cache_bytes"])
        / (floor["read_gb_per_s"]["1"] * 1e9) * 1e3)
    for row in rows.values():
        assert row["decode_x_floor"] == pytest.approx(row["decode_ms_per_token"]
                                                      / floor["decode_ms"]["1"])
    md = (tmp_path / "out" / "peers.md").read_text()
    assert "| genai-int8 | 1 |" in md and "| load's peak MB | peak RSS over the calls MB |" in md
    assert "decode_at_32 = the same decode after a prompt of 17 tokens" in md
    assert (tmp_path / "out" / "peers.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="unknown engine"):
        peers.run(art, tmp_path / "out2", engines=["vllm"])
    with pytest.raises(ValueError, match="long_context=15: more than the decode's 15 new "
                                         "tokens, at most the model's context, 32"):
        peers.run(art, tmp_path / "out2", engines=["tinyt-int8"], long_context=15)
    with pytest.raises(ValueError, match="long_context=33: .* at most the model's context, 32"):
        peers.run(art, tmp_path / "out2", engines=["ct2-int8"], long_context=33)
    with pytest.raises(ValueError, match="block=0 must be an integer >= 1"):
        peers.run(art, tmp_path / "out2", engines=["tinyt-int8"], block=0)
    with pytest.raises(RuntimeError, match="no engine could start: genai-builder-int4: the "
                                           "GenAI model builder builds Llama-family models"):
        peers.run(art, tmp_path / "out3", engines=["genai-builder-int4"])


def test_a_worker_that_would_not_fit_in_memory_is_not_started(lm_int8, tmp_path, monkeypatch):
    """Every worker stays loaded through the rounds: each runs the longest call as it starts,
    and the next starts only where the machine has room for twice its files, the most a
    started worker grew over that call, and a reserve; otherwise it is skipped with the sizes
    (at the Llama-3.2-1B shape the kernel killed a worker halfway through a run instead)."""
    import tinyt.hardware as hw
    from tinyt.benchmarks.peers import measure

    (tmp_path / "art").mkdir()
    (tmp_path / "art" / "onnx-int8").symlink_to(lm_int8)
    files = sum(f.stat().st_size for f in lm_int8.rglob("*") if f.is_file())
    room = [2 * files + measure.MEMORY_RESERVE, files]  # enough for the first worker only
    monkeypatch.setattr(hw, "available_memory", lambda: room.pop(0) if len(room) > 1 else room[0])
    warm = {"ids": list(range(1, 20)), "n": 4}
    skipped: dict[str, str] = {}
    workers = measure._start(["tinyt-int8"], tmp_path / "art", [1, 2], skipped, warm=warm)
    try:
        assert [w.label for w in workers] == ["tinyt-int8@1t"]
        why = skipped["tinyt-int8@2t"]
        assert why.startswith("not started: ") and "with 1 worker(s) loaded" in why
        assert f"twice its files' {hw.gib(files)}" in why and "run fewer engines" in why
        mem = workers[0].ask(op="memory")["memory"]
        assert mem["peak_rss"] >= mem["rss"] > 0  # the warm-up call ran in the worker
    finally:
        for w in workers:
            w.close()
    room[0] = 0
    with pytest.raises(RuntimeError, match=r"no engine could start: tinyt-int8@1t: not started"):
        measure._start(["tinyt-int8"], tmp_path / "art", [1], {}, warm=warm)


def test_an_engine_that_fails_the_greedy_check_is_skipped_with_its_error():
    """Optimum's ORTModelForCausalLM sizes Qwen3's cache by width / heads (64, not head_dim
    128) and fails its first step: that is Optimum's result, not the run's end."""
    from tinyt.benchmarks.peers.measure import _greedy
    from tinyt.errors import BenchError

    class Fake:
        def __init__(self, name, threads, fails=False):
            self.name, self.threads, self.fails, self.closed = name, threads, fails, False

        def ask(self, **req):
            if self.fails:
                raise BenchError(f"{self.name}@{self.threads}t: InvalidArgument: Got invalid\n"
                                 "dimensions for input: past_key_values.9.value")
            return {"tokens": [[1] * req["n"] for _ in req["prompts"]]}

        def close(self):
            self.closed = True
    workers = [Fake("tinyt-fp32", 1), Fake("optimum-fp32", 1, fails=True),
               Fake("tinyt-fp32", 2), Fake("optimum-fp32", 2)]
    gone = workers[1::2]
    skipped: dict[str, str] = {}
    tokens = _greedy(workers, 1, {"agree_prompts": [[5, 6]], "agree_new": 3}, skipped)
    assert tokens == {"tinyt-fp32": [[1, 1, 1]]}
    assert skipped == {"optimum-fp32": "failed the greedy check: optimum-fp32@1t: "
                                       "InvalidArgument: Got invalid dimensions for input: "
                                       "past_key_values.9.value"}
    assert [w.name for w in workers] == ["tinyt-fp32", "tinyt-fp32"]  # both thread counts
    assert all(w.closed for w in gone)


def test_a_peers_quantizations_of_a_refused_model_are_not_timed():
    """GenAI's builder put Qwen3's test shape's logits after layer 0 (formats.py): its fp32
    build was refused and its int8 / int4 builds, the same wrong model quantized, were timed and
    ranked beside tinyt's. Now a tool's quantized engines go with its refused fp32 engine: not
    timed, named in the report with it; another tool's are timed."""
    from tinyt.benchmarks.peers import analysis, report
    from tinyt.benchmarks.peers.measure import _time

    agreement = {e: {} for e in ("tinyt-fp32", "genai-builder-fp32", "genai-builder-int8",
                                 "genai-builder-int4", "ct2-int8", "tinyt-int8")}
    refused = analysis.refused_with(agreement, ["genai-builder-fp32"])
    assert refused == {"genai-builder-int8": "genai-builder-fp32",
                       "genai-builder-int4": "genai-builder-fp32"}
    assert analysis.refused_with(agreement, []) == {}
    assert analysis.refused_with(agreement, ["ct2-float32"]) == {"ct2-int8": "ct2-float32"}

    class Fake:
        def __init__(self, name):
            self.name, self.label, self.threads = name, f"{name}@1t", 1

        def ask(self, **req):
            return {"times": [[0.01] for _ in req["calls"]]}
    workers = [Fake(e) for e in agreement]
    raw, _ = _time(workers, ["genai-builder-fp32", *refused], [{"ids": [1], "n": 1}], 1, 0, 1,
                   1 << 20, [1])
    assert set(raw) == {"tinyt-fp32@1t", "ct2-int8@1t", "tinyt-int8@1t"}
    md = report._choices({"skipped": {}, "mismatched": ["genai-builder-fp32"],
                          "refused_with": refused})
    assert "Not timed either (their tool's quantizations of the refused model" in "\n".join(md)
    assert "genai-builder-int8 (of genai-builder-fp32), genai-builder-int4 (of " in md[-1]


def test_a_conversion_made_under_another_shim_is_made_again(tmp_path, monkeypatch):
    """A peer's conversion is kept while the checkpoint and the shim its tool runs under
    (formats._BUILDER) are unchanged: the builder's LM head fix had to remake the conversions
    made before it, which a stamp of the checkpoint alone kept."""
    import importlib
    from dataclasses import replace

    from tinyt.benchmarks.peers import formats
    from tinyt.fsutil import sha256_file

    prepare = importlib.import_module("tinyt.benchmarks.peers.prepare")  # (the module)

    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "model.safetensors").write_bytes(b"weights")
    sha = sha256_file(tmp_path / "checkpoint" / "model.safetensors")
    (tmp_path / "peers" / "hf").mkdir(parents=True)
    (tmp_path / "peers" / "hf" / formats.STAMP).write_text(sha)  # peers/hf is fresh
    made = []

    def builder(hf, out, option):  # stands in for GenAI's builder under the shim
        out.mkdir(parents=True)
        made.append(option)
    monkeypatch.setattr(formats, "genai_builder", builder)
    monkeypatch.setitem(prepare.ENGINES, "genai-builder-fp32",
                        replace(prepare.ENGINES["genai-builder-fp32"], convert=builder))
    out = tmp_path / "peers" / "genai-builder-fp32"
    out.mkdir()
    (out / formats.STAMP).write_text(sha)  # made before the shim was part of the stamp
    prepare._convert(tmp_path, ["genai-builder-fp32"], {})
    assert made == ["fp32"] and formats.stamp(out) == sha + formats.recipe(builder)
    assert formats.recipe(builder).startswith(" shim ") and formats.recipe(formats.optimum) == ""
    prepare._convert(tmp_path, ["genai-builder-fp32"], {})
    assert made == ["fp32"]  # the same checkpoint and shim: kept
    monkeypatch.setattr(formats, "_BUILDER", formats._BUILDER + "# changed\n")
    prepare._convert(tmp_path, ["genai-builder-fp32"], {})
    assert made == ["fp32", "fp32"]


def test_a_worker_killed_while_timed_is_that_engine_s_result(monkeypatch):
    """GenAI's builder int8 at Phi-4-mini's shape grew past the machine at an 8,192-token
    context and the kernel killed it in the middle of the rounds: recorded with its signal,
    its times dropped, the other engines timed to the end; a live worker's error still ends
    the run."""
    from tinyt.benchmarks.peers import analysis, measure
    from tinyt.errors import BenchError

    monkeypatch.setattr(measure, "REST_S", 0)
    monkeypatch.setattr(analysis, "read_bandwidth", lambda nbytes, n: 1e9)

    class Proc:
        def __init__(self):
            self.returncode = None

        def poll(self):
            return self.returncode

    class Fake:
        def __init__(self, name, dies_at=None, alive_error=False):
            self.name, self.threads, self.label = name, 2, f"{name}@2t"
            self.proc, self.calls, self.dies_at = Proc(), 0, dies_at
            self.alive_error = alive_error

        def ask(self, **req):
            self.calls += 1
            if self.alive_error:
                raise BenchError(f"{self.label}: a bad request")
            if self.calls == self.dies_at:
                self.proc.returncode = -9
                raise BenchError(f"{self.label}: worker exited with status -9")
            return {"times": [[0.5] for _ in req["calls"]]}
    workers = [Fake("tinyt-int8-gqa"), Fake("genai-builder-int8", dies_at=2)]
    skipped: dict[str, str] = {}
    raw, _ = measure._time(workers, [], [{}, {}], 3, 0, 1, 1, [2], skipped)
    assert list(raw) == ["tinyt-int8-gqa@2t"] and raw["tinyt-int8-gqa@2t"][0] == [0.5] * 3
    assert [w.name for w in workers] == ["tinyt-int8-gqa"]
    assert skipped == {"genai-builder-int8@2t": "died while timed in round 2: genai-builder-"
                       "int8@2t: worker exited with status -9 (SIGKILL: most likely the "
                       "out-of-memory killer)"}
    with pytest.raises(BenchError, match="a bad request"):
        measure._time([Fake("ct2-int8", alive_error=True)], [], [{}], 1, 0, 1, 1, [2], {})


def test_the_decode_floor_counts_the_query_width():
    """Qwen3's head_dim makes q and the output projection C x (heads x head_dim), not C x C."""
    from tinyt.config import ModelConfig

    cfg = ModelConfig(vocab_size=512, n_embd=64, n_head=4, n_kv_head=2, head_size=32,
                      n_inner=96, n_layer=3, block_size=64, pos_encoding="rotary",
                      norm="rmsnorm", activation="swiglu", bias=False, qk_norm=True)
    C, qw, kv, inner = 64, 4 * 32, 2 * 32, 96
    assert peers.step_bytes(cfg) == 3 * (2 * C * qw + 2 * C * kv + 3 * C * inner) + C * 512


def test_the_read_bandwidth_reads_every_byte_in_each_threads_part(monkeypatch):
    """The floor of a 2-thread engine is the rate at which two cores read: the buffer is cut
    into one contiguous part a thread, the parts summed at once, and together they are the
    whole buffer (so the rate is bytes over the slowest thread's time)."""
    seen: list[tuple[int, int]] = []
    real_sum = np.sum

    def recording_sum(part):
        seen.append((part.ctypes.data, part.nbytes))
        return real_sum(part)

    monkeypatch.setattr(np, "sum", recording_sum)
    rate = peers.read_bandwidth(1 << 20, threads=3, repeats=2)
    assert math.isfinite(rate) and rate > 0
    first = sorted(seen[:3])  # one repeat's parts: adjacent, covering 1 MiB once
    assert sum(n for _, n in first) == 1 << 20
    assert all(a + n == b for (a, n), (b, _) in zip(first, first[1:]))
    assert len(seen) == 6

def _llama_cpp_here() -> bool:
    import importlib.util

    return importlib.util.find_spec("llama_cpp") is not None and \
        peers.llama_cpp_converter() is not None


def test_every_engine_is_a_row_naming_its_model():
    """The engine table: tinyt's engines each run their own row of the artifact catalogue,
    each peer's converted model lives under peers/, and what an engine must equal is an
    engine."""
    from tinyt.artifacts import BY_DIR

    ours = peers.TINYT_ROWS
    assert set(peers.TINYT) == set(ours) and len(set(ours.values())) == len(ours)
    for e in peers.ENGINES.values():
        assert e.same_as is None or e.same_as in peers.ENGINES, e.name
        if e.quantizes is not None:  # its own tool's fp32 engine, whose model it quantizes
            fp32 = peers.ENGINES[e.quantizes]
            assert fp32.exact and fp32.convert is e.convert and not e.exact, e.name
        if e.ours:
            assert e.artifact == ours[e.name] and e.artifact in BY_DIR
        elif e.convert is not None:
            assert e.artifact == f"peers/{e.name}"
    assert set(peers.PIPELINE_ENGINES) <= set(peers.ENGINES)
    assert peers.ENGINES[peers.REFERENCE].exact and peers.REFERENCE in peers.TINYT
    with pytest.raises(ValueError, match="unknown engine 'vllm'; known: tinyt-int8, "):
        peers.engine("vllm")


def test_hf_shape_zeroes_the_padding_rows(tmp_path, monkeypatch):
    """The random-weight directories' padding rows (ids the tokenizer never makes) are zero, so
    a peer's argmax over the whole table chooses among the tokenizer's ids, as tinyt does; the
    tokenizer still covers the whole table (as the real models' do), its padding entries
    unreachable from text."""
    from safetensors.numpy import load_file

    from tinyt.benchmarks import hf_shape
    from tinyt.tokenizer import Tokenizer

    monkeypatch.setitem(hf_shape.SHAPES, "padded", ("Qwen3Config", "Qwen3ForCausalLM", {
        **hf_shape.SHAPES["qwen3-test"][2], "vocab_size": 640}))
    monkeypatch.setattr(hf_shape, "TOKENIZER_VOCAB", 512)
    out = hf_shape.save("padded", tmp_path / "hf")
    tok = Tokenizer.from_file(out / "tokenizer.json")
    assert tok.vocab_size == 640 and tok.decode([600]) == "<unused_600>"
    text = "".join(tok.decode([i]) for i in range(512, 640)) + " def f(x): return x"
    assert max(tok.encode(text)) < 512
    table = load_file(out / "model.safetensors")["model.embed_tokens.weight"]  # tied: one
    assert table.shape == (640, 64)
    assert (table[512:] == 0).all() and (table[:512] != 0).any(axis=1).all()


def test_a_decode_lost_in_the_noise_is_no_target():
    """decode = a difference of two times; one <= 0 (the long prompt's noise was larger) is
    reported as unmeasured, never as the fastest peer or a met target."""
    rows = {"tinyt-int8-gqa@2t": {"decode_ms_per_token": 80.0},
            "genai-builder-int4@2t": {"decode_ms_per_token": -3.7},
            "ct2-int8@2t": {"decode_ms_per_token": 200.0}}
    result = {"rows": rows, "outside_run": {},
              "method": {"threads": [2], "prefill_tokens": []}}
    assert peers.targets(result) == {"decode_ms_per_token@2t": {
        "unmeasured": ["genai-builder-int4@2t"], "met": None}}
    rows["genai-builder-int4@2t"]["decode_ms_per_token"] = 100.0
    assert peers.targets(result)["decode_ms_per_token@2t"]["ratio"] == pytest.approx(0.8)


def test_a_long_context_decode_is_timed_per_step_inside_the_loop(lm_int8, monkeypatch):
    """decode_at_N is the steps' own time: token times from inside the engine's loop, the
    first token (the long prompt's pass) excluded."""
    from tinyt.benchmarks.peers import adapters
    from tinyt.benchmarks.peers.worker import per_step
    from tinyt.errors import BenchError

    assert per_step([5.0, 5.5, 6.0, 6.5], 4) == pytest.approx(0.5)  # 3 steps after the first
    with pytest.raises(BenchError, match="n >= 2 tokens and their n times; got n=4, 3 times"):
        per_step([1.0, 2.0, 3.0], 4)
    lm = rt.load(lm_int8, threads=1)
    gen = adapters.tinyt(lm_int8, lm_int8.parent, 1)
    runs = []
    real_run = type(lm.session).run
    monkeypatch.setattr(type(lm.session), "run",
                        lambda self, *a, **k: runs.append(1) or real_run(self, *a, **k))
    times = gen.stepped([5, 6, 7], 6)
    assert len(times) == 6 and all(0 < a < b for a, b in zip(times, times[1:]))
    assert len(runs) == 6  # the prompt's pass, then 5 steps: the last token is never fed


_ORPHAN = """
import concurrent.futures as cf, multiprocessing as mp, os, sys, time
from benchmarks.peers.prepare import exit_with_parent
if __name__ == "__main__":
    with cf.ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"), initializer=exit_with_parent,
                                initargs=(os.getpid(),)) as child:
        print(child.submit(os.getpid).result(), flush=True)
        time.sleep(600)  # killed here, as a run killed during its conversions
"""


def test_a_killed_run_does_not_leave_its_conversion_child(tmp_path):
    """prepare's child process (the conversions) ends when the benchmark that spawned it is
    killed, instead of running on through the next run."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    script = tmp_path / "run.py"
    script.write_text(_ORPHAN)
    root = Path(__file__).resolve().parents[2]
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    try:
        child = int(parent.stdout.readline())
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
        for _ in range(600):  # the child polls twice a second; give it up to 60 s
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            os.kill(child, signal.SIGKILL)
            raise AssertionError(f"the child {child} outlived its killed parent by 60 s")
    finally:
        parent.kill()


def test_the_builders_precisions_of_one_model_are_built_in_one_process(tmp_path, monkeypatch):
    """prepare hands GenAI's builder every precision it must make of one model in one call of
    its venv's interpreter (its imports once); each build's failure is that engine's alone."""
    import importlib
    import subprocess

    from tinyt.benchmarks.peers import formats
    from tinyt.fsutil import sha256_file

    prepare = importlib.import_module("tinyt.benchmarks.peers.prepare")
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "peers" / "hf").mkdir(parents=True)
    (tmp_path / "peers" / "hf" / formats.STAMP).write_text(
        sha256_file(tmp_path / "checkpoint" / "model.safetensors"))
    calls = []

    def run(argv, **kwargs):  # the builder's venv: int8's build fails, the others are made
        builds = json.loads(argv[-1])
        calls.append([b[b.index("-p") + 1] for b in builds])
        for b in builds:
            Path(b[b.index("-o") + 1]).mkdir(parents=True)
        out = "".join("tinyt-build " + json.dumps(
            "ValueError: no int8 here" if b[b.index("-p") + 1] == "int8" else None) + "\n"
            for b in builds)
        return subprocess.CompletedProcess(argv, 0, "builder chatter\n" + out, "")
    monkeypatch.setattr(formats.subprocess, "run", run)
    monkeypatch.setattr(formats, "builder_python", lambda: Path("python"))
    skipped = {}
    names = ["genai-builder-int4", "genai-builder-int8", "genai-builder-fp32"]
    prepare._convert(tmp_path, names, skipped)
    assert calls == [["int4", "int8", "fp32"]]  # one process
    assert skipped == {"genai-builder-int8": "conversion failed: GenAI's builder: ValueError: "
                                             "no int8 here"}
    assert formats.stamp(tmp_path / "peers" / "genai-builder-int4") is not None
    assert formats.stamp(tmp_path / "peers" / "genai-builder-int8") is None
    prepare._convert(tmp_path, names, {})  # the two made are kept: int8 alone again
    assert calls[-1] == ["int8"]
