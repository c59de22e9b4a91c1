"""The run: every engine side by side on the same weights, each in its own worker process.

    prepare (skips, conversions) ─▶ the calls and prompts (held-out text of the INT8 stage's
    corpus) ─▶ one worker per (engine, threads)
      1. same computation first: greedy tokens and next-token log-probabilities on held-out
         prompts, against tinyt fp32's
      2. then time: rounds interleaved across the workers, the read bandwidth of as many cores
         as each thread count measured between them; tinyt's loop cost outside ONNX
         Runtime's runs
    ─▶ peers.json (environment, every raw time), peers.md, peers.png
"""
from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from tinyt.errors import BenchError
from tinyt.hardware import gib

from ..environment import environment
from . import analysis, report
from .engines import ENGINES, TINYT
from .prepare import prepare
from .protocol import REST_S, Worker
from .worker import start

MEMORY_RESERVE = 1 << 30  # left free when the next worker starts (the parent, the page cache)
VERSIONS = ("tinyt", "onnxruntime", "onnxruntime-genai", "ctranslate2", "torch", "transformers",
            "llama-cpp-python", "numpy")
NEEDED = ("checkpoint", "onnx-opt", "onnx-int8")  # under ARTIFACTS, for every run


def run(artifacts: Path, out: Path, *, threads: list[int] | None = None, rounds: int = 8,
        block: int = 3, settle: int = 1, engines: list[str] | None = None,
        agreement_prompts: int = 32, agreement_tokens: int = 64,
        long_context: int | None = None) -> dict[str, Any]:
    """Measure every engine side by side; write peers.json, peers.md and peers.png.
    long_context=N adds a generation that fills N tokens of context (a prompt of N - the
    decode's new tokens, then those tokens): decode speed there, and each worker's peak
    resident memory with a cache of that length."""
    from tinyt.hardware import physical_cores
    from tinyt.manifest import read_model_config

    engines = list(engines or ENGINES)
    _check_options(artifacts, engines, rounds, block, settle)
    cfg, _ = read_model_config(artifacts / "onnx-int8")
    _check_long_context(long_context, cfg.block_size)  # before any conversion runs
    threads = threads or sorted({1, physical_cores()})
    skipped = prepare(artifacts, engines)
    plan = _inputs(artifacts, cfg, agreement_prompts, agreement_tokens, long_context)
    nbytes = analysis.floor_bytes(cfg, plan)
    longest = max(plan["calls"], key=lambda c: len(c["ids"]) + c["n"])
    context = max(len(longest["ids"]) + longest["n"],  # what any call holds, at most
                  max(len(p) for p in plan["agree_prompts"]) + plan["agree_new"])
    workers = _start(engines, artifacts, threads, skipped, warm=longest, context=context)
    try:
        # 1. the same computation: greedy tokens on held-out prompts
        agreement, bad = _agreement(workers, threads[0], plan, cfg.vocab_size, skipped)
        refused = analysis.refused_with(agreement, bad)  # quantizations of a refused model
        # 2. time, rounds interleaved (and the read bandwidth of 1..threads cores between them)
        raw, bandwidth = _time(workers, bad + list(refused), plan["calls"], rounds, settle,
                               block, nbytes, threads, skipped)
        # resident memory, read before the loop probe loads a second runtime
        memory = _memory(workers)
        loop = {w.label: w.ask(op="outside_run", ids=plan["calls"][1]["ids"],
                               n=plan["decode_new"])
                for w in (workers if rounds else []) if w.name in TINYT}  # 0: agreement only
    finally:
        for w in workers:
            w.close()
    result = {
        "model": cfg.to_dict(), "artifacts": str(artifacts),
        "environment": environment(VERSIONS),
        "method": _method(plan, threads, rounds, block, settle),
        "memory_floor": analysis.memory_floor(cfg, plan, bandwidth),
        "engines": {k: v.about for k, v in ENGINES.items() if k in engines},
        "skipped": skipped, "mismatched": bad, "refused_with": refused, "agreement": agreement,
        "rows": analysis.rows(raw, plan, bandwidth, nbytes),
        "memory": memory, "files": {e: _bytes(artifacts / ENGINES[e].artifact)
                                    for e in engines if e not in skipped},
        "outside_run": loop, "raw_s": raw,
        # tinyt's per-phase choices
        "plans": {w.label: w.hello["plan"] for w in workers if w.hello.get("plan")},
    }
    result["targets"] = analysis.targets(result)
    _write(result, out)
    return result


def _check_options(artifacts: Path, engines: list[str], rounds: int, block: int,
                   settle: int) -> None:
    """Refuse unknown engines, bad counts and missing artifacts before any work starts."""
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        raise BenchError(f"unknown engine(s) {unknown}; known: {', '.join(ENGINES)}")
    if not (isinstance(rounds, int) and rounds >= 0):
        raise BenchError(f"rounds={rounds!r} must be an integer >= 0 (0: agreement only)")
    if not (isinstance(block, int) and block >= 1 and isinstance(settle, int) and settle >= 0):
        raise BenchError(f"block={block!r} must be an integer >= 1 and settle={settle!r} one "
                         ">= 0 (timed and untimed calls per call and round)")
    for sub in NEEDED:
        if not (artifacts / sub).is_dir():
            raise BenchError(f"{artifacts / sub} is missing: run `tinyt pipeline --out "
                             f"{artifacts}` first (peers need checkpoint/, onnx-opt/, onnx-int8/)")


def _agreement(workers: list[Worker], threads: int, plan: dict, vocab: int,
               skipped: dict[str, str]) -> tuple[dict[str, dict], list[str]]:
    """Each engine's greedy agreement and next-token KL against tinyt fp32's, from its worker
    at `threads`; and the engines that must equal a reference but do not (never timed)."""
    tokens = _greedy(workers, threads, plan, skipped)
    agreement = analysis.agreement(tokens)
    logprobs, failed = _logprobs(workers, threads, plan["agree_prompts"], vocab)
    for name, kl in {**failed, **analysis.kl_vs_reference(logprobs)}.items():
        agreement.setdefault(name, {}).update(kl)
    bad = [e for e, a in agreement.items() if a.get("must_equal") and a["identical_to"] is False]
    return agreement, bad


def _memory(workers: list[Worker]) -> dict[str, dict]:
    """Each worker's resident memory: after the load (with the load's own peak), and the peak
    over the calls since it (the longest context's included)."""
    return {w.label: {"loaded": w.hello.get("loaded"), "peak_reset": w.hello.get("peak_reset"),
                      **(w.ask(op="memory")["memory"] or {})} for w in workers}


def _method(plan: dict, threads: list[int], rounds: int, block: int, settle: int) -> dict:
    """peers.json's "method": the thread counts, the rounds and the shapes of every call."""
    return {"threads": threads, "rounds": rounds, "block": block, "settle": settle,
            "decode_prompt": plan["decode_prompt"], "decode_new": plan["decode_new"],
            "prefill_tokens": plan["prefills"],
            "agreement_prompts": len(plan["agree_prompts"]),
            "agreement_prompt_tokens": len(plan["agree_prompts"][0]),
            "agreement_new_tokens": plan["agree_new"],
            "long_context": plan["long_context"]}


def _write(result: dict, out: Path) -> None:
    """peers.json, peers.md and peers.png under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "peers.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "peers.md").write_text(report.markdown(result))
    report.plot(result, out / "peers.png")


def _bytes(path: Path) -> int | None:
    """An engine's model on disk: every file of its directory (a pair: both graphs)."""
    if path.is_file():
        return path.stat().st_size
    files = [f for f in path.rglob("*") if f.is_file()] if path.is_dir() else []
    return sum(f.stat().st_size for f in files) or None


def _decode_shape(block_size: int) -> tuple[int, int]:
    """The timed decode: its prompt's tokens and its new tokens (both within the context)."""
    decode_prompt = min(64, block_size // 2)
    return decode_prompt, min(60, block_size - decode_prompt - 1)


def _check_long_context(long_context: int | None, block_size: int) -> None:
    decode_new = _decode_shape(block_size)[1]
    if long_context is not None and not (isinstance(long_context, int)
                                         and decode_new < long_context <= block_size):
        raise BenchError(f"long_context={long_context!r}: more than the decode's {decode_new} "
                         f"new tokens, at most the model's context, {block_size}")


def _inputs(artifacts: Path, cfg, agreement_prompts: int, agreement_tokens: int,
            long_context: int | None = None) -> dict:
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
    # Shapes: decode after a 64-token prompt; prefills of 128 and 1,024 tokens (each at most
    # block - 1): the cost of a call, never of the model's whole context.
    decode_prompt, decode_new = _decode_shape(block_size)
    prefills = sorted({min(128, block_size - 1), min(1024, block_size - 1)})
    # the accuracy report's prompts (tinyt.data.agreement_prompts), so that the two agree
    agree_prompts, agree_new = cut_agreement_prompts(tokenizer, val, block_size,
                                                     agreement_prompts)
    prompts = held_out_prompts(tokenizer, val, 1 + len(prefills), max(prefills))
    calls = [{"ids": prompts[0][:decode_prompt], "n": 1},
             {"ids": prompts[0][:decode_prompt], "n": decode_new}]
    calls += [{"ids": prompts[1 + i][:L], "n": 1} for i, L in enumerate(prefills)]
    if long_context:  # the decode at a filled context, its prompt cut on its own (so the other
        # calls' prompts are the same with or without it): the first token's time, and the
        # steps after it timed inside each engine's loop. (A difference of two calls, as for
        # the short decode, would carry two prefills of thousands of tokens, whose noise
        # is the size of the steps' whole time.)
        long_ids = held_out_prompts(tokenizer, val, 1, long_context - decode_new)[0]
        calls += [{"ids": long_ids, "n": 1},
                  {"ids": long_ids, "n": decode_new, "per_step": True}]
    return {"decode_prompt": decode_prompt, "decode_new": decode_new, "prefills": prefills,
            "long_context": long_context,
            "agree_prompts": agree_prompts, "agree_new": min(agree_new, agreement_tokens),
            "calls": calls}


def _start(engines: list[str], artifacts: Path, threads: list[int],
           skipped: dict[str, str], warm: dict | None = None,
           context: int | None = None) -> list[Worker]:
    """A worker process per engine and thread count; one that fails is skipped with why.
    `context`: the most tokens any call of the run holds (an engine that sizes its buffers
    at load, llama.cpp, sizes them for it, not for the model's whole context).

    Every worker stays loaded through the interleaved rounds, so what they hold together must
    fit: each runs `warm` (the longest call) once as it starts, so that its memory is what the
    calls will make it, and the next starts only where the machine has room for it (about
    twice its files while it loads, the most a started worker grew over the longest call, and
    a reserve); one that would not fit is skipped with the sizes, not left to the kernel's
    out-of-memory killer halfway through the run."""
    from tinyt.hardware import available_memory

    workers: list[Worker] = []
    grown = 0  # the most a started worker's resident memory grew over the warm-up call
    try:
        for name in engines:
            if name in skipped:
                continue
            files = _bytes(artifacts / ENGINES[name].artifact) or 0
            for n in threads:
                need, free = 2 * files + grown + MEMORY_RESERVE, available_memory()
                if free is not None and free < need:
                    skipped[f"{name}@{n}t"] = (
                        f"not started: {gib(free)} available with {len(workers)} worker(s) "
                        f"loaded, and it needs about {gib(need)} (twice its files' "
                        f"{gib(files)}, {gib(grown)} for the longest call, {gib(MEMORY_RESERVE)}"
                        " spare): run fewer engines or thread counts together")
                    continue
                w = start(name, artifacts, n, context)
                if w.error:
                    skipped[w.label] = w.error
                    w.close()
                    continue
                workers.append(w)
                if warm is not None:
                    before = (w.ask(op="memory")["memory"] or {}).get("rss")
                    w.ask(op="time", calls=[warm], settle=0, block=1)
                    after = (w.ask(op="memory")["memory"] or {}).get("rss")
                    if before and after:
                        grown = max(grown, after - before)
    except BaseException:
        for w in workers:
            w.close()
        raise
    if not workers:
        raise BenchError("no engine could start: " + "; ".join(
            f"{k}: {v}" for k, v in skipped.items()))
    return workers


def _greedy(workers: list[Worker], threads: int, plan: dict,
            skipped: dict[str, str]) -> dict[str, list[list[int]]]:
    """Each engine's greedy tokens on the agreement prompts, from its worker at `threads`. An
    engine that fails them (it cannot compute this model) is that engine's result: recorded in
    `skipped` with its error, its workers closed and dropped from `workers`."""
    tokens = {}
    for w in [w for w in workers if w.threads == threads]:
        try:
            tokens[w.name] = w.ask(op="greedy", prompts=plan["agree_prompts"],
                                   n=plan["agree_new"])["tokens"]
        except RuntimeError as e:
            skipped[w.name] = "failed the greedy check: " + " ".join(str(e).split())[:300]
    for w in [w for w in workers if w.name in skipped]:
        w.close()
        workers.remove(w)
    return tokens


def _logprobs(workers: list[Worker], threads: int, prompts: list[list[int]],
              vocab: int) -> tuple[dict[str, np.ndarray], dict[str, dict]]:
    """Each engine's next-token log-probabilities after each prompt ([prompts, vocab]), from
    its worker at `threads`; and the engines that could not give them, with why."""
    logprobs, failed = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for w in workers:
            if w.threads != threads:
                continue
            path = str(Path(tmp) / f"{w.name}.npy")
            try:
                w.ask(op="logprobs", prompts=prompts, vocab=vocab, path=path)
                logprobs[w.name] = np.load(path).astype(np.float64)
            except RuntimeError as e:
                failed[w.name] = {"kl_error": str(e).splitlines()[0][:200]}
    return logprobs, failed


def _time(workers: list[Worker], bad: list[str], calls: list[dict], rounds: int,
          settle: int, block: int, nbytes: int, threads: list[int],
          skipped: dict[str, str] | None = None) -> tuple[dict, dict[int, float]]:
    """Seconds per call per worker, rounds interleaved (each round starting at the next
    worker), and per thread count the median of the read bandwidth of that many cores,
    measured once a round. A worker that dies meanwhile (the kernel's out-of-memory killer,
    as the long context's call grows an engine past what its start left room for) is that
    engine's result: recorded in `skipped`, its times dropped and it removed from `workers`;
    the others go on."""
    skipped = {} if skipped is None else skipped
    raw: dict[str, list[list[float]]] = {w.label: [[] for _ in calls] for w in workers
                                         if w.name not in bad and rounds}  # 0: nothing timed
    bandwidth: dict[int, list[float]] = {n: [] for n in threads}
    for r in range(rounds):
        order = workers[r % len(workers):] + workers[:r % len(workers)]
        for w in order:
            if w.name in bad:
                continue
            try:
                times = w.ask(op="time", calls=calls, settle=settle, block=block)["times"]
            except BenchError as e:
                if w.proc.poll() is None:  # alive: a real failure of the run
                    raise
                skipped[w.label] = f"died while timed in round {r + 1}: {e}" + (
                    " (SIGKILL: most likely the out-of-memory killer)"
                    if w.proc.returncode == -9 else "")
                workers.remove(w)
                raw.pop(w.label, None)
                continue
            for i, ts in enumerate(times):
                raw[w.label][i] += ts
            time.sleep(REST_S)
        for n in threads:
            bandwidth[n].append(analysis.read_bandwidth(nbytes, n))
    return raw, {n: statistics.median(b) for n, b in bandwidth.items() if b}
