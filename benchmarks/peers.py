"""tinyt against the engines a user would pick instead, on the same weights.

    ARTIFACTS/checkpoint ──tinyt.hfgpt2──▶ peers/hf (GPT-2, logits checked) ──CTranslate2──▶
        peers/ct2-int8, peers/ct2-float32
    one worker process per (engine, threads), each loading its model once and answering JSON
    lines on stdin:
      1. same computation first: greedy tokens of every engine on held-out prompts, compared
         with tinyt fp32's (fp32 engines must match exactly; INT8 ones report agreement)
      2. then time: rounds interleaved across the workers; in a round each worker runs, for
         every call, `settle` untimed calls and `block` timed ones, then rests (so no engine
         runs while another's worker threads still spin)
    decode ms/token = (t(prompt, N new) - t(prompt, 1 new)) / (N - 1)
    prefill ms      = t(L-token prompt, 1 new token), for L = 128 (or block_size - 1) and
                      block_size - 1
    ──▶ peers.json (environment, every raw time), peers.md, peers.png; ratios of tinyt to the
        fastest peer, the targets tinyt aims at

    .venv/bin/python -m benchmarks.peers artifacts --out benchmarks/results/peers-demo
    tinyt bench artifacts --peers --out benchmarks/results/peers-demo

Every engine is greedy with the end-of-text token suppressed, so each produces exactly the
tokens asked for. An engine whose package is absent is skipped with the reason.
"""
from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

# name: (what it runs, the package it needs, how it gets there)
ENGINES = {
    "tinyt-int8": ("tinyt.runtime generate on ARTIFACTS/onnx-int8", "onnxruntime", "extra cpu"),
    "tinyt-fp32": ("tinyt.runtime generate on ARTIFACTS/onnx-opt", "onnxruntime", "extra cpu"),
    "tinyt-int8-gqa": ("tinyt.runtime generate on ARTIFACTS/onnx-int8-gqa (shared KV cache; "
                       "prompts on the qgemm graph, steps on the MatMulNBits one)",
                       "onnxruntime", "extra cpu"),
    "genai-int8": ("ONNX Runtime GenAI on ARTIFACTS/onnx-int8, unchanged", "onnxruntime-genai",
                   "extra peers"),
    "ct2-int8": ("CTranslate2 int8 (converted from the GPT-2 directory)", "ctranslate2",
                 "extra peers"),
    "ct2-float32": ("CTranslate2 float32", "ctranslate2", "extra peers"),
    **{f"llama.cpp-{q}": (f"llama.cpp {q} (llama-cpp-python; GGUF from llama.cpp's own "
                          "convert_hf_to_gguf.py)", "llama-cpp-python",
                          "opt-in: bash scripts/setup-llama-cpp.sh, which compiles it (~20 min "
                          "here) once into a cache; kept out of the extras and CI")
       for q in ("q8_0", "q4_0")},
    "torch-eager": ("PyTorch eager, tinyt's model with its KV cache", "torch", "extra torch"),
    # The Llama family's peers and tinyt's INT4 (made here when asked; see prepare)
    "tinyt-int4": ("tinyt.runtime generate on ARTIFACTS/onnx-int4 (MatMulNBits 4-bit, block "
                   "32, made from onnx-opt)", "onnxruntime", "extra cpu"),
    "tinyt-int4-gqa": ("tinyt.runtime generate on ARTIFACTS/onnx-int4-gqa (shared KV cache; "
                       "prompts on the qgemm graph, steps on the 4-bit one)", "onnxruntime",
                       "extra cpu"),
    **{f"genai-builder-{p}": (f"ONNX Runtime GenAI on its own model builder's {p} artifact of "
                              "the same Hugging Face directory", "onnxruntime-genai",
                              "bash scripts/setup-genai-builder.sh")
       for p in ("int4", "int8", "fp32")},
    "optimum-fp32": ("Optimum's own ONNX export (text-generation-with-past) run by "
                     "ORTModelForCausalLM.generate", "optimum-onnx", "extra optimum"),
}
# The main job's peer run: the engines of the GPT-2-form demo (its time stays as it was)
PIPELINE_ENGINES = ("tinyt-int8", "tinyt-fp32", "tinyt-int8-gqa", "genai-int8", "ct2-int8",
                    "ct2-float32", "llama.cpp-q8_0", "torch-eager")
BUILDER_VENV = Path(".venv-genai-builder")  # scripts/setup-genai-builder.sh


def builder_python() -> Path | None:
    """The GenAI model builder's python: $TINYT_GENAI_BUILDER (a venv), else
    .venv-genai-builder here or beside the checkout this module runs from."""
    env = os.environ.get("TINYT_GENAI_BUILDER")
    for venv in ([Path(env)] if env else []) + [BUILDER_VENV,
                                                Path(__file__).resolve().parents[1] / BUILDER_VENV]:
        if (venv / "bin" / "python").is_file():
            return venv / "bin" / "python"
    return None
GGUF = "model.gguf"
EXTRA_BUFTS = "extra_bufts.txt"  # "on", or "off: why" (see _gguf)


def llama_cpp_model(path: Path, n_ctx: int, threads: int, extra_bufts: bool = True):
    """A llama_cpp.Llama on `path`; extra_bufts=False loads without llama.cpp's extra buffer
    types (AMX and repacked-weight layouts), its portable kernels only."""
    import llama_cpp
    import llama_cpp.llama as module

    defaults = llama_cpp.llama_model_default_params

    def params():
        p = defaults()
        p.use_extra_bufts = extra_bufts
        return p
    module.llama_cpp.llama_model_default_params = params  # Llama() reads its defaults here
    try:
        return llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx,
                               n_threads=threads, n_threads_batch=threads, verbose=False)
    finally:
        module.llama_cpp.llama_model_default_params = defaults


def llama_cpp_converter() -> Path | None:
    """llama.cpp's convert_hf_to_gguf.py as scripts/setup-llama-cpp.sh leaves it."""
    base = os.environ.get("TINYT_LLAMA_CPP_CONVERTER") or Path(
        os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tinyt/llama-cpp/converter"
    script = Path(base) / "convert_hf_to_gguf.py"
    return script if script.is_file() else None
INT4_BLOCK = 32  # the GenAI builder's default block for int4
REFERENCE = "tinyt-fp32"  # greedy agreement is measured against its tokens
EXACT = {"tinyt-fp32", "ct2-float32", "torch-eager", "optimum-fp32",
         "genai-builder-fp32"}  # fp32 engines: tokens must be identical
SAME_GRAPH = {"genai-int8": "tinyt-int8"}  # engines on tinyt's own INT8 graph
TINYT_DIRS = {"tinyt-int8-gqa": "onnx-int8-gqa", "tinyt-int8": "onnx-int8",
              "tinyt-fp32": "onnx-opt", "tinyt-int4": "onnx-int4",
              "tinyt-int4-gqa": "onnx-int4-gqa"}
TINYT = tuple(TINYT_DIRS)
TARGETS = {"decode_vs_fastest_peer_max": 0.8, "prefill_vs_fastest_peer_max": 1.0,
           "outside_run_us_per_token_max": 10.0}
REST_S = 0.05  # between two workers' blocks: idle worker threads stop spinning


# -- the worker side ---------------------------------------------------------------------------
def _engine(name: str, artifacts: Path, threads: int) -> Callable[[list[int], int], list[int]]:
    """A greedy generator: (prompt ids, n) -> exactly n new token ids."""
    if name in TINYT:
        import tinyt.runtime as rt

        lm = rt.load(artifacts / TINYT_DIRS[name], threads=threads)
        gen = lambda ids, n: lm.generate_ids(  # noqa: E731
            [ids], max_new_tokens=n, min_new_tokens=n)[0].token_ids
        gen.plan = None if lm.plan is None else lm.plan.describe()  # what load chose

        def tinyt_logits(ids):
            from tinyt.runtime.feeds import prefill_feeds

            steps = lm.steps(prefill_feeds(lm.config, "decoder_with_past", np.array([ids])))
            try:
                return next(steps)[0, -1].copy()
            finally:
                steps.close()
        gen.logits = tinyt_logits
        return gen
    if name == "genai-int8" or name.startswith("genai-builder-"):
        import onnxruntime_genai as og

        # GenAI on tinyt's own INT8 graph, or on its model builder's artifact
        config = og.Config(str(artifacts / ("onnx-int8" if name == "genai-int8"
                                            else f"peers/{name}")))
        config.clear_providers()
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {
            "intra_op_num_threads": threads, "inter_op_num_threads": 1}}}}))
        model = og.Model(config)
        return _with_logits(lambda ids, n: genai_greedy(model, ids, n, min_length=True),
                            lambda ids: genai_logits(model, ids))
    if name == "optimum-fp32":
        import torch
        from onnxruntime import SessionOptions
        from optimum.onnxruntime import ORTModelForCausalLM

        opts = SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
        torch.set_num_threads(threads)
        model = ORTModelForCausalLM.from_pretrained(artifacts / "peers" / name,
                                                    session_options=opts)

        def optimum(ids, n):
            out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n,
                                 do_sample=False)
            return out[0, len(ids):].tolist()
        return _with_logits(optimum, lambda ids: model(
            torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long))
            .logits[0, -1].detach().numpy())
    if name.startswith("ct2-"):
        import ctranslate2

        path = artifacts / "peers" / name
        gen = ctranslate2.Generator(str(path), device="cpu", intra_threads=threads,
                                    inter_threads=1)
        vocab = json.loads((path / "vocabulary.json").read_text())
        return _with_logits(lambda ids, n: gen.generate_batch(
            [[vocab[i] for i in ids]], max_length=n, min_length=n, sampling_topk=1,
            include_prompt_in_result=False)[0].sequences_ids[0],
            lambda ids: np.array(gen.forward_batch([ids]))[0, -1])
    if name.startswith("llama.cpp-"):
        from llama_cpp import LogitsProcessorList

        from tinyt.manifest import read_model_config

        cfg, _ = read_model_config(artifacts / "onnx-opt")
        extra = (artifacts / "peers" / name / EXTRA_BUFTS).read_text().startswith("on")
        llm = llama_cpp_model(artifacts / "peers" / name / GGUF, cfg.block_size, threads, extra)
        eos = llm.token_eos()

        def no_eos(_, scores):
            if eos >= 0:
                scores[eos] = -np.inf
            return scores

        def cpp(ids, n):
            llm.reset()  # no reuse of the previous call's cache for a common prefix
            out = []
            for tok in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                                    repeat_penalty=1.0, reset=True,
                                    logits_processor=LogitsProcessorList([no_eos])):
                out.append(int(tok))
                if len(out) == n:
                    return out
            return out

        def cpp_logits(ids):
            llm.reset()
            llm.eval(ids)  # the last token's logits (llama-cpp-python keeps no scores now)
            return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)).copy()
        cpp.plan = "llama.cpp extra buffer types (AMX, repacked weights): " + \
            (artifacts / "peers" / name / EXTRA_BUFTS).read_text()
        return _with_logits(cpp, cpp_logits)
    if name == "torch-eager":
        import torch

        from tinyt.checkpoint import load_checkpoint
        from tinyt.model import generate

        torch.set_num_threads(threads)
        model = load_checkpoint(artifacts / "checkpoint").model.eval()

        def eager(ids, n):
            out = generate(model, torch.tensor([ids]), n, temperature=0)  # no eos: n tokens
            return out[0, len(ids):].tolist()

        def eager_logits(ids):
            with torch.no_grad():
                return model(torch.tensor([ids]))[0][0, -1].numpy()
        return _with_logits(eager, eager_logits)
    raise ValueError(f"unknown engine {name!r}; known: {', '.join(ENGINES)}")


def _with_logits(gen, logits):
    """A generator that also answers the next-token logits after a prompt ([vocab])."""
    gen.logits = logits
    return gen


def genai_logits(model, ids: list[int]) -> np.ndarray:
    """onnxruntime_genai's logits of the token after `ids`."""
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + 1, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(np.asarray([ids], dtype=np.int32))
    out = np.asarray(gen.get_output("logits"), dtype=np.float32)  # [1, S or 1, V]
    return out.reshape(-1, out.shape[-1])[-1].copy()


def genai_greedy(model, ids: list[int], n: int, *, min_length: bool = False) -> list[int]:
    """Up to n greedy tokens from an onnxruntime_genai Model (exactly n with min_length:
    the end-of-text token held back)."""
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + n, do_sample=False,
                              **({"min_length": len(ids) + n} if min_length else {}))
    gen = og.Generator(model, params)
    gen.append_tokens(np.asarray([ids], dtype=np.int32))
    out = []
    while not gen.is_done():
        gen.generate_next_token()
        out.append(int(gen.get_next_tokens()[0]))
    return out


def _outside_run(artifacts: Path, sub: str, threads: int, ids: list[int], n: int) -> dict:
    """tinyt's per-token time outside ONNX Runtime's run calls (benchmarks/loop_cost.py),
    best of 5 generations."""
    import tinyt.runtime as rt

    from .loop_cost import outside_run

    return outside_run(rt.load(artifacts / sub, threads=threads), ids, n, generations=6)


def worker(name: str, artifacts: Path, threads: int) -> None:
    """Answer JSON requests on stdin, one per line, until stdin closes."""
    out = sys.stdout
    sys.stdout = sys.stderr  # libraries' chatter must not reach the protocol
    try:
        gen = _engine(name, artifacts, threads)
        out.write(json.dumps({"ready": True, "plan": getattr(gen, "plan", None)}) + "\n")
    except Exception as e:
        out.write(json.dumps({"error": f"{type(e).__name__}: {e}".splitlines()[0][:300]}) + "\n")
        out.flush()
        return
    out.flush()
    for line in sys.stdin:
        req = json.loads(line)
        try:
            if req["op"] == "greedy":
                reply = {"tokens": [gen(p, req["n"]) for p in req["prompts"]]}
            elif req["op"] == "time":
                times = []
                for call in req["calls"]:
                    for _ in range(req["settle"]):
                        gen(call["ids"], call["n"])
                    ts = []
                    for _ in range(req["block"]):
                        t = time.perf_counter()
                        gen(call["ids"], call["n"])
                        ts.append(time.perf_counter() - t)
                    times.append(ts)
                reply = {"times": times}
            elif req["op"] == "logprobs":  # next-token log-probabilities, to a .npy file
                rows = [np.asarray(gen.logits(p), dtype=np.float64) for p in req["prompts"]]
                z = np.stack(rows)[:, :req["vocab"]]  # an engine may pad its vocabulary
                z = z - z.max(-1, keepdims=True)
                np.save(req["path"], (z - np.log(np.exp(z).sum(-1, keepdims=True)))
                        .astype(np.float32))
                reply = {"saved": req["path"]}
            elif req["op"] == "outside_run":
                reply = _outside_run(artifacts, TINYT_DIRS[name], threads, req["ids"], req["n"])
            else:
                reply = {"error": f"unknown op {req['op']!r}"}
        except Exception as e:
            reply = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
        out.write(json.dumps(reply) + "\n")
        out.flush()


class Worker:
    """The parent's handle on one worker process."""

    def __init__(self, name: str, artifacts: Path, threads: int):
        self.name, self.threads, self.label = name, threads, f"{name}@{threads}t"
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tinyt.benchmarks.peers", str(artifacts.resolve()),
             "--worker", name, "--threads", str(threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True, env=env)
        hello = self._read()
        self.error, self.plan = hello.get("error"), hello.get("plan")

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            return {"error": f"worker exited with status {self.proc.wait()}"}
        return json.loads(line)

    def ask(self, **req) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        reply = self._read()
        if "error" in reply:
            raise RuntimeError(f"{self.label}: {reply['error']}")
        return reply

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


# -- the parent side -----------------------------------------------------------------------------
def prepare(artifacts: Path, engines: list[str]) -> dict[str, str]:
    """Convert the checkpoint for the peers that need it (kept under ARTIFACTS/peers while the
    checkpoint is unchanged). Returns the engines skipped, with the reason."""
    from tinyt.fsutil import sha256_file

    skipped = {}
    for name in engines:
        dist = ENGINES[name][1]
        try:
            md.version(dist)
        except md.PackageNotFoundError:
            skipped[name] = f"{dist} is not installed ({ENGINES[name][2]})"
    _prepare_int4(artifacts, [n for n in engines if n.startswith("tinyt-int4")
                              and n not in skipped], skipped)
    for name, sub in TINYT_DIRS.items():
        if name in engines and not (artifacts / sub / "manifest.json").is_file():
            skipped[name] = f"{artifacts / sub} is missing (`tinyt pipeline` makes it)"
    llama = bool(json.loads((artifacts / "onnx-opt" / "config.json").read_text())
                 .get("tinyt", {}).get("model", {}).get("norm") == "rmsnorm")
    for name in engines:
        if name.startswith("genai-builder-") and name not in skipped:
            if not llama:
                skipped[name] = "the GenAI model builder builds Llama-family models; this one " \
                                "is GPT-2's form"
            elif builder_python() is None:
                skipped[name] = f"no {BUILDER_VENV} (bash scripts/setup-genai-builder.sh)"
    for name in engines:
        if name.startswith("llama.cpp-") and name not in skipped and not llama_cpp_converter():
            skipped[name] = "llama.cpp's converter is not in the cache (bash " \
                            "scripts/setup-llama-cpp.sh)"
    need = [n for n in engines if n.startswith(("ct2-", "genai-builder-", "optimum-",
                                                "llama.cpp-")) and n not in skipped]
    if not need:
        return skipped
    from tinyt.hfgpt2 import to_hf

    stamp = sha256_file(artifacts / "checkpoint" / "model.safetensors")
    peers = artifacts / "peers"
    if _stamp(peers / "hf") != stamp:
        to_hf(artifacts / "checkpoint", peers / "hf")
        (peers / "hf" / "tinyt-source.sha256").write_text(stamp)
    for name in need:
        if _stamp(peers / name) == stamp:
            continue
        try:
            _convert_for(name, peers)
        except Exception as e:  # a peer's converter failing is that peer's result
            skipped[name] = f"conversion failed: {type(e).__name__}: {e}".splitlines()[0][:300]
            continue
        (peers / name / "tinyt-source.sha256").write_text(stamp)
    return skipped


def _convert_for(name: str, peers: Path) -> None:
    """The peer's own artifact of peers/hf, made by the peer's own tool."""
    import shutil

    shutil.rmtree(peers / name, ignore_errors=True)
    if name.startswith("ct2-"):
        from ctranslate2.converters import TransformersConverter

        TransformersConverter(str(peers / "hf")).convert(
            str(peers / name), quantization=name.removeprefix("ct2-"), force=True)
    elif name.startswith("genai-builder-"):
        subprocess.run([str(builder_python()), "-m",
                        "onnxruntime_genai.models.builder", "-i", str(peers / "hf"),
                        "-o", str(peers / name), "-p", name.removeprefix("genai-builder-"),
                        "-e", "cpu", "-c", str(peers / "builder-cache")],
                       check=True, capture_output=True, text=True)
    elif name.startswith("llama.cpp-"):
        _gguf(peers / "hf", peers / name / GGUF, name.removeprefix("llama.cpp-"))
    elif name == "optimum-fp32":
        from optimum.exporters.onnx import main_export

        main_export(str(peers / "hf"), output=str(peers / name),
                    task="text-generation-with-past", no_post_process=False)


# convert_hf_to_gguf.py names a BPE vocabulary's pre-tokenizer by hashing what it makes of a
# test text, and knows only the published models' hashes. tinyt's BPE is GPT-2's byte-level
# scheme (tinyt/tokenizer.py), so its pre-tokenizer is "gpt-2"; the benchmark feeds token ids.
_CONVERT = """import sys
conv = sys.argv.pop(1)
sys.path[:0] = [conv, conv + "/gguf-py"]
import convert_hf_to_gguf as c
from conversion import base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
c.main()
"""


_PROBE = """import sys
from tinyt.benchmarks.peers import llama_cpp_model
llama_cpp_model(sys.argv[1], 64, 1, True).eval([1, 2, 3])
"""


def _gguf(hf: Path, out: Path, quant: str) -> None:
    """peers/hf as GGUF: q8_0 straight from llama.cpp's converter; q4_0 through f32 and
    llama.cpp's own quantizer (llama_model_quantize, in the library the wheel ships)."""
    import ctypes

    out.parent.mkdir(parents=True)
    conv = llama_cpp_converter()
    first = out if quant == "q8_0" else out.with_suffix(".f32.gguf")
    subprocess.run([sys.executable, "-c", _CONVERT, str(conv.parent), str(hf), "--outfile",
                    str(first), "--outtype", "q8_0" if quant == "q8_0" else "f32"],
                   check=True, capture_output=True, text=True)
    if quant == "q4_0":
        import llama_cpp

        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
        if llama_cpp.llama_model_quantize(str(first).encode(), str(out).encode(),
                                          ctypes.byref(params)) != 0:
            raise RuntimeError(f"llama_model_quantize failed on {first}")
        first.unlink()
    # llama.cpp's extra buffer types (AMX tiles, repacked weights) are its fastest CPU kernels,
    # and on some shapes and CPUs they crash (a 128-wide model on a Xeon with AMX: SIGSEGV
    # in llama_decode). Probe one evaluation in a child process; without them if it dies.
    probe = subprocess.run([sys.executable, "-c", _PROBE, str(out)], capture_output=True,
                           text=True, timeout=300)
    (out.parent / EXTRA_BUFTS).write_text(
        "on" if probe.returncode == 0 else
        f"off: with llama.cpp's extra buffer types one evaluation exited {probe.returncode}")


def _prepare_int4(artifacts: Path, engines: list[str], skipped: dict[str, str]) -> None:
    """tinyt's INT4 artifacts (4-bit MatMulNBits from onnx-opt, and its shared-cache pair),
    made once and kept while their sources are unchanged."""
    if not engines:
        return
    from tinyt.export.optimize import optimize
    from tinyt.export.quantize import quantize
    from tinyt.manifest import fresh

    int4, pair = artifacts / "onnx-int4", artifacts / "onnx-int4-gqa"
    if not fresh(int4, artifacts / "onnx-opt"):
        quantize(artifacts / "onnx-opt", int4, bits=4, block_size=INT4_BLOCK)
    if "tinyt-int4-gqa" in engines and not fresh(pair, int4):
        if not (artifacts / "onnx-int8-qgemm" / "manifest.json").is_file():
            skipped["tinyt-int4-gqa"] = f"{artifacts / 'onnx-int8-qgemm'} is missing"
            return
        optimize(int4, pair, target="gqa", prefill_from=artifacts / "onnx-int8-qgemm")


def _stamp(path: Path) -> str | None:
    f = path / "tinyt-source.sha256"
    return f.read_text() if f.is_file() else None


def run(artifacts: Path, out: Path, *, threads: list[int] | None = None, rounds: int = 8,
        block: int = 3, settle: int = 1, engines: list[str] | None = None,
        agreement_prompts: int = 32, agreement_tokens: int = 64) -> dict[str, Any]:
    """Measure every engine side by side; write peers.json, peers.md and peers.png."""
    from tinyt.hardware import cpu_features, physical_cores
    from tinyt.manifest import read_model_config

    engines = list(engines or ENGINES)
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        raise ValueError(f"unknown engine(s) {unknown}; known: {', '.join(ENGINES)}")
    if not (isinstance(rounds, int) and rounds >= 0):
        raise ValueError(f"rounds={rounds!r} must be an integer >= 0 (0: agreement only)")
    for sub in ("checkpoint", "onnx-opt", "onnx-int8"):
        if not (artifacts / sub).is_dir():
            raise ValueError(f"{artifacts / sub} is missing: run `tinyt pipeline --out "
                             f"{artifacts}` first (peers need checkpoint/, onnx-opt/, onnx-int8/)")
    cfg, _ = read_model_config(artifacts / "onnx-int8")
    threads = threads or sorted({1, physical_cores()})
    skipped = prepare(artifacts, engines)
    plan = _inputs(artifacts, cfg, agreement_prompts, agreement_tokens)
    workers = _start(engines, artifacts, threads, skipped)
    try:
        # 1. the same computation: greedy tokens on held-out prompts
        tokens = {w.name: w.ask(op="greedy", prompts=plan["agree_prompts"],
                                n=plan["agree_new"])["tokens"]
                  for w in workers if w.threads == threads[0]}
        agreement = _agreement(tokens)
        for name, kl in _kl(workers, threads[0], plan["agree_prompts"], cfg.vocab_size).items():
            agreement.setdefault(name, {}).update(kl)
        bad = [e for e, a in agreement.items()
               if a.get("must_equal") and a["identical_to"] is False]
        # 2. time, rounds interleaved (and one core's read bandwidth between them)
        raw, bandwidth = _time(workers, bad, plan["calls"], rounds, settle, block,
                               floor_bytes(cfg, plan))
        loop = {w.label: w.ask(op="outside_run", ids=plan["calls"][1]["ids"],
                               n=plan["decode_new"])
                for w in (workers if rounds else []) if w.name in TINYT}  # 0: agreement only
    finally:
        for w in workers:
            w.close()
    rows = _rows(raw, plan, bandwidth, floor_bytes(cfg, plan))
    result = {
        "model": cfg.to_dict(), "artifacts": str(artifacts),
        "environment": {"cpu": cpu_features(), "physical_cores": physical_cores(),
                        "python": platform.python_version(), "platform": platform.platform(),
                        "versions": _versions(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
        "method": {"threads": threads, "rounds": rounds, "block": block, "settle": settle,
                   "decode_prompt": plan["decode_prompt"], "decode_new": plan["decode_new"],
                   "prefill_tokens": plan["prefills"],
                   "agreement_prompts": len(plan["agree_prompts"]),
                   "agreement_prompt_tokens": len(plan["agree_prompts"][0]),
                   "agreement_new_tokens": plan["agree_new"]},
        "memory_floor": None if bandwidth is None else {
            "int8_weight_bytes": step_bytes(cfg),
            "kv_cache_bytes": floor_bytes(cfg, plan) - step_bytes(cfg),
            "read_gb_per_s_one_core": bandwidth / 1e9,
            "decode_ms": floor_bytes(cfg, plan) / bandwidth * 1e3},
        "engines": {k: v[0] for k, v in ENGINES.items() if k in engines},
        "skipped": skipped, "mismatched": bad, "agreement": agreement, "rows": rows,
        "outside_run": loop, "raw_s": raw,
        "plans": {w.label: w.plan for w in workers if w.plan},  # tinyt's per-phase choices
    }
    result["targets"] = targets(result)
    out.mkdir(parents=True, exist_ok=True)
    (out / "peers.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "peers.md").write_text(markdown(result))
    _plot(result, out / "peers.png")
    return result


def step_bytes(cfg) -> int:
    """Bytes of int8 weights a decode step reads: every layer's matrices (q and the output
    projection C x C, k and v C x kv_heads*hs each; the MLP's two matrices, three for
    SwiGLU) and the lm_head (the embedding lookup reads one row)."""
    C, kv = cfg.n_embd, cfg.kv_heads * cfg.head_dim
    mlp = (3 if cfg.activation == "swiglu" else 2) * C * cfg.mlp_width
    return cfg.n_layer * (2 * C * C + 2 * C * kv + mlp) + C * cfg.vocab_size


def cache_bytes(cfg, past: float) -> int:
    """Bytes of the fp32 KV cache a decode step reads after `past` tokens (every layer's keys
    and values, n_kv_head heads: one-row attention streams them, as the matmuls stream the
    weights)."""
    return int(cfg.kv_cache_bytes_per_token() * past)


def floor_bytes(cfg, plan: dict) -> int:
    """What one decode step of the timed generation reads, on average over its steps."""
    return step_bytes(cfg) + cache_bytes(cfg, plan["decode_prompt"] + plan["decode_new"] / 2)


def read_bandwidth(nbytes: int, repeats: int = 5) -> float:
    """One core's read bandwidth in bytes/s: numpy summing a buffer of `nbytes` (as large as a
    model's weights, past the caches) viewed as int64; the best of `repeats`."""
    buf = np.ones(max(nbytes // 8, 1), dtype=np.int64)
    best = math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        buf.sum()
        best = min(best, time.perf_counter() - t)
    return buf.nbytes / best


def _inputs(artifacts: Path, cfg, agreement_prompts: int, agreement_tokens: int) -> dict:
    """The calls every engine times and the prompts of the agreement check."""
    from tinyt.data import agreement_prompts as cut_agreement_prompts
    from tinyt.data import held_out_prompts, load_corpus
    from tinyt.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_file(artifacts / "onnx-int8" / "tokenizer.json")
    # Held-out prompts from the corpus the INT8 stage judged accuracy on (its --data, or
    # the built-in one).
    val = load_corpus(json.loads((artifacts / "onnx-int8" / "manifest.json").read_text())
                      .get("options", {}).get("data")).val
    block_size = cfg.block_size
    # Shapes: decode after a 64-token prompt; prefill of 128 tokens (or block - 1) and block - 1.
    decode_prompt = min(64, block_size // 2)
    decode_new = min(60, block_size - decode_prompt - 1)
    prefills = sorted({min(128, block_size - 1), block_size - 1})
    # the accuracy report's prompts (tinyt.data.agreement_prompts), so that the two agree
    agree_prompts, agree_new = cut_agreement_prompts(tokenizer, val, block_size,
                                                     agreement_prompts)
    prompts = held_out_prompts(tokenizer, val, 1 + len(prefills), max(prefills))
    calls = [{"ids": prompts[0][:decode_prompt], "n": 1},
             {"ids": prompts[0][:decode_prompt], "n": decode_new}]
    calls += [{"ids": prompts[1 + i][:L], "n": 1} for i, L in enumerate(prefills)]
    return {"decode_prompt": decode_prompt, "decode_new": decode_new, "prefills": prefills,
            "agree_prompts": agree_prompts, "agree_new": min(agree_new, agreement_tokens),
            "calls": calls}


def _start(engines: list[str], artifacts: Path, threads: list[int],
           skipped: dict[str, str]) -> list[Worker]:
    """A worker process per engine and thread count; one that fails is skipped with why."""
    workers: list[Worker] = []
    try:
        for name in engines:
            if name in skipped:
                continue
            for n in threads:
                w = Worker(name, artifacts, n)
                if w.error:
                    skipped[w.label] = w.error
                    w.close()
                else:
                    workers.append(w)
    except BaseException:
        for w in workers:
            w.close()
        raise
    if not workers:
        raise RuntimeError("no engine could start: " + "; ".join(
            f"{k}: {v}" for k, v in skipped.items()))
    return workers


def _time(workers: list[Worker], bad: list[str], calls: list[dict], rounds: int,
          settle: int, block: int, nbytes: int) -> tuple[dict, float | None]:
    """Seconds per call per worker, rounds interleaved (each round starting at the next
    worker), and the median of one core's read bandwidth measured once a round."""
    raw: dict[str, list[list[float]]] = {w.label: [[] for _ in calls] for w in workers
                                         if w.name not in bad and rounds}  # 0: nothing timed
    bandwidth: list[float] = []
    for r in range(rounds):
        order = workers[r % len(workers):] + workers[:r % len(workers)]
        for w in order:
            if w.name in bad:
                continue
            times = w.ask(op="time", calls=calls, settle=settle, block=block)["times"]
            for i, ts in enumerate(times):
                raw[w.label][i] += ts
            time.sleep(REST_S)
        bandwidth.append(read_bandwidth(nbytes))
    return raw, (statistics.median(bandwidth) if bandwidth else None)


def _rows(raw: dict, plan: dict, bandwidth: float | None, nbytes: int) -> dict:
    """Per engine: decode ms per token (and × the memory floor), prefill ms per length."""
    rows = {}
    n = plan["decode_new"]
    for label, per_call in raw.items():
        med = [statistics.median(ts) * 1e3 for ts in per_call]
        decode = (med[1] - med[0]) / (n - 1)
        rows[label] = {"decode_ms_per_token": decode,
                       **{f"prefill_{L}_ms": med[2 + i] for i, L in enumerate(plan["prefills"])},
                       "first_token_ms": med[0], "generate_ms": med[1]}
        if bandwidth:
            rows[label]["decode_x_floor"] = decode / (nbytes / bandwidth * 1e3)
    return rows


def _kl(workers: list[Worker], threads: int, prompts: list[list[int]], vocab: int) -> dict:
    """KL(tinyt fp32 || engine) of the next token after each held-out prompt, mean over the
    prompts, in nats: how far each engine's distribution is from the fp32 model's, beyond
    its argmax."""
    import tempfile

    logprobs, out = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for w in workers:
            if w.threads != threads:
                continue
            path = str(Path(tmp) / f"{w.name}.npy")
            try:
                w.ask(op="logprobs", prompts=prompts, vocab=vocab, path=path)
                logprobs[w.name] = np.load(path).astype(np.float64)
            except RuntimeError as e:
                out[w.name] = {"kl_error": str(e).splitlines()[0][:200]}
    # Each engine's float32 log-softmax sums to 1 only within its rounding (~1e-7), which can
    # put a KL of two near-equal distributions a few 1e-9 below zero: renormalized in float64
    # the sum is >= 0 up to float64 rounding (~1e-15), and that residue is clamped.
    logprobs = {k: v - np.logaddexp.reduce(v, axis=-1, keepdims=True)
                for k, v in logprobs.items()}
    ref = logprobs.get(REFERENCE)
    for name, lp in logprobs.items():
        if ref is not None:
            kl = np.maximum((np.exp(ref) * (ref - lp)).sum(-1), 0.0)
            out[name] = {"kl_vs_fp32": float(kl.mean()), "kl_vs_fp32_max": float(kl.max())}
    return out


def _agreement(tokens: dict[str, list[list[int]]]) -> dict[str, dict]:
    ref = tokens.get(REFERENCE)
    out = {}
    for name, seqs in tokens.items():
        entry: dict[str, Any] = {}
        if ref is not None:
            same = sum(a == b for s, r in zip(seqs, ref) for a, b in zip(s, r))
            total = sum(len(r) for r in ref)
            entry.update(agreement_with_fp32=same / total, matching_tokens=same,
                         tokens=total)
        target = REFERENCE if name in EXACT else SAME_GRAPH.get(name)
        if target is not None and target in tokens:
            entry.update(must_equal=target, identical_to=seqs == tokens[target])
        out[name] = entry
    return out


def targets(result: dict) -> dict[str, Any]:
    """tinyt's best against the fastest peer, per thread count and measurement (ratios of
    times: < 1 is tinyt faster)."""
    rows, out = result["rows"], {}
    for n in result["method"]["threads"]:
        at = {k.rsplit("@", 1)[0]: v for k, v in rows.items() if k.endswith(f"@{n}t")}
        peers = {k: v for k, v in at.items() if k not in TINYT}
        ours = {k: v for k, v in at.items() if k in TINYT}
        if not peers or not ours:
            continue
        keys = ["decode_ms_per_token"] + [f"prefill_{L}_ms"
                                          for L in result["method"]["prefill_tokens"]]
        for key in keys:
            peer = min(peers, key=lambda k: peers[k][key])
            mine = min(ours, key=lambda k: ours[k][key])
            goal = TARGETS["decode_vs_fastest_peer_max" if key.startswith("decode")
                           else "prefill_vs_fastest_peer_max"]
            ratio = ours[mine][key] / peers[peer][key]
            out[f"{key}@{n}t"] = {"tinyt": mine, "fastest_peer": peer, "ratio": ratio,
                                  "target_max": goal, "met": ratio <= goal}
    for label, loop in result["outside_run"].items():
        us = loop["outside_run_us_per_token"]
        out[f"outside_run_us_per_token {label}"] = {
            "measured": us, "target_max": TARGETS["outside_run_us_per_token_max"],
            "met": us <= TARGETS["outside_run_us_per_token_max"]}
    return out


def _versions() -> dict[str, str | None]:
    out = {}
    for dist in ("tinyt", "onnxruntime", "onnxruntime-genai", "ctranslate2", "torch",
                 "transformers", "llama-cpp-python", "numpy"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = None
    return out


def markdown(result: dict) -> str:
    env, m = result["environment"], result["method"]
    flags = [k for k, v in env["cpu"].items() if v is True]
    vers = ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v)
    lines = [f"# tinyt vs peers, same weights ({result['model']['n_layer']} layers, "
             f"width {result['model']['n_embd']}, vocab {result['model']['vocab_size']})", "",
             f"{env['cpu'].get('model')}; CPU flags: {', '.join(flags)}; "
             f"{env['physical_cores']} physical cores; {vers}; {env['time']}", "",
             f"Batch 1, greedy. Decode = (t({m['decode_prompt']}-token prompt, "
             f"{m['decode_new']} new) − t(same, 1 new)) / {m['decode_new'] - 1}; prefill = "
             f"t(L-token prompt, 1 new). Median of {m['rounds']} interleaved rounds × "
             f"{m['block']} calls, each engine in its own process.", ""]
    keys = ["decode_ms_per_token"] + [f"prefill_{L}_ms" for L in m["prefill_tokens"]]
    floor = result.get("memory_floor")
    if floor:
        keys.insert(1, "decode_x_floor")
        weights_mb = floor["int8_weight_bytes"] / 1e6
        lines[-1:-1] = [f"Memory floor of a decode step: ({weights_mb:.1f} MB "
                        f"of int8 weights + {floor['kv_cache_bytes'] / 1e6:.1f} MB of fp32 KV "
                        "cache at the mean past of the timed steps) ÷ one core's read "
                        f"bandwidth ({floor['read_gb_per_s_one_core']:.1f} GB/s, numpy between "
                        f"the rounds) = {floor['decode_ms']:.3f} ms; decode_x_floor is each "
                        "engine's decode against it (fp32 engines read 4× the weights; where "
                        "the weights fit in a cache, as the demo's do, this is a cache floor, "
                        "not memory's).", ""]
    if not result["rows"]:
        lines[-2] = "Greedy agreement only (--rounds 0: nothing timed)."
    lines += ["| engine | threads | " + " | ".join(keys) + " |",
              "|---|---|" + "---|" * len(keys)] if result["rows"] else []
    for label, row in sorted(result["rows"].items(), key=lambda kv: (kv[0].split("@")[1],
                                                                      kv[1][keys[0]])):
        name, n = label.rsplit("@", 1)
        lines.append(f"| {name} | {n[:-1]} | " + " | ".join(f"{row[k]:.3f}" for k in keys)
                     + " |")
    lines += ["", f"Greedy agreement with tinyt fp32 ({m['agreement_prompts']} held-out prompts "
              f"of {m['agreement_prompt_tokens']} tokens × {m['agreement_new_tokens']} new "
              "tokens, position by position):", "",
              "| engine | agreement | KL vs fp32, next token (mean / max) | must equal | "
              "identical |", "|---|---|---|---|---|"]
    for name, a in result["agreement"].items():
        ag, kl = a.get("agreement_with_fp32"), a.get("kl_vs_fp32")
        kl_text = "—" if kl is None else f"{kl:.2e} / {a['kl_vs_fp32_max']:.2e}"
        lines.append(f"| {name} | {'—' if ag is None else f'{ag:.1%}'} "
                     f"({a.get('matching_tokens')}/{a.get('tokens')}) | {kl_text} | "
                     f"{a.get('must_equal', '—')} | {a.get('identical_to', '—')} |")
    if result["targets"]:
        lines += ["", "| target | tinyt | fastest peer | ratio | goal | met |",
                  "|---|---|---|---|---|---|"]
    for key, t in result["targets"].items():
        if "ratio" in t:
            lines.append(f"| {key} | {t['tinyt']} | {t['fastest_peer']} | {t['ratio']:.2f} | "
                         f"≤ {t['target_max']} | {t['met']} |")
        else:
            lines.append(f"| {key} | {t['measured']:.1f} µs | — | — | ≤ {t['target_max']} | "
                         f"{t['met']} |")
    if result.get("plans"):
        lines += ["", "What each engine chose at load (tinyt: runtime/tuning.py's plan):", ""]
        lines += [f"- {label}: {plan}" for label, plan in result["plans"].items()]
    if result["skipped"]:
        lines += ["", "Skipped:", ""] + [f"- {k}: {v}" for k, v in result["skipped"].items()]
    if result["mismatched"]:
        lines += ["", f"Not timed (tokens differ where they must be equal): "
                      f"{result['mismatched']}"]
    return "\n".join(lines) + "\n"


def _plot(result: dict, path: Path) -> None:
    if not result["rows"]:
        return
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    m = result["method"]
    keys = ["decode_ms_per_token", f"prefill_{m['prefill_tokens'][-1]}_ms"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    labels = sorted(result["rows"], key=lambda k: (k.split("@")[1], k))
    for ax, key in zip(axes, keys):
        vals = [result["rows"][k][key] for k in labels]
        colors = ["tab:blue" if k.split("@")[0] in TINYT else "tab:gray" for k in labels]
        ax.barh(labels, vals, color=colors)
        ax.set_xlabel("ms" + (" per token" if key.startswith("decode") else ""))
        ax.set_title(key.replace("_", " "))
        ax.invert_yaxis()
    fig.suptitle(f"tinyt (blue) vs peers, same weights: {result['model']['n_layer']} layers × "
                 f"{result['model']['n_embd']}, batch 1")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    _plot_plane(result, path.with_name("peers-plane.png"), plt)


def _plot_plane(result: dict, path: Path, plt) -> None:
    """Decode ms/token against greedy agreement with fp32, one point per engine and
    precision at the first thread count: down and to the right is better."""
    n = result["method"]["threads"][0]
    points = [(k.rsplit("@", 1)[0], r["decode_ms_per_token"]) for k, r in result["rows"].items()
              if k.endswith(f"@{n}t")]
    points = [(name, ms, result["agreement"].get(name, {}).get("agreement_with_fp32"))
              for name, ms in points]
    points = [p for p in points if p[2] is not None]
    if not points:
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, ms, agree in points:
        ax.scatter(ms, 100 * agree, color="tab:blue" if name in TINYT else "tab:gray")
        ax.annotate(name, (ms, 100 * agree), textcoords="offset points", xytext=(4, 3),
                    fontsize=8)
    ax.set_xlabel(f"decode ms per token ({n} thread{'s' if n > 1 else ''})")
    ax.set_ylabel("greedy agreement with fp32, %")
    ax.set_title(f"speed against fidelity: {result['model']['n_layer']} layers × "
                 f"{result['model']['n_embd']} (tinyt blue)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifacts", type=Path)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/peers"))
    ap.add_argument("--rounds", type=int, default=8, help="0: greedy agreement only, no timing")
    ap.add_argument("--threads", type=int, action="append")
    ap.add_argument("--engine", action="append", help=f"one of {', '.join(ENGINES)} (repeat)")
    ap.add_argument("--agreement-prompts", type=int, default=32,
                    help="held-out prompts for the greedy agreement (64 new tokens each)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args.artifacts, args.threads[0])
    try:
        run(args.artifacts, args.out, threads=args.threads, rounds=args.rounds,
            engines=args.engine, agreement_prompts=args.agreement_prompts)
    except (ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print((args.out / "peers.md").read_text())


if __name__ == "__main__":
    main()
