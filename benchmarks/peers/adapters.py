"""How each family of engines runs in its worker: a loader per family, each returning a greedy
generator on the same contract,

    gen(prompt ids, n)  -> exactly n new token ids (end-of-text held back)
    gen.logits(ids)     -> the next token's logits after `ids`, [vocab] (an engine may pad it)
    gen.stepped(ids, n) -> the same greedy generation of n tokens, returning when each was known:
                           n perf_counter() seconds from the call's start, taken inside the
                           engine's own token loop (so a long prompt's time stays out of the
                           steps'; the tokens themselves are not returned)
    gen.plan            -> what the engine chose at load, or absent

Every loader is `load(path, artifacts, threads, context)`, path being ARTIFACTS/<the engine's
artifact> and context the most tokens a call of the run holds (None: the model's block_size;
only llama.cpp sizes buffers at load, the others per call)
(engines.py names it). Each imports its engine's package when called, so a worker loads one.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tinyt.contract import DECODER_WITH_PAST
from tinyt.errors import BenchError

from .formats import EXTRA_BUFTS, GGUF

Generator = Callable[[list[int], int], list[int]]  # with .logits (and perhaps .plan) set


def _with_logits(gen, logits: Callable[[list[int]], np.ndarray],
                 stepped: Callable[[list[int], int], list[float]], plan: str | None = None):
    """A generator that also answers the next-token logits after a prompt ([vocab]) and the
    times of a generation's tokens."""
    gen.logits, gen.stepped = logits, stepped
    if plan is not None:
        gen.plan = plan
    return gen


def tinyt(path: Path, artifacts: Path, threads: int,
          context: int | None = None) -> Generator:
    """tinyt.runtime on one of tinyt's variants; its plan is what load chose."""
    import tinyt.runtime as rt
    from tinyt.runtime.feeds import prefill_feeds

    lm = rt.load(path, threads=threads)

    def generate(ids, n):
        return lm.generate_ids([ids], max_new_tokens=n, min_new_tokens=n)[0].token_ids

    def logits(ids):
        steps = lm.steps(prefill_feeds(lm.config, DECODER_WITH_PAST, np.array([ids])),
                         new_tokens=1)  # the prompt pass only: buffers for it alone
        try:
            return next(steps)[0, -1].copy()
        finally:
            steps.close()

    def stepped(ids, n):  # the step API generate drives, on the same sessions and buffers
        t0, times, active = time.perf_counter(), [], np.ones(1, dtype=bool)
        steps = lm.steps(prefill_feeds(lm.config, DECODER_WITH_PAST, np.array([ids])),
                         new_tokens=n)
        try:
            z = next(steps)
            for i in range(n):
                tok = np.array([z[0, -1].argmax()], dtype=np.int64)
                times.append(time.perf_counter() - t0)
                if i + 1 < n:
                    z = steps.send((tok, active))
        finally:
            steps.close()
        return times
    generate.plan = None if lm.plan is None else lm.plan.describe()
    generate.lm = lm  # the worker's loop-cost probe measures this same model
    return _with_logits(generate, logits, stepped)


def genai_greedy(model, ids: list[int], n: int, *, min_length: bool = False,
                 times: list[float] | None = None, capacity: int = 0) -> list[int]:
    """Up to n greedy tokens from an onnxruntime_genai Model (exactly n with min_length:
    the end-of-text token held back); `times` gets each token's perf_counter() seconds from
    the call's start. capacity: the least KV length to ask for (GenAI's sliding-window layers
    refuse a cache shorter than their window)."""
    import onnxruntime_genai as og

    t0 = time.perf_counter()
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=max(len(ids) + n, capacity), do_sample=False,
                              **({"min_length": len(ids) + n} if min_length else {}))
    gen = og.Generator(model, params)
    gen.append_tokens(np.asarray([ids], dtype=np.int32))
    out: list[int] = []
    while len(out) < n and not gen.is_done():
        gen.generate_next_token()
        out.append(int(gen.get_next_tokens()[0]))
        if times is not None:
            times.append(time.perf_counter() - t0)
    return out


def genai_logits(model, ids: list[int], capacity: int = 0) -> np.ndarray:
    """onnxruntime_genai's logits of the token after `ids`."""
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    params.set_search_options(max_length=max(len(ids) + 1, capacity), do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(np.asarray([ids], dtype=np.int32))
    out = np.asarray(gen.get_output("logits"), dtype=np.float32)  # [1, S or 1, V]
    return out.reshape(-1, out.shape[-1])[-1].copy()


def genai(path: Path, artifacts: Path, threads: int,
          context: int | None = None) -> Generator:
    """ONNX Runtime GenAI on a directory with its genai_config.json (tinyt's INT8 graph as it
    is, or its model builder's artifact)."""
    import onnxruntime_genai as og

    config = og.Config(str(path))
    config.clear_providers()
    config.overlay(json.dumps({"model": {"decoder": {"session_options": {
        "intra_op_num_threads": threads, "inter_op_num_threads": 1}}}}))
    model = og.Model(config)
    model_config = json.loads((path / "genai_config.json").read_text())["model"]
    window = (model_config["decoder"].get("sliding_window") or {}).get("window_size", 0)
    # Gemma 3: its local layers' window (a window past the context, Phi-3's 262,144: none)
    capacity = window if window < model_config.get("context_length", 0) else 0

    def stepped(ids, n):
        times: list[float] = []
        genai_greedy(model, ids, n, min_length=True, times=times, capacity=capacity)
        return times
    return _with_logits(
        lambda ids, n: genai_greedy(model, ids, n, min_length=True, capacity=capacity),
        lambda ids: genai_logits(model, ids, capacity), stepped)


def optimum(path: Path, artifacts: Path, threads: int,
            context: int | None = None) -> Generator:
    """Optimum's ORTModelForCausalLM.generate on its own export."""
    import torch
    from onnxruntime import SessionOptions
    from optimum.onnxruntime import ORTModelForCausalLM

    opts = SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    torch.set_num_threads(threads)
    model = ORTModelForCausalLM.from_pretrained(path, session_options=opts)
    head_dim = getattr(model.config, "head_dim", None)
    if head_dim and getattr(model, "embed_size_per_head", head_dim) != head_dim:
        # optimum-onnx 0.1.0 reads head_dim for Gemma and a few others only, and sizes every
        # other model's empty past as width / heads: Qwen3 (64 where its export takes 128)
        # fails its first step. Its export is right; its runtime is told the export's size.
        model.embed_size_per_head = head_dim
    kv_heads = getattr(model.config, "num_key_value_heads", None)
    if kv_heads and getattr(model, "num_key_value_heads", kv_heads) != kv_heads:
        # and the key/value heads of a list of model types, without gemma2's: it sizes
        # Gemma 2's empty past with every query head ("Got: 4 Expected: 2")
        model.num_key_value_heads = kv_heads

    def generate(ids, n, streamer=None):
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, streamer=streamer)
        return out[0, len(ids):].tolist()

    def logits(ids):
        mask = torch.ones(1, len(ids), dtype=torch.long)
        return model(torch.tensor([ids]), attention_mask=mask).logits[0, -1].detach().numpy()

    class Clock:  # transformers' streamer protocol: put(prompt), then put(token) per step
        def __init__(self):
            self.t0, self.times, self.prompt_seen = time.perf_counter(), [], False

        def put(self, value):
            if self.prompt_seen:
                self.times.append(time.perf_counter() - self.t0)
            self.prompt_seen = True

        def end(self):
            pass

    def stepped(ids, n):
        clock = Clock()
        generate(ids, n, clock)
        return clock.times
    return _with_logits(generate, logits, stepped)


def ctranslate2(path: Path, artifacts: Path, threads: int,
                context: int | None = None) -> Generator:
    """A CTranslate2 Generator on its converted directory (tokens by its vocabulary)."""
    import ctranslate2 as ct2

    gen = ct2.Generator(str(path), device="cpu", intra_threads=threads, inter_threads=1)
    vocab = json.loads((path / "vocabulary.json").read_text())

    def generate(ids, n, callback=None):
        return gen.generate_batch([[vocab[i] for i in ids]], max_length=n, min_length=n,
                                  sampling_topk=1, include_prompt_in_result=False,
                                  callback=callback)[0].sequences_ids[0]

    def stepped(ids, n):  # its per-token callback (greedy, one hypothesis)
        t0, times = time.perf_counter(), []
        generate(ids, n, lambda step: times.append(time.perf_counter() - t0))  # None: go on
        return times
    return _with_logits(generate, lambda ids: np.array(gen.forward_batch([ids]))[0, -1],
                        stepped)


KV_TYPES = {"f16": 1, "q8_0": 8}  # llama.cpp's cache types (ggml_type), f16 its default


def llama_cpp_model(path: Path, n_ctx: int, threads: int, extra_bufts: bool = True,
                    kv: str = "f16", flash_attn: bool | None = None):
    """A llama_cpp.Llama on `path`; extra_bufts=False loads without llama.cpp's extra buffer
    types (AMX and repacked-weight layouts), its portable kernels only; kv: its KV cache's
    type (KV_TYPES); flash_attn: llama.cpp's fused attention (llama-cpp-python's default:
    off), None: on exactly where the cache is quantized, which needs it."""
    if kv not in KV_TYPES:
        raise BenchError(f"llama.cpp KV cache type {kv!r}; known: {', '.join(KV_TYPES)}")
    import llama_cpp
    import llama_cpp.llama as module

    defaults = llama_cpp.llama_model_default_params

    def params():
        p = defaults()
        p.use_extra_bufts = extra_bufts
        return p
    module.llama_cpp.llama_model_default_params = params  # Llama() reads its defaults here
    try:
        kw = {"type_k": KV_TYPES[kv], "type_v": KV_TYPES[kv],
              "flash_attn": kv != "f16" if flash_attn is None else flash_attn}
        return llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx,
                               n_threads=threads, n_threads_batch=threads, verbose=False, **kw)
    finally:
        module.llama_cpp.llama_model_default_params = defaults


def llama_cpp(path: Path, artifacts: Path, threads: int,
              context: int | None = None, kv: str = "f16",
              flash_attn: bool | None = None) -> Generator:
    """llama-cpp-python on its GGUF, with the extra buffer types where the probe at conversion
    found them safe (formats.gguf), its KV cache of type kv (KV_TYPES)."""
    from llama_cpp import LogitsProcessorList

    from tinyt.manifest import read_model_config

    cfg, _ = read_model_config(artifacts / "onnx-opt")
    bufts = (path / EXTRA_BUFTS).read_text()
    # its KV cache and logits buffers are n_ctx long from the load on (at 131,072 tokens
    # and 128,256 ids, 62.6 GiB of logits alone): the run's longest call, not the model's
    n_ctx = cfg.block_size if context is None else min(context, cfg.block_size)
    llm = llama_cpp_model(path / GGUF, n_ctx, threads, bufts.startswith("on"), kv,
                          flash_attn)
    eos = llm.token_eos()

    def no_eos(_, scores):
        if eos >= 0:
            scores[eos] = -np.inf
        return scores

    def generate(ids, n, times=None):
        t0 = time.perf_counter()
        llm.reset()  # no reuse of the previous call's cache for a common prefix
        out: list[Any] = []
        for tok in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                                repeat_penalty=1.0, reset=True,
                                logits_processor=LogitsProcessorList([no_eos])):
            out.append(int(tok))
            if times is not None:
                times.append(time.perf_counter() - t0)
            if len(out) == n:
                return out
        return out

    def stepped(ids, n):
        times: list[float] = []
        generate(ids, n, times)
        return times

    def logits(ids):
        llm.reset()
        llm.eval(ids)  # the last token's logits (llama-cpp-python keeps no scores now)
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)).copy()
    return _with_logits(generate, logits, stepped,
                        "llama.cpp extra buffer types (AMX, repacked weights): " + bufts
                        + f"; KV cache {kv}, flash attention "
                        + ("on" if llm.context_params.flash_attn_type > 0 else "off"))


def torch_eager(path: Path, artifacts: Path, threads: int,
                context: int | None = None) -> Generator:
    """PyTorch eager: tinyt's own model on the checkpoint, with its KV cache."""
    import torch

    from tinyt.checkpoint import load_checkpoint
    from tinyt.model import generate as torch_generate

    torch.set_num_threads(threads)
    model = load_checkpoint(path).model.eval()

    def generate(ids, n):
        out = torch_generate(model, torch.tensor([ids]), n, temperature=0)  # no eos: n tokens
        return out[0, len(ids):].tolist()

    def logits(ids):
        with torch.no_grad():
            return model(torch.tensor([ids]))[0][0, -1].numpy()

    def stepped(ids, n):  # generate's loop: the prompt, then one token a step on the cache
        t0, times = time.perf_counter(), []
        with torch.no_grad():
            z, cache = model(torch.tensor([ids]))
            for i in range(n):
                tok = z[:, -1].argmax(-1, keepdim=True)
                times.append(time.perf_counter() - t0)
                if i + 1 < n:
                    z, cache = model(tok, past_key_values=cache)
        return times
    return _with_logits(generate, logits, stepped)
