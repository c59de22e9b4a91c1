"""How each family of engines runs in its worker: a loader per family, each returning a greedy
generator on the same contract,

    gen(prompt ids, n)  -> exactly n new token ids (end-of-text held back)
    gen.logits(ids)     -> the next token's logits after `ids`, [vocab] (an engine may pad it)
    gen.plan            -> what the engine chose at load, or absent

Every loader is `load(path, artifacts, threads)`, path being ARTIFACTS/<the engine's artifact>
(engines.py names it). Each imports its engine's package when called, so a worker loads one.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tinyt.contract import DECODER_WITH_PAST

from .formats import EXTRA_BUFTS, GGUF

Generator = Callable[[list[int], int], list[int]]  # with .logits (and perhaps .plan) set


def _with_logits(gen, logits: Callable[[list[int]], np.ndarray], plan: str | None = None):
    """A generator that also answers the next-token logits after a prompt ([vocab])."""
    gen.logits = logits
    if plan is not None:
        gen.plan = plan
    return gen


def tinyt(path: Path, artifacts: Path, threads: int) -> Generator:
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
    generate.plan = None if lm.plan is None else lm.plan.describe()
    return _with_logits(generate, logits)


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


def genai_logits(model, ids: list[int]) -> np.ndarray:
    """onnxruntime_genai's logits of the token after `ids`."""
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + 1, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(np.asarray([ids], dtype=np.int32))
    out = np.asarray(gen.get_output("logits"), dtype=np.float32)  # [1, S or 1, V]
    return out.reshape(-1, out.shape[-1])[-1].copy()


def genai(path: Path, artifacts: Path, threads: int) -> Generator:
    """ONNX Runtime GenAI on a directory with its genai_config.json (tinyt's INT8 graph as it
    is, or its model builder's artifact)."""
    import onnxruntime_genai as og

    config = og.Config(str(path))
    config.clear_providers()
    config.overlay(json.dumps({"model": {"decoder": {"session_options": {
        "intra_op_num_threads": threads, "inter_op_num_threads": 1}}}}))
    model = og.Model(config)
    return _with_logits(lambda ids, n: genai_greedy(model, ids, n, min_length=True),
                        lambda ids: genai_logits(model, ids))


def optimum(path: Path, artifacts: Path, threads: int) -> Generator:
    """Optimum's ORTModelForCausalLM.generate on its own export."""
    import torch
    from onnxruntime import SessionOptions
    from optimum.onnxruntime import ORTModelForCausalLM

    opts = SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    torch.set_num_threads(threads)
    model = ORTModelForCausalLM.from_pretrained(path, session_options=opts)

    def generate(ids, n):
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False)
        return out[0, len(ids):].tolist()

    def logits(ids):
        mask = torch.ones(1, len(ids), dtype=torch.long)
        return model(torch.tensor([ids]), attention_mask=mask).logits[0, -1].detach().numpy()
    return _with_logits(generate, logits)


def ctranslate2(path: Path, artifacts: Path, threads: int) -> Generator:
    """A CTranslate2 Generator on its converted directory (tokens by its vocabulary)."""
    import ctranslate2 as ct2

    gen = ct2.Generator(str(path), device="cpu", intra_threads=threads, inter_threads=1)
    vocab = json.loads((path / "vocabulary.json").read_text())
    return _with_logits(lambda ids, n: gen.generate_batch(
        [[vocab[i] for i in ids]], max_length=n, min_length=n, sampling_topk=1,
        include_prompt_in_result=False)[0].sequences_ids[0],
        lambda ids: np.array(gen.forward_batch([ids]))[0, -1])


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


def llama_cpp(path: Path, artifacts: Path, threads: int) -> Generator:
    """llama-cpp-python on its GGUF, with the extra buffer types where the probe at conversion
    found them safe (formats.gguf)."""
    from llama_cpp import LogitsProcessorList

    from tinyt.manifest import read_model_config

    cfg, _ = read_model_config(artifacts / "onnx-opt")
    bufts = (path / EXTRA_BUFTS).read_text()
    llm = llama_cpp_model(path / GGUF, cfg.block_size, threads, bufts.startswith("on"))
    eos = llm.token_eos()

    def no_eos(_, scores):
        if eos >= 0:
            scores[eos] = -np.inf
        return scores

    def generate(ids, n):
        llm.reset()  # no reuse of the previous call's cache for a common prefix
        out: list[Any] = []
        for tok in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                                repeat_penalty=1.0, reset=True,
                                logits_processor=LogitsProcessorList([no_eos])):
            out.append(int(tok))
            if len(out) == n:
                return out
        return out

    def logits(ids):
        llm.reset()
        llm.eval(ids)  # the last token's logits (llama-cpp-python keeps no scores now)
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)).copy()
    return _with_logits(generate, logits,
                        "llama.cpp extra buffer types (AMX, repacked weights): " + bufts)


def torch_eager(path: Path, artifacts: Path, threads: int) -> Generator:
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
    return _with_logits(generate, logits)
