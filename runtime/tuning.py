"""Per-phase choices a shared-cache artifact makes on the machine that runs it (torch-free).

A prompt pass and a decode step want different things. A prompt is a few large matmuls: they
scale with threads and gain from int8 GEMMs (the pair's prompt graph). A step at batch 1 of a
small model is dozens of tiny ops, and a second thread can cost more to wake than it saves;
of a large model, a stream through every weight that a second core speeds up. Which wins
depends on the model and on the CPU the artifact runs on, not the one it was built on. So
`rt.load` (CPU, tune=True) decides at load, within the thread budget:

    decode  the step graph at 1 thread  vs  at `threads`            (timed)
    prompt  the prompt graph            vs  the step graph, both at `threads`   (timed)

Before any timing, one rule: a prompt graph whose int8 GEMM weights use the full 8 bits is
not run on x86 without VNNI / AMX, whose u8 x s8 products add pairs in 16 bits that can
saturate (tinyt.hardware.int8_preset); prompts then go through the step graph.

Candidates run in interleaved rounds (median of each); one replaces the default only when it
is at least MARGIN faster, so noise does not flip a choice. The defaults: prompts through the
prompt graph (made for them), decode at 1 thread (a thread that does not buy MARGIN is not
spent: the core stays free for the application). LanguageModel.plan keeps the choice, the reasons and the times.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import onnxruntime as ort

from tinyt.hardware import int8_preset

from .gqa import SharedCache
from .session import Artifact, create_session

MARGIN = 0.05  # a candidate replaces the default when at least 5% faster
ROUNDS = 3  # interleaved rounds per measurement
DECODE_STEPS = 6  # timed decode steps per round (after a short prompt)
PROMPT_TOKENS = 64  # tokens of the timed prompt (at most the context less one)


@dataclass
class Plan:
    """What a shared-cache model runs each phase with, and why."""
    decode_threads: int
    prompt_graph: str  # a file of the artifact: prefill.onnx (int8 GEMMs) or model.onnx
    prompt_threads: int
    tuned: bool  # False: the defaults, nothing was timed
    reasons: list[str] = field(default_factory=list)
    measured_ms: dict[str, float] = field(default_factory=dict)  # candidate -> median

    def describe(self) -> str:
        return (f"decode: {self.decode_threads} thread(s); prompts: {self.prompt_graph} at "
                f"{self.prompt_threads} thread(s)"
                + ("" if not self.reasons else " (" + "; ".join(self.reasons) + ")"))


def prompt_graph_allowed(artifact: Artifact, features: dict | None = None) -> str | None:
    """None if this CPU may run the pair's prompt graph, else why not."""
    preset = int8_preset(features)
    if artifact.prefill_file is None or not preset["reduce_range"]:
        return None  # no prompt graph, or a CPU whose int8 products do not saturate
    options = artifact.manifest.get("prefill_source", {}).get("manifest", {}).get("options")
    if options is not None:
        u8s8 = options.get("kernel") == "qgemm" or options.get("mode") == "static"
        if not u8s8 or options.get("reduce_range") is True:
            return None  # MatMulNBits or fp32 products, or 7-bit weights made for such a CPU
    return (f"{artifact.prefill_file}'s int8 GEMM weights use 8 bits (or its manifest does not "
            f"say), and this CPU ({preset['preset']}: no VNNI / AMX) adds u8 x s8 products in "
            "16 bits that can saturate; prompts run through the step graph instead")


def plan_sessions(artifact: Artifact, *, threads: int, spinning: bool | None,
                  level: str | None, tune: bool, features: dict | None = None
                  ) -> tuple[Plan, ort.InferenceSession, ort.InferenceSession]:
    """The plan, the decode session and the prompt session (possibly the same one)."""
    open_ = lambda graph, n, phase: create_session(  # noqa: E731
        artifact, threads=n, spinning=spinning, level=level, graph=graph, phase=phase)
    step_file = artifact.model_file
    refused = None if artifact.prefill_file is None else prompt_graph_allowed(artifact, features)
    prompt_file = artifact.prefill_file if artifact.prefill_file and not refused else step_file
    plan = Plan(threads, prompt_file, threads, tuned=False, reasons=[refused] if refused else [])
    decode = {threads: open_(step_file, threads, "any")}  # steps, and prompts if they go there
    prompt = {prompt_file: decode[threads] if prompt_file == step_file
              else open_(prompt_file, threads, "prompt")}
    if not tune:
        return plan, decode[threads], prompt[prompt_file]
    if threads > 1:
        decode[1] = open_(step_file, 1, "step")
    if prompt_file != step_file:
        prompt[step_file] = decode[threads]
    if len(decode) == 1 and len(prompt) == 1:
        return plan, decode[threads], prompt[prompt_file]
    times = _measure(artifact, decode, prompt)
    plan.tuned, plan.measured_ms = True, {k: round(v * 1e3, 4) for k, v in times.items()}
    # a thread that does not buy MARGIN is not spent: more threads must win by it
    best_threads = _choose(min(decode), {n: times[f"decode@{n}"] for n in decode})
    best_prompt = _choose(prompt_file, {g: times[f"prompt:{g}"] for g in prompt})
    plan.decode_threads, plan.prompt_graph = best_threads, best_prompt
    if best_threads != threads:
        plan.reasons.append(f"decode: {threads} threads measured less than {MARGIN:.0%} faster "
                            f"than {best_threads} on this CPU")
    if best_prompt != prompt_file:
        plan.reasons.append(f"prompts: {best_prompt} measured faster than {prompt_file} on this "
                            "CPU")
    step_session, prompt_session = decode[best_threads], prompt[best_prompt]
    if prompt_session is decode[threads] and step_session is not prompt_session:
        # prompts through the step graph at `threads`, steps elsewhere: its workers must not
        # spin after a prompt while the other session decodes
        prompt_session = open_(step_file, threads, "prompt")
    return plan, step_session, prompt_session


def _choose(default, medians: dict) -> object:
    """The fastest candidate if it beats the default by MARGIN, else the default."""
    best = min(medians, key=medians.get)
    return best if medians[best] < (1 - MARGIN) * medians[default] else default


def _measure(artifact: Artifact, decode: dict, prompt: dict) -> dict[str, float]:
    """Median seconds: per decode step for each decode session, per prompt pass for each
    prompt graph; rounds interleaved across the candidates."""
    cfg = artifact.config
    n_prompt = max(1, min(PROMPT_TOKENS, cfg.block_size - 1))
    n_short = max(1, min(16, cfg.block_size - DECODE_STEPS - 1))
    capacity = max(n_prompt, n_short + DECODE_STEPS) + 1
    ids = (np.arange(n_prompt, dtype=np.int64) * 7919 % cfg.vocab_size).tolist()
    caches = {f"decode@{n}": SharedCache(s, cfg, 1, capacity) for n, s in decode.items()}
    caches |= {f"prompt:{g}": SharedCache(s, cfg, 1, capacity) for g, s in prompt.items()}
    samples: dict[str, list[float]] = {k: [] for k in caches}
    nxt, active = np.array([ids[0]]), np.array([True])
    for _ in range(ROUNDS + 1):  # the first round warms up and is not kept
        for key, cache in caches.items():
            if key.startswith("decode"):
                cache.prefill([ids[:n_short]], 0)
                t = time.perf_counter()
                for _ in range(DECODE_STEPS):
                    cache.step(nxt, active)
                samples[key].append((time.perf_counter() - t) / DECODE_STEPS)
            else:  # twice: the first absorbs workers another session left spinning
                cache.prefill([ids], 0)
                t = time.perf_counter()
                cache.prefill([ids], 0)
                samples[key].append(time.perf_counter() - t)
    return {k: float(np.median(v[1:])) for k, v in samples.items()}
