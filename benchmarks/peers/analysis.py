"""From the workers' answers to the figures: greedy agreement and KL against tinyt fp32, decode
and prefill times per engine, the memory floor of a decode step, and tinyt against the fastest
peer (the targets).

    decode ms/token = (t(prompt, N new) - t(prompt, 1 new)) / (N - 1)
    prefill ms      = t(L-token prompt, 1 new token)
    floor ms        = (int8 weight bytes + fp32 KV bytes at the mean past) / the read rate of
                      as many cores as the engine's threads
"""
from __future__ import annotations

import math
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from tinyt.contract import kv_shape

from .engines import ENGINES, REFERENCE, TINYT

TARGETS = {"decode_vs_fastest_peer_max": 0.8, "prefill_vs_fastest_peer_max": 1.0,
           "outside_run_us_per_token_max": 10.0}


def agreement(tokens: dict[str, list[list[int]]]) -> dict[str, dict]:
    """Per engine: greedy tokens equal to the reference's, position by position, and whether
    they equal the engine's they must (fp32 engines the reference's, GenAI on tinyt's graph
    tinyt's)."""
    ref = tokens.get(REFERENCE)
    out = {}
    for name, seqs in tokens.items():
        entry: dict[str, Any] = {}
        if ref is not None:
            same = sum(a == b for s, r in zip(seqs, ref) for a, b in zip(s, r))
            total = sum(len(r) for r in ref)
            entry.update(agreement_with_fp32=same / total, matching_tokens=same,
                         tokens=total)
        row = ENGINES.get(name)
        target = None if row is None else (REFERENCE if row.exact else row.same_as)
        if target is not None and target in tokens:
            entry.update(must_equal=target, identical_to=seqs == tokens[target])
        out[name] = entry
    return out


def refused_with(agreement: dict[str, dict], mismatched: list[str]) -> dict[str, str]:
    """The peers' quantizations of a model refused in this run, {engine: the refused fp32
    engine}: where a tool's fp32 build gives other tokens than tinyt fp32 (`mismatched`), its
    int8 / int4 builds quantize that other model, so their times and agreement are not those of
    tinyt's model and are not timed either. (A run without the tool's fp32 engine cannot tell:
    the run that proved it can.)"""
    return {name: ENGINES[name].quantizes for name in agreement
            if name in ENGINES and ENGINES[name].quantizes in mismatched}


def kl_vs_reference(logprobs: dict[str, np.ndarray]) -> dict[str, dict]:
    """KL(tinyt fp32 || engine) of the next token after each prompt ([prompts, vocab]
    log-probabilities per engine), mean and max over the prompts, in nats: how far each
    engine's distribution is from the fp32 model's, beyond its argmax."""
    # Each engine's float32 log-softmax sums to 1 only within its rounding (~1e-7), which can
    # put a KL of two near-equal distributions a few 1e-9 below zero: renormalized in float64
    # the sum is >= 0 up to float64 rounding (~1e-15), and that residue is clamped.
    logprobs = {k: v.astype(np.float64) for k, v in logprobs.items()}
    logprobs = {k: v - np.logaddexp.reduce(v, axis=-1, keepdims=True)
                for k, v in logprobs.items()}
    ref = logprobs.get(REFERENCE)
    out = {}
    for name, lp in logprobs.items():
        if ref is not None:
            kl = np.maximum((np.exp(ref) * (ref - lp)).sum(-1), 0.0)
            out[name] = {"kl_vs_fp32": float(kl.mean()), "kl_vs_fp32_max": float(kl.max())}
    return out


def rows(raw: dict, plan: dict, bandwidth: dict[int, float], nbytes: int) -> dict:
    """Per engine: decode ms per token (and × the memory floor at its thread count's read
    `bandwidth`, bytes/s by threads), prefill ms per length."""
    out = {}
    n = plan["decode_new"]
    for label, per_call in raw.items():
        med = [statistics.median(ts) * 1e3 for ts in per_call]
        decode = (med[1] - med[0]) / (n - 1)
        out[label] = {"decode_ms_per_token": decode,
                      **{f"prefill_{L}_ms": med[2 + i] for i, L in enumerate(plan["prefills"])},
                      "first_token_ms": med[0], "generate_ms": med[1]}
        N = plan.get("long_context")
        if N:  # the two calls after the prefills: a prompt of N - n tokens, then 1 new, then
            # n new timed per step inside the engine's loop
            at = 2 + len(plan["prefills"])
            out[label][f"decode_at_{N}_ms_per_token"] = med[at + 1]
            out[label][f"first_token_at_{N}_ms"] = med[at]
        threads = int(label.rsplit("@", 1)[1][:-1])  # "engine@2t"
        if bandwidth.get(threads):
            out[label]["decode_x_floor"] = decode / (nbytes / bandwidth[threads] * 1e3)
    return out


def targets(result: dict) -> dict[str, Any]:
    """tinyt's best against the fastest peer, per thread count and measurement (ratios of
    times: < 1 is tinyt faster)."""
    timed, out = result["rows"], {}
    for n in result["method"]["threads"]:
        at = {k.rsplit("@", 1)[0]: v for k, v in timed.items() if k.endswith(f"@{n}t")}
        peers = {k: v for k, v in at.items() if k not in TINYT}
        ours = {k: v for k, v in at.items() if k in TINYT}
        if not peers or not ours:
            continue
        keys = time_keys(result["method"])
        for key in keys:
            # a decode is a difference of two times; where one came out <= 0, the calls' noise
            # exceeded the decode itself: that engine has no figure, it is not the fastest
            bad = sorted(f"{k}@{n}t" for k, v in at.items() if not v[key] > 0)
            if bad:
                out[f"{key}@{n}t"] = {"unmeasured": bad, "met": None}
                continue
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


def time_keys(method: dict) -> list[str]:
    """The timed measurements of a run's rows, each a target: decode, the prefills, and the
    decode at the long context where one was asked for."""
    N = method.get("long_context")
    return (["decode_ms_per_token"] + [f"prefill_{L}_ms" for L in method["prefill_tokens"]]
            + ([f"decode_at_{N}_ms_per_token"] if N else []))


def step_bytes(cfg) -> int:
    """Bytes of int8 weights a decode step reads: every layer's matrices (q and the output
    projection C x q_width — C x C unless head_dim says otherwise, as Qwen3's — k and v C x
    (one position's keys) each; the MLP's two matrices, three for SwiGLU) and the lm_head (the
    embedding lookup reads one row)."""
    C, kv = cfg.n_embd, math.prod(kv_shape(cfg, 1, 1))  # kv: kv_heads * head_dim
    mlp = (3 if cfg.gated_mlp else 2) * C * cfg.mlp_width
    return cfg.n_layer * (2 * C * cfg.q_width + 2 * C * kv + mlp) + C * cfg.vocab_size


def cache_bytes(cfg, past: float) -> int:
    """Bytes of the fp32 KV cache a decode step reads after `past` tokens (every layer's keys
    and values, n_kv_head heads: one-row attention streams them, as the matmuls stream the
    weights)."""
    return int(cfg.kv_cache_bytes_per_token() * past)


def floor_bytes(cfg, plan: dict) -> int:
    """What one decode step of the timed generation reads, on average over its steps."""
    return step_bytes(cfg) + cache_bytes(cfg, plan["decode_prompt"] + plan["decode_new"] / 2)


def memory_floor(cfg, plan: dict, bandwidth: dict[int, float]) -> dict | None:
    """The decode step's memory floor at each thread count's read `bandwidth` (bytes/s)."""
    if not bandwidth:
        return None
    nbytes = floor_bytes(cfg, plan)
    return {"int8_weight_bytes": step_bytes(cfg), "kv_cache_bytes": nbytes - step_bytes(cfg),
            "read_gb_per_s": {str(n): b / 1e9 for n, b in sorted(bandwidth.items())},
            "decode_ms": {str(n): nbytes / b * 1e3 for n, b in sorted(bandwidth.items())}}


def read_bandwidth(nbytes: int, threads: int = 1, repeats: int = 5) -> float:
    """The read bandwidth of `threads` cores in bytes/s: numpy summing a buffer of `nbytes`
    (as large as a model's weights, past the caches) viewed as int64, one contiguous part per
    thread, all at once (numpy's reduction lets go of the GIL); the best of `repeats`."""
    buf = np.ones(max(nbytes // 8, threads), dtype=np.int64)
    parts = np.array_split(buf, threads)
    best = math.inf
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(repeats):
            t = time.perf_counter()
            list(pool.map(np.sum, parts))
            best = min(best, time.perf_counter() - t)
    return buf.nbytes / best
