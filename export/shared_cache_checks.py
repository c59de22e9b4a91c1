"""What the shared-cache variant is checked against before it is written
(export/shared_cache.py): its source artifact, through the runtime (ragged prompts, decode
steps, greedy tokens), and a pair's two graphs against the step graph's source."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from tinyt.contract import DECODER_WITH_PAST, SHARED_CACHE_KIND, compact_window_layers
from tinyt.errors import SharedCacheError
from tinyt.graphio import quantized_ops
from tinyt.runtime.cache import window_capacity
from tinyt.runtime.feeds import check_tokens, left_pad, prefill_feeds, window_tokens
from tinyt.runtime.session import UNFUSED, ort_options

from .compare import MAGNITUDE_FLOOR, first_difference, reorder_bound

# A quantized source quantizes activations to int8 at run time (MatMulNBits accuracy_level 4,
# DynamicQuantizeMatMul): the two layouts' fp32 rounding differs in the last bits (attention
# sums in another order), and now and then that moves an activation across an int8 rounding
# step, which the layers after it carry on. Those moves are a few of the roundings the
# quantization makes anyway, each of the same size, so together they move the logits less
# than the quantization itself does: the bound is the quantized source's own distance from the
# fp32 graph it was quantized from, on the same prompts and tokens, and at least quant_floor: an
# int8 level of the largest logit per block (where that graph is gone, the floor alone).
# A wrong rewrite (a mask, a rotary, a window) moves them by the model's whole logit range and
# fails either bound; in fp32 the rewrite is held to compare.reorder_bound. Measured: the demo
# INT8 graph 0.017 at worst, against INT8's own distance from fp32 of ~1; Qwen3-0.6B's shape
# with random weights (28 layers, logits' spread 0.64) 0.117, its source 0.278 from fp32 on the
# same steps (its qgemm form: 0.088 and 0.331).
QUANT_LEVEL = 1 / 127


def quant_floor(cfg, size: float) -> float:
    """The least a quantized rewrite may move logits of largest |value| `size`: every block
    (and the head) quantizes its activations, and a last-bit difference may flip one of its
    roundings, each moving the logits by about one int8 level of their size (at least 1: a
    random model's small logits come from hidden states of size ~1). The CPU's int8 path
    (AVX2 7-bit weights, VNNI, AMX) decides which roundings flip, not how many."""
    return (cfg.n_layer + 1) * QUANT_LEVEL * max(size, MAGNITUDE_FLOOR)


def fp32_lineage(src_dir: Path) -> Path | None:
    """The unquantized artifact a quantized one was made from, following the manifests'
    lineage, where it is still there as it was (its files unchanged); else None."""
    from tinyt.manifest import manifest_of

    source = (manifest_of(src_dir) or {}).get("source", {})
    for _ in range(32):
        if source.get("kind") != "artifact":
            return None
        made, path = source.get("manifest", {}), Path(source.get("path", ""))
        if "quantization" not in made:
            now = manifest_of(path)
            return path if now is not None and now.get("files") == made.get("files") else None
        source = made.get("source", {})
    return None


def check_against_source(src_dir: Path, path: Path, cfg, ops: set[str]) -> dict:
    """Ragged prompts, then decode steps: last-position logits of both graphs, and the
    runtime's greedy tokens. Prompts of at most check_tokens(cfg) / 2 tokens, whatever the
    context (the result's "sizes" says what ran)."""
    from tinyt.runtime import load

    ref = load(src_dir, threads=1)
    cand = _gqa_model(src_dir, path, cfg)
    # any quantized op (graphio.QUANTIZED_OPS): a qgemm-rows graph whose head is untied (or
    # left fp32) holds MatMulInteger and GatherBlockQuantized but no MatMulNBits
    quantized = bool(quantized_ops(ops))
    fp32_dir = fp32_lineage(src_dir) if quantized else None
    fp32 = None if fp32_dir is None else load(fp32_dir, threads=1)
    cases = _cases(cfg, ops)
    worst, quant, size = _step_differences(ref, cand, fp32, cfg, cases)
    atol = _tolerance(cfg, worst, quant, size, quantized, fp32_dir)
    prompts = [[1 + i % (cfg.vocab_size - 1) for i in range(n)] for n in (1, 5, 9)]
    n = min(16, cfg.block_size - 10)
    want = [r.token_ids for r in ref.generate_ids(prompts, max_new_tokens=n, min_new_tokens=n)]
    got = [r.token_ids for r in cand.generate_ids(prompts, max_new_tokens=n, min_new_tokens=n)]
    same = sum(a == b for g, w in zip(got, want) for a, b in zip(g, w))
    total = sum(map(len, want))
    ties = 0 if quantized else _fp32_ties(ref, cfg, prompts, got, want)
    return {"tolerance": atol, "logits_max_abs": worst, "logits_magnitude": size,
            "greedy_agreement": same / total,
            **({"quantization_vs_fp32_max_abs": quant, "fp32_source": str(fp32_dir)}
               if fp32_dir is not None else {}),
            "greedy_ties": ties,
            "sizes": {"longest_sequence": min(max(map(max, cases)) + 6, cfg.block_size),
                      "context": cfg.block_size, "batch": max(map(len, cases)),
                      "greedy_tokens": n}}


def _cases(cfg, ops: set[str]) -> list[list[int]]:
    """The prompt lengths of each batch check_against_source runs (one list a batch)."""
    # DynamicQuantizeMatMul quantizes activations with one scale per tensor, so the padding of
    # a batch moves its rows' results (left padding in the source, right padding here): such
    # a graph is compared on single prompts only.
    C = check_tokens(cfg)
    cases = [[C // 2]] + ([] if "DynamicQuantizeMatMul" in ops else [[3, C // 3, 1]])
    if (W := window_tokens(cfg)) is not None:  # past a window longer than C (Mistral's 4096)
        cases.append([W - 7])  # the window + 1 tokens, then the steps past it
    if compact_window_layers(cfg):  # the windowed layers' buffers fill during the steps and
        # keep their window (runtime/cache.py); the prompt, past the window, keeps it first
        end = window_capacity(cfg, cfg.block_size) - 3
        cases.append([min(end, cfg.block_size - 7)])
    return cases


def _step_differences(ref, cand, fp32, cfg, cases: list[list[int]]
                      ) -> tuple[float, float, float]:
    """Each case's random prompts, then up to 6 greedy steps (a row of a batch finishing
    after 2), through the source, the candidate and (where there is one) the fp32 artifact
    the source was quantized from: the candidate's largest difference from the source, the
    source's own from fp32 (0 without it), and the source's largest |logit|."""
    rng = np.random.default_rng(0)
    worst, quant = 0.0, 0.0  # the rewrite's difference; the quantization's own, from fp32
    size = 0.0  # the source's largest |logit|
    for lens in cases:
        B, T = len(lens), max(lens)
        ids, mask = left_pad([rng.integers(0, cfg.vocab_size, n).tolist() for n in lens])
        feeds = prefill_feeds(cfg, DECODER_WITH_PAST, ids, mask)
        a, b = ref.steps(dict(feeds), new_tokens=6), cand.steps(dict(feeds), new_tokens=6)
        f = None if fp32 is None else fp32.steps(dict(feeds), new_tokens=6)
        la, lb = next(a)[:, -1].copy(), next(b)[:, -1].copy()
        lf = None if f is None else next(f)[:, -1].copy()
        active, last = np.ones(B, bool), min(6, cfg.block_size - T - 1)  # steps of this case
        for step in range(last + 1):
            worst = max(worst, float(np.abs(la[active] - lb[active]).max()))
            size = max(size, float(np.abs(la[active]).max()))
            if lf is not None:
                quant = max(quant, float(np.abs(la[active] - lf[active]).max()))
            if step == last:
                break
            if step == 2 and B > 1:
                active[0] = False  # a finished row idles while the others go on
            nxt = la.argmax(-1)
            la = a.send((nxt, active.copy()))[:, -1].copy()
            lb = b.send((nxt, active.copy()))[:, -1].copy()
            if f is not None:
                lf = f.send((nxt, active.copy()))[:, -1].copy()
    return worst, quant, size


def _tolerance(cfg, worst: float, quant: float, size: float, quantized: bool,
               fp32_dir: Path | None) -> float:
    """The bound on the candidate's difference `worst` (QUANT_LEVEL's comment says why);
    SharedCacheError past it. fp32_dir: the fp32 artifact a quantized source came from
    (None: gone, or an fp32 source)."""
    level = quant_floor(cfg, size)
    atol = max(level, quant, reorder_bound(cfg, size)) if quantized else reorder_bound(cfg, size)
    if not worst <= atol:
        why = f": fp32 rounding at logits up to {size:.3g}" if not quantized else (
            f": the larger of an int8 level of the largest logit per block ({level:.3g}) and the "
            f"quantization's own distance from {fp32_dir} on the same steps, {quant:.3g}"
            if fp32_dir is not None else
            f": an int8 level of the largest logit per block ({level:.3g}); the fp32 artifact it "
            "was quantized from is not where its manifest says, so the quantization's own "
            "distance could not widen it")
        raise SharedCacheError(f"the shared-cache graph's logits differ from its source's by "
                               f"{worst:.3g} (allowed {atol:.3g}{why})")
    return atol


def _fp32_ties(ref, cfg, prompts: list[list[int]], got: list[list[int]],
               want: list[list[int]]) -> int:
    """An fp32 candidate's greedy tokens against the source's: the same, but for a tie at
    fp32 precision where they first differ (counted); SharedCacheError for any other
    difference."""
    ties = 0
    for prompt, g, w in zip(prompts, got, want):
        first = first_difference(g, w)
        if first is None:
            continue
        feeds = prefill_feeds(cfg, DECODER_WITH_PAST, np.array([prompt + w[:first]]),
                              np.ones((1, len(prompt) + first), np.int64))
        z = next(ref.steps(feeds))[0, -1]
        if not z[w[first]] - z[g[first]] <= 2 * reorder_bound(cfg, float(np.abs(z).max())):
            raise SharedCacheError(
                "the shared-cache graph generates other greedy tokens than its source: "
                f"{g} vs {w} (at token {first} the source prefers its own by "
                f"{z[w[first]] - z[g[first]]:.3g}, more than a tie at fp32 precision)")
        ties += 1
    return ties


def _gqa_model(src_dir: Path, path: Path, cfg, prefill: Path | None = None,
               prefill_quantization: dict | None = None):
    """A runtime LanguageModel on a converted graph (and a pair's prompt graph, beside it,
    with its quantization record), one thread: as rt.load opens the pair (prompts and the
    prompt positions' head through the prompt graph)."""
    from tinyt.manifest import Artifact, Manifest
    from tinyt.runtime.generate import LanguageModel
    from tinyt.runtime.session import open_artifact
    from tinyt.tokenizer import Tokenizer

    art = open_artifact(src_dir)
    data = {**art.manifest.data, "graph": SHARED_CACHE_KIND,
            "prefill_model_file": None if prefill is None else prefill.name,
            **({"prefill_quantization": prefill_quantization} if prefill_quantization else {})}
    art = Artifact(path.parent, cfg, Manifest.from_dict(data), art.block)
    opts = ort_options(level="all", threads=1)  # ONNX Runtime's default level: the checks' own
    sessions = [None if p is None else ort.InferenceSession(
        str(p), opts, providers=["CPUExecutionProvider"], disabled_optimizers=UNFUSED)
        for p in (path, prefill)]
    return LanguageModel(art, sessions[0], Tokenizer.from_file(src_dir / "tokenizer.json"),
                         prefill_session=sessions[1])


def check_pair(src_dir: Path, path: Path, prefill: Path, cfg,
               prefill_quantization: dict | None = None) -> dict:
    """The pair (prompt graph + step graph on one cache) against the step graph's source, on
    held-out-like prompts: greedy agreement and the worst logits difference. The two graphs
    are two quantizations of one checkpoint (the lineage check above), each checked against
    its own source; how far apart their quantizations put them is reported (demo INT8 pair:
    0.085; an INT4 step graph with INT8 prompts, more), not bounded here."""
    from tinyt.runtime import load

    ref, pair = load(src_dir, threads=1), _gqa_model(src_dir, path, cfg, prefill,
                                                      prefill_quantization)
    rng = np.random.default_rng(1)
    worst, same, total = 0.0, 0, 0
    C = check_tokens(cfg)
    for n in (C // 4, C // 2):
        ids = rng.integers(0, cfg.vocab_size, (1, n))
        feeds = prefill_feeds(cfg, DECODER_WITH_PAST, ids, np.ones_like(ids))
        a, b = ref.steps(dict(feeds), new_tokens=8), pair.steps(dict(feeds), new_tokens=8)
        la, lb = next(a)[:, -1].copy(), next(b)[:, -1].copy()
        for _ in range(min(8, cfg.block_size - n - 1)):
            worst = max(worst, float(np.abs(la - lb).max()))
            same += int(la.argmax() == lb.argmax())
            total += 1
            nxt = la.argmax(-1)
            la, lb = a.send((nxt, np.ones(1, bool)))[:, -1].copy(), \
                b.send((nxt, np.ones(1, bool)))[:, -1].copy()
    return {"logits_max_abs": worst, "top1_agreement": same / total,
            "sizes": {"longest_sequence": min(C // 2 + 8, cfg.block_size),
                      "context": cfg.block_size}}
