"""Per-phase choices a shared-cache artifact makes on the machine that runs it (torch-free).

A prompt pass and a decode step want different things. A prompt is a few large matmuls: they
scale with threads and gain from int8 GEMMs (the pair's prompt graph). A step at batch 1 of a
small model is dozens of tiny ops, and a second thread can cost more to wake than it saves;
of a large model, a stream through every weight, whose speed depends on how the CPU's int8
kernel reads memory. Which wins depends on the model and on the CPU the artifact runs on, not
the one it was built on. So `rt.load` (CPU, tune=True) decides at load, within the thread
budget, among every graph the artifact carries:

    decode  {step graph, prompt graph} x {1 thread, `threads`}          (timed)
    prompt  the prompt graph  vs  the step graph, both at `threads`      (timed)

The step graph's weights are MatMulNBits (8-bit blocks, int8 activations); the pair's prompt
graph's are DynamicQuantizeMatMul (int8 per channel, ONNX Runtime's int8 GEMM: AMX, VNNI or
AVX2 by CPU). At one row the two read memory differently: on an Intel Xeon with AMX, steps
of the GPT-2-small shape run 11-13% faster through the GEMM graph; other CPUs may differ
either way, which is why it is timed (lab/step_kernels.py measures every kernel
against the memory floor).

Before any timing, two rules. A prompt graph whose int8 GEMMs would saturate on this CPU
(8-bit u8 x s8 weights on x86 without VNNI / AMX, which adds pairs of products in 16 bits: the
manifest's int8 record against tinyt.hardware.u8s8_exact) is not run; every phase then runs
the step graph. And speed is not bought with accuracy: the prompt graph is a decode candidate
only when its quantization stage's accuracy report (KL divergence from fp32 on the same text)
is at most the step graph's (an INT4 pair's int8 prompt graph; not an INT8 pair's, whose
per-tensor activation scales cost more than the step graph's blocks of 64). tune="speed"
times it anyway, and the plan's reasons say which was left out and why.

A graph's weights are held once: every session pre-packs its own copy of them (ONNX Runtime's
Python API shares no pre-packed weights between sessions), so under tune=True steps that would
run on a second session of the graph that runs the prompts (a one-graph artifact at 1 thread
beside prompts at `threads`) join the prompts' session; tune="speed" keeps both and says so.

Candidates are timed two at a time, the choice so far against the next candidate, in
interleaved rounds (median of each); the challenger replaces the choice only when it is at
least MARGIN faster, so noise does not flip a choice. Only the two sessions of a match are
open: each holds its graph's weights, so the load's peak stays near what the pair keeps.
The defaults: prompts through the prompt graph (made for them), decode through the step
graph (made for it) at 1 thread (a thread that does not buy MARGIN is not spent: the core
stays free for the application). LanguageModel.plan keeps the choice, the reasons, the
times and each match. Which graph decodes decides the quantization a token is computed
with, so generations may differ between CPU kinds as INT8 graphs differ from each other;
`tune=False` fixes every choice.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import onnxruntime as ort

from tinyt.errors import ConfigError

from .cache import SharedCache
from .session import Artifact, create_session, int8_refusal

T = TypeVar("T")
MARGIN = 0.05  # a candidate replaces the default when at least 5% faster
ROUNDS = 3  # interleaved rounds per measurement
DECODE_STEPS = 6  # timed decode steps per round (after a short prompt)
PROMPT_TOKENS = 64  # tokens of the timed prompt (at most the context less one)


@dataclass
class Plan:
    """What a shared-cache model runs each phase with, and why."""
    decode_graph: str  # a file of the artifact: model.onnx (the step graph) or prefill.onnx
    decode_threads: int
    prompt_graph: str  # prefill.onnx (int8 GEMMs) or model.onnx
    prompt_threads: int
    tuned: bool  # False: the defaults, nothing was timed
    reasons: list[str] = field(default_factory=list)
    measured_ms: dict[str, float] = field(default_factory=dict)  # candidate -> median
    # each timed match: {"ms": candidate -> median, "default": the choice so far, "kept": ...}
    matches: list[dict] = field(default_factory=list)

    def describe(self) -> str:
        return (f"decode: {self.decode_graph} at {self.decode_threads} thread(s); prompts: "
                f"{self.prompt_graph} at {self.prompt_threads} thread(s)"
                + ("" if not self.reasons else " (" + "; ".join(self.reasons) + ")"))


def prompt_graph_allowed(artifact: Artifact, features: dict | None = None) -> str | None:
    """None if this CPU may run the pair's prompt graph, else why not: its int8 GEMMs would
    saturate here (int8_refusal), or its quantization costs more perplexity than the INT8
    budget and than the step graph's (its report against the step graph's: a prompt's
    tokens would be scored and continued by a worse model)."""
    if artifact.prefill_file is None:
        return None
    why = int8_refusal(artifact.manifest, artifact.prefill_file, features) or \
        _beyond_budget(artifact)
    return why and f"{why}; prompts and steps run through the step graph instead"


def _perplexity_change(report: dict | None) -> float | None:
    if not report or "val_loss" not in report:
        return None
    if "perplexity_change" in report:
        return report["perplexity_change"]
    return math.expm1(report["val_loss"] - report["val_loss_reference"])


def _beyond_budget(artifact: Artifact) -> str | None:
    from tinyt.artifacts import INT8_PERPLEXITY_BUDGET

    manifest = artifact.manifest
    prompt = _perplexity_change(manifest.record("prefill_accuracy"))
    step = _perplexity_change(manifest.source_accuracy or manifest.accuracy) or 0.0
    if prompt is None or prompt <= max(INT8_PERPLEXITY_BUDGET, step):
        return None
    return (f"prompts: {artifact.prefill_file} not run: its quantization costs perplexity "
            f"{100 * prompt:+.2f}%, beyond the +{100 * INT8_PERPLEXITY_BUDGET:.1f}% budget and "
            f"the step graph's {100 * step:+.2f}%")


def check_tune(tune) -> None:
    """ConfigError unless tune is True, False or "speed"."""
    if not (isinstance(tune, bool) or tune == "speed"):
        raise ConfigError(f"tune={tune!r} is not one of True (time each phase, keeping "
                          "accuracy), 'speed' (time every graph) or False (no timing)")


def decode_accuracy_refusal(artifact: Artifact) -> str | None:
    """None if the pair's prompt graph computes a token at least as accurately as its step
    graph (so the tuner may decode through it), else why not: their quantization stages'
    accuracy reports (KL divergence from fp32 over the same text), an unquantized step graph
    counting as exact."""
    manifest, step, prompt = artifact.manifest, artifact.model_file, artifact.prefill_file
    # a shared-cache artifact's "accuracy" is its own (runtime_lm_accuracy); its step graph's
    # quantization report is kept as "source_accuracy"
    step_report = manifest.source_accuracy or manifest.accuracy
    prompt_report = manifest.prefill_accuracy
    if step_report is None and manifest.quantization is None:
        step_report = {"kl_divergence": 0.0}  # fp32 steps: the reference itself
    if not (step_report and prompt_report and "kl_divergence" in step_report
            and "kl_divergence" in prompt_report):
        return (f"decode: {prompt} not timed: the manifest has no accuracy report to compare "
                f"with {step}'s (tune='speed' times it anyway)")
    same = ("data", "tokens", "window")
    if "data" in step_report and any(step_report.get(k) != prompt_report.get(k) for k in same):
        return (f"decode: {prompt} not timed: its accuracy report and {step}'s were measured "
                f"on different text (tune='speed' times it anyway)")
    kl_step, kl_prompt = step_report["kl_divergence"], prompt_report["kl_divergence"]
    if kl_prompt > kl_step:
        return (f"decode: {prompt} not timed: its tokens are less accurate than {step}'s (KL "
                f"from fp32 {kl_prompt:.2g} against {kl_step:.2g}; tune='speed' times it "
                "anyway)")
    return None


def plan_sessions(artifact: Artifact, *, threads: int, spinning: bool | None,
                  level: str | None, tune: bool | str, features: dict | None = None
                  ) -> tuple[Plan, ort.InferenceSession, ort.InferenceSession]:
    """The plan, the decode session and the prompt session (possibly the same one); threads
    is the budget, checked and defaulted already (session.resolve_threads, in rt.load);
    tune: True (the fastest of the candidates at least as accurate as the defaults), "speed"
    (the fastest of all) or False (the defaults, nothing timed).

    Candidates are timed two at a time (the choice so far against the next one), and a
    session no match needs is closed before the next opens: each session holds its graph's
    weights, so the load's peak is two sessions, about what the pair then holds (at the
    Llama-3.2-1B shape, an INT4 pair at 2 threads peaked at 7.9 GB with every candidate open,
    2.8x the 2.8 GB it kept)."""
    check_tune(tune)
    pool = _Sessions(artifact, spinning=spinning, level=level)
    step_file = artifact.model_file
    refused = None if artifact.prefill_file is None else prompt_graph_allowed(artifact, features)
    prompt_file = artifact.prefill_file if artifact.prefill_file and not refused else step_file
    plan = Plan(step_file, threads, prompt_file, threads, tuned=False,
                reasons=[refused] if refused else [])

    def decode_key(c: tuple[str, int]) -> tuple[str, int, str]:  # steps at `threads` on the
        # step graph share a session with prompts through it
        return (*c, "any" if c == (step_file, threads) else "step")

    def prompt_key(graph: str, steps: tuple[str, int] | None = None) -> tuple[str, int, str]:
        # timing (steps None): prompts through the step graph share its "any" session; for
        # good, only where the steps run on that session too
        shared = graph == step_file and steps in (None, (step_file, threads))
        return (graph, threads, "any" if shared else "prompt")

    if not tune:
        steps = (step_file, threads)
        return plan, pool.get(decode_key(steps)), pool.get(prompt_key(prompt_file, steps))
    decoders = [step_file, prompt_file]  # every graph this CPU may run...
    if prompt_file != step_file and tune != "speed":  # ...and, unless told, no less accurate
        worse = decode_accuracy_refusal(artifact)
        if worse:
            decoders.remove(prompt_file)
            plan.reasons.append(worse)
    candidates = [(g, n) for g in dict.fromkeys(decoders) for n in sorted({1, threads})]
    prompts = list(dict.fromkeys([prompt_file, step_file]))
    champion = candidates[0]  # the default: the step graph at 1 thread
    if len(candidates) == 1 and len(prompts) == 1:  # nothing to choose between
        session = pool.get(decode_key(champion))
        return plan, session, session
    for challenger in candidates[1:]:
        pool.keep(decode_key(champion))
        times = _measure(artifact, {c: pool.get(decode_key(c)) for c in (champion, challenger)},
                         {})
        won = _choose(champion, {c: times[_decode_key(*c)] for c in (champion, challenger)})
        plan.matches.append(_match(times, _decode_key(*champion), _decode_key(*won)))
        champion = won
    best_prompt = prompt_file
    if len(prompts) > 1:  # the choice of steps is closed unless it is a prompt candidate too
        pool.keep(*(prompt_key(g) for g in prompts))
        times = _measure(artifact, {}, {g: pool.get(prompt_key(g)) for g in prompts})
        best_prompt = _choose(prompt_file, {g: times[f"prompt:{g}"] for g in prompts})
        plan.matches.append(_match(times, f"prompt:{prompt_file}", f"prompt:{best_prompt}"))
    if champion[0] == best_prompt and champion[1] != threads and tune != "speed":
        # one graph, two sessions: each packs its own copy of the weights (ONNX Runtime's
        # Python API shares no pre-packed weights), so the steps join the prompts' session
        plan.reasons.append(
            f"memory: steps at {champion[1]} thread(s) measured faster, but beside prompts at "
            f"{threads} they would hold {best_prompt}'s weights twice: steps at {threads} on "
            "the prompts' session (tune='speed' holds them twice)")
        champion = (champion[0], threads)
    _settle(plan, champion, best_prompt, step_file, prompt_file, threads)
    # prompts through the step graph at `threads`, steps elsewhere: its workers must not spin
    # after a prompt while the other session decodes (a "prompt" session, opened now)
    final = decode_key(champion), prompt_key(best_prompt, champion)
    if final[0] != final[1] and final[0][0] == final[1][0]:  # one graph, two sessions
        plan.reasons.append(
            f"memory: {final[0][0]} is held twice (steps at {champion[1]} thread(s), prompts at "
            f"{threads}): each session packs its own copy of the weights; tune=True holds "
            "them once")
    pool.keep(*final)
    return plan, pool.get(final[0]), pool.get(final[1])


def _settle(plan: Plan, champion: tuple[str, int], best_prompt: str, step_file: str,
            prompt_file: str, threads: int) -> None:
    """The tuned plan: its choices, the times measured, and why each default was left."""
    for m in plan.matches:
        plan.measured_ms |= m["ms"]
    plan.tuned = True
    (plan.decode_graph, plan.decode_threads), plan.prompt_graph = champion, best_prompt
    if champion[0] != step_file:
        plan.reasons.append(f"decode: {champion[0]} measured at least {MARGIN:.0%} faster "
                            f"than {step_file} on this CPU")
    if champion[1] != threads:
        plan.reasons.append(f"decode: {threads} threads measured less than {MARGIN:.0%} faster "
                            f"than {champion[1]} on this CPU")
    if best_prompt != prompt_file:
        plan.reasons.append(f"prompts: {best_prompt} measured faster than {prompt_file} on this "
                            "CPU")


class _Sessions:
    """The tuner's sessions by (graph, threads, phase): opened when asked for, closed by
    keep() as soon as nothing ahead needs them."""

    def __init__(self, artifact: Artifact, *, spinning: bool | None, level: str | None):
        self.artifact, self.spinning, self.level = artifact, spinning, level
        self.open: dict[tuple[str, int, str], ort.InferenceSession] = {}

    def get(self, key: tuple[str, int, str]) -> ort.InferenceSession:
        if key not in self.open:
            graph, n, phase = key
            self.open[key] = create_session(self.artifact, threads=n, spinning=self.spinning,
                                            level=self.level, graph=graph, phase=phase)
        return self.open[key]

    def keep(self, *keys: tuple[str, int, str]) -> None:
        for key in [k for k in self.open if k not in keys]:
            del self.open[key]  # the last reference: ONNX Runtime frees its weights now


def _match(times: dict[str, float], default: str, kept: str) -> dict:
    return {"ms": {k: round(v * 1e3, 4) for k, v in times.items()}, "default": default,
            "kept": kept}


def _decode_key(graph: str, threads: int) -> str:
    return f"decode:{graph}@{threads}"


def _choose(default: T, medians: dict[T, float]) -> T:
    """The fastest candidate if it beats the default by MARGIN, else the default."""
    best = min(medians, key=lambda c: medians[c])
    return best if medians[best] < (1 - MARGIN) * medians[default] else default


def _measure(artifact: Artifact, decode: dict, prompt: dict) -> dict[str, float]:
    """Median seconds: per decode step for each (graph, threads) decode session, per prompt
    pass for each prompt graph; rounds interleaved across the candidates."""
    cfg = artifact.config
    n_prompt = max(1, min(PROMPT_TOKENS, cfg.block_size - 1))
    n_short = max(1, min(16, cfg.block_size - DECODE_STEPS - 1))
    capacity = max(n_prompt, n_short + DECODE_STEPS) + 1
    ids = (np.arange(n_prompt, dtype=np.int64) * 7919 % cfg.vocab_size).tolist()
    caches = {_decode_key(*c): SharedCache(s, cfg, 1, capacity) for c, s in decode.items()}
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
