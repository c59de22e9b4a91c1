"""Verification: PyTorch vs ONNX Runtime on a grid of shapes, and greedy generation.

For each (batch, sequence, past length) case and each input source (random ids, real corpus
text, a left-padded batch), both run the same inputs (a past cache made by PyTorch from the
same prefix) and every output is compared: max abs diff, max rel diff, and for logits top-1
agreement. Then greedy generation from several prompts must give identical tokens.

The grid's sequences are at most runtime.feeds.check_tokens(cfg) long (128 for computed
positions), whatever the context: a 131,072-token model verifies in what a 128-token one
takes. Where the context is longer, cases with a past also run at its end (positions up to
block_size - 1, a short past made by PyTorch at those positions), where a rotary cache or
position table wrong only at high positions shows. The report's "sizes" says what ran.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch

from tinyt import data as D
from tinyt.checkpoint import load_checkpoint
from tinyt.config import ModelConfig
from tinyt.contract import (
    CLASSIFIER,
    DECODER,
    DECODER_WITH_PAST,
    ENCODER,
    ONNX_FILE,
    SEQ2SEQ,
    SHARED_CACHE_KIND,
    TOKEN_CLASSIFIER,
    contract_for,
    past_names,
)
from tinyt.errors import TinytError, VerificationError
from tinyt.fsutil import write_json
from tinyt.manifest import load_manifest
from tinyt.model import generate
from tinyt.runtime.feeds import check_tokens, left_pad, prefill_feeds, window_tokens
from tinyt.runtime.fixed import capacity
from tinyt.runtime.session import graph_session

from .compare import (
    TIE_FACTOR,
    first_difference,
    max_abs,
    ort_greedy,
    reorder_bound,
    row_chunks,
)

# fp32 export vs PyTorch: the same fp32 arithmetic, summed in other orders by ONNX Runtime's
# kernels (MLAS) and PyTorch's (oneDNN / MKL), each picking its code path by CPU (AVX2,
# AVX-512, AMX). Each output is held to compare.reorder_bound: fp32 rounding grown with the
# model's depth and widest reduction, relative to the output's largest |value| (real
# SmolLM2-135M's logits reach ~40: a constant set on random weights refused it). An export
# that is wrong (a mask, a position, a transposed weight) moves outputs by a good part of
# their size. Greedy tokens: a tie within compare.TIE_FACTOR x the bound may go either way.
GEN_TOKENS = 64  # greedy tokens per prompt (capped by block_size)
PROMPTS = ("def ", "import os\n", "class Config:\n    def __init__(self", "    return ")


def vocab_limit(tokenizer, cfg: ModelConfig) -> int | None:
    """The tokenizer's size where the model's vocabulary is padded beyond it, else None."""
    return tokenizer.vocab_size if tokenizer.vocab_size < cfg.vocab_size else None


def greedy_generation(model, tokenizer, context: int, gen_tokens: int,
                      ours: Callable[[list[int], int], list[int]],
                      failures: list[str]) -> list[dict[str, Any]]:
    """PyTorch's greedy tokens against `ours(prompt, n)`'s for each of PROMPTS, both choosing
    among the tokenizer's ids only. Tokens must be identical, but for a tie at fp32 precision:
    where the two first differ, PyTorch's logits of the two tokens may be within
    TIE_FACTOR x reorder_bound of those logits (two implementations each within the bound may
    then rank them either way; the tokens after it are not comparable). A failure is
    appended to `failures`."""
    limit = vocab_limit(tokenizer, model.config)
    generation = []
    for text in PROMPTS:
        prompt = tokenizer.encode(text)[: context - 1]
        steps = min(gen_tokens, context - len(prompt))
        ref = generate(model, torch.tensor([prompt]), steps, temperature=0,
                       vocab_limit=limit)[0, len(prompt):].tolist()
        got = ours(prompt, steps)
        first = first_difference(got, ref)
        case = {"prompt": text, "tokens": steps, "identical": got == ref, "torch": ref,
                "onnxruntime": got}
        if first is not None:
            with torch.no_grad():
                z = model(torch.tensor([prompt + ref[:first]]))[0][0, -1]
            case["first_difference"] = {
                "position": first, "torch_logit_margin": float(z[ref[first]] - z[got[first]]),
                "tie_bound": TIE_FACTOR * reorder_bound(model.config, float(z.abs().max()))}
        generation.append(case)
        tie = first is not None and (case["first_difference"]["torch_logit_margin"]
                                     <= case["first_difference"]["tie_bound"])
        if len(got) != len(ref) or (got != ref and not tie):
            failures.append(f"greedy generation differs for prompt {text!r}"
                            + (f" at token {first} (PyTorch prefers its token by "
                               f"{case['first_difference']['torch_logit_margin']:.3g}, more "
                               "than a tie at fp32 precision, "
                               f"{case['first_difference']['tie_bound']:.3g})"
                               if first is not None else f": {len(got)} vs {len(ref)} tokens"))
    return generation


def cpu_session(path: Path, threads: int | None = None) -> ort.InferenceSession:
    return graph_session(path, level="all", threads=threads)


END_CASES = ((1, 1, 9), (3, 7, 9))  # (batch, seq, past) run at the end of a long context


def _cases(cfg: ModelConfig, kind: str, fixed: dict | None = None
           ) -> list[tuple[int, int, int, int]]:
    """(batch, seq, past, first position) grid: sequence 1 and T = check_tokens(cfg), past 0
    and T - 1, from position 0; where the context is longer than T and the graph takes
    positions, END_CASES placed at the context's end. A graph with pinned shapes runs its one
    shape."""
    if fixed:
        return [(fixed["batch_size"], fixed["sequence_length"],
                 fixed.get("past_sequence_length", 0), 0)]
    T = check_tokens(cfg)
    seqs = sorted({1, min(7, T), T})
    pasts = sorted({0, min(9, T - 1), T - 1}) if kind == DECODER_WITH_PAST else [0]
    cases = [(b, s, p, 0) for b in (1, 3) for s in seqs for p in pasts if s + p <= T]
    if kind == DECODER_WITH_PAST and cfg.block_size > T:
        cases += [(b, s, p, cfg.block_size - s - p) for b, s, p in END_CASES]
    if (W := window_tokens(cfg)) is not None:  # past a window longer than T: batch 1
        cases += [(1, W, 0, 0)] + ([(1, 4, W - 4, 0)] if kind == DECODER_WITH_PAST else [])
    return cases


def sizes(cfg: ModelConfig, cases) -> dict[str, Any]:
    """What a check ran, for its report: the longest sequence (past + new tokens), the model's
    context, and the highest position reached."""
    return {"longest_sequence": max(s + p for _, s, p, *_ in cases), "context": cfg.block_size,
            "highest_position": max(s + p - 1 + (c[0] if c else 0) for _, s, p, *c in cases),
            "batch": max(b for b, *_ in cases)}


def _corpus_tokens(tokenizer) -> np.ndarray | None:
    """The built-in corpus' validation split in this tokenizer (None if unavailable)."""
    try:
        corpus = D.load_corpus()
    except TinytError:
        return None
    if tokenizer.eos_id is None:  # an encoder's: the documents' tokens one after another
        return np.concatenate([tokenizer.encode(d) for d in corpus.val[:8]]).astype(np.int64)
    return D.encode_documents(tokenizer, corpus.val[:8]).astype(np.int64)


def _ids(rng, vocab: int, corpus, b: int, n: int, source: str) -> np.ndarray:
    if source == "corpus" and corpus is not None and len(corpus) > n + 1:
        starts = rng.integers(0, len(corpus) - n, size=b)
        return np.stack([corpus[s:s + n] for s in starts])
    return rng.integers(0, vocab, size=(b, n), dtype=np.int64)


def _compare(name: str, ours: np.ndarray, ref: np.ndarray) -> dict[str, Any]:
    if ours.shape != ref.shape:
        return {"shape_mismatch": [list(ours.shape), list(ref.shape)], "max_abs": float("inf")}
    worst = {"max_abs": 0.0, "max_rel": 0.0, "magnitude": max_abs(ref)}
    same = rows = 0
    for a, b in row_chunks(ours, ref):  # big logits in pieces: no full float64 copies
        diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
        for key, value in (("max_abs", diff.max(initial=0.0)),
                           ("max_rel", (diff / (np.abs(b) + 1e-6)).max(initial=0.0))):
            if not float(value) <= worst[key]:  # NaN is worse than anything
                worst[key] = float(value)
        if name == "logits":
            same += int((a.argmax(-1) == b.argmax(-1)).sum())
            rows += len(a)
    if name == "logits":
        worst["top1_agreement"] = same / max(rows, 1)
    return worst


def torch_outputs(model, kind: str, feeds: dict[str, np.ndarray], n_layer: int):
    """PyTorch outputs for the same feeds, as numpy, in contract order."""
    t = {k: torch.from_numpy(v) for k, v in feeds.items()}
    with torch.no_grad():
        if kind in (CLASSIFIER, TOKEN_CLASSIFIER):
            return [model(t["input_ids"], t["attention_mask"], t.get("token_type_ids")).numpy()]
        if kind == ENCODER:
            out = model(t["input_ids"], t["attention_mask"], t.get("token_type_ids"))
            return [x.numpy() for x in (out if isinstance(out, tuple) else (out,))]
        if kind == DECODER:
            return [model(t["input_ids"], t["attention_mask"])[0].numpy()]
        names = past_names(n_layer)
        past = tuple((t[names[2 * i]], t[names[2 * i + 1]]) for i in range(n_layer))
        logits, present = model(t["input_ids"], t["attention_mask"], t["position_ids"], past)
    return [logits.numpy(), *(x.numpy() for kv in present for x in kv)]


def case_feeds(model, cfg: ModelConfig, kind: str, ids: np.ndarray, past_len: int,
           pad: int, first: int = 0) -> dict[str, np.ndarray]:
    """Inputs for one case; ids holds past_len prefix tokens then the new ones, and `pad`
    leading positions of row 0 are padding; positions start at `first`. The prefix becomes a
    KV cache made by PyTorch."""
    mask = np.ones(ids.shape, dtype=np.int64)
    mask[0, :pad] = 0
    feeds = prefill_feeds(cfg, kind, ids, mask)
    if "token_type_ids" in feeds:  # a pair of texts: the second half of each row of type 1
        feeds["token_type_ids"][:, ids.shape[1] // 2:] = 1
    if kind != DECODER_WITH_PAST:
        return feeds
    feeds["position_ids"] = feeds["position_ids"] + first
    if past_len == 0:
        return feeds
    positions = feeds["position_ids"]
    with torch.no_grad():
        _, cache = model(torch.from_numpy(ids[:, :past_len]), torch.from_numpy(mask[:, :past_len]),
                         torch.from_numpy(positions[:, :past_len]))
    feeds.update(zip(past_names(cfg.n_layer), (t.numpy() for kv in cache for t in kv)))
    feeds.update(input_ids=ids[:, past_len:], position_ids=positions[:, past_len:])
    return feeds


def _verify_graphs(ckpt, onnx_dir: Path, kind: str, seed: int, gen_tokens: int) -> dict:
    """The report of an artifact of several graphs: a Whisper's (export/speech_verify.py), an
    encoder-decoder's (export/seq2seq_verify.py), or a shared-cache pair's."""
    if kind == SEQ2SEQ and ckpt.config.n_mels is not None:
        from .speech_verify import verify_speech
        return verify_speech(ckpt, onnx_dir, gen_tokens)
    if kind == SEQ2SEQ:
        from .seq2seq_verify import verify_seq2seq
        return verify_seq2seq(ckpt, onnx_dir, seed, gen_tokens)
    return _verify_shared_cache(ckpt, onnx_dir, seed, gen_tokens)


def verify(checkpoint_dir: str | os.PathLike, onnx_dir: str | os.PathLike, *,
           report_path: str | os.PathLike | None = None, seed: int = 0,
           gen_tokens: int = GEN_TOKENS) -> dict[str, Any]:
    """Compare an exported artifact with its checkpoint; returns the report (`passed`)."""
    onnx_dir = Path(onnx_dir)
    manifest = load_manifest(onnx_dir)  # a tampered or truncated file is refused here
    kind = manifest.graph
    ckpt = load_checkpoint(checkpoint_dir)
    cfg, model = ckpt.config, ckpt.model
    if kind in (SHARED_CACHE_KIND, SEQ2SEQ):
        report = _verify_graphs(ckpt, onnx_dir, kind, seed, gen_tokens)
        report.update(checkpoint=str(Path(checkpoint_dir).resolve()), onnx=str(onnx_dir.resolve()))
        if report_path is not None:
            write_json(report_path, report)
        return report
    inputs, outputs = contract_for(cfg, kind)
    fixed = manifest.fixed_shape
    sess = cpu_session(onnx_dir / manifest.model_file)
    got_in = [i.name for i in sess.get_inputs()]
    if got_in != [t.name for t in inputs]:
        raise VerificationError(f"{onnx_dir / ONNX_FILE} inputs {got_in} do not match the "
                                f"checkpoint's contract {[t.name for t in inputs]}")
    out_names = [t.name for t in outputs]
    rng = np.random.default_rng(seed)
    corpus = _corpus_tokens(ckpt.tokenizer)
    cases = []
    grid = _cases(cfg, kind, fixed)
    for (b, s, p, first) in grid:
        for source in ("random", "corpus", "left-padded"):
            if source == "left-padded" and (b < 2 or s + p < 4):
                continue
            ids = _ids(rng, cfg.vocab_size, corpus, b, p + s,
                       "corpus" if source != "random" else "random")
            pad = (p + s) // 2 if source == "left-padded" else 0
            feeds = case_feeds(model, cfg, kind, ids, p, pad, first)
            ours = sess.run(out_names, feeds)
            ref = torch_outputs(model, kind, feeds, cfg.n_layer)
            if pad and kind in (ENCODER, TOKEN_CLASSIFIER):  # per token: padding unspecified
                real = (feeds["attention_mask"] == 1)[..., None]  # (new arrays: ref's pooled
                ours[0], ref[0] = np.where(real, ours[0], 0), np.where(real, ref[0], 0)  # view)
            elif pad and kind != CLASSIFIER:  # logits at padding are unspecified: skip them
                keep = max(pad - p, 0)
                ours[0], ref[0] = ours[0][:, keep:], ref[0][:, keep:]
            result = {n: _compare(n, o, r) for n, o, r in zip(out_names, ours, ref)}
            cases.append({"batch": b, "sequence": s, "past": p, "first_position": first,
                          "inputs": source, "outputs": result})
            del feeds, ours, ref  # at GPT-2 small's size a case's tensors are 2 GB
    worst = {}
    for name in out_names:
        case = max(cases, key=lambda c: c["outputs"][name]["max_abs"])
        size = max(c["outputs"][name].get("magnitude", 0.0) for c in cases)
        worst[name] = {"max_abs": case["outputs"][name]["max_abs"], "magnitude": size,
                       "bound": reorder_bound(cfg, size),
                       "case": {k: case[k] for k in ("batch", "sequence", "past",
                                                     "first_position", "inputs")
                                if k != "first_position" or case[k]}}
    failures = [f"{n}: max abs diff {w['max_abs']:.3g} > {w['bound']:.3g} (fp32 rounding at "
                f"|value| up to {w['magnitude']:.3g}, depth {cfg.n_layer}) at {w['case']}"
                for n, w in worst.items() if not w["max_abs"] <= w["bound"]]
    generation = []
    if kind not in (CLASSIFIER, ENCODER, TOKEN_CLASSIFIER):
        context = min(cfg.block_size, capacity(kind, fixed)) if fixed else cfg.block_size
        limit = vocab_limit(ckpt.tokenizer, cfg)
        generation = greedy_generation(
            model, ckpt.tokenizer, context, gen_tokens,
            lambda prompt, n: ort_greedy(sess, cfg, kind, prompt, n, fixed, limit), failures)
    report = {"passed": not failures, "failures": failures, "graph": kind, "fixed_shape": fixed,
              "sizes": {**sizes(cfg, grid), "generated_tokens": gen_tokens},
              "tolerances": {n: w["bound"] for n, w in worst.items()},
              "worst": worst, "cases": cases, "generation": generation,
              "checkpoint": str(Path(checkpoint_dir).resolve()), "onnx": str(onnx_dir.resolve())}
    if report_path is not None:
        write_json(report_path, report)
    return report


def _verify_shared_cache(ckpt, onnx_dir: Path, seed: int, gen_tokens: int) -> dict[str, Any]:
    """A shared-cache artifact (runtime/cache.py) through the runtime, against PyTorch: the last
    token's logits of single and ragged prompts (random and corpus text), then of decode steps
    fed PyTorch's greedy tokens, with a row finishing early; then greedy generation. Prompts
    are at most check_tokens(cfg) / 2 long (the graph's own positions start at 0: reaching the
    end of a long context would take a prompt as long as the context)."""
    from tinyt.runtime import load

    cfg, model = ckpt.config, ckpt.model.eval()
    lm = load(onnx_dir, threads=1)
    rng = np.random.default_rng(seed)
    corpus = _corpus_tokens(ckpt.tokenizer)
    T, C = cfg.block_size, check_tokens(cfg)
    cases, failures = [], []
    for lens in ([1], [min(7, C - 2)], [C // 2], [3, C // 3, 1]):
        for source in ("random", "corpus"):
            rows = [_ids(rng, cfg.vocab_size, corpus, 1, n, source)[0].tolist() for n in lens]
            width = max(lens)
            ids, mask = left_pad(rows)
            steps = lm.steps(prefill_feeds(cfg, DECODER_WITH_PAST, ids, mask), new_tokens=6)
            ours, active = next(steps)[:, -1].copy(), np.ones(len(rows), bool)
            worst, agree, seen, size = 0.0, 0, 0, 0.0
            for step in range(min(6, T - width - 1) + 1):
                with torch.no_grad():  # each row alone, its whole sequence so far
                    ref = np.stack([model(torch.tensor([r]))[0][0, -1].numpy() for r in rows])
                live = np.flatnonzero(active)
                worst = max(worst, float(np.abs(ours[live] - ref[live]).max()))
                size = max(size, float(np.abs(ref[live]).max()))
                agree += int((ours[live].argmax(-1) == ref[live].argmax(-1)).sum())
                seen += len(live)
                if step == min(6, T - width - 1):
                    break
                if step == 1 and len(rows) > 1:
                    active[0] = False  # a finished row idles while the others go on
                nxt = ref.argmax(-1)
                for b in np.flatnonzero(active):
                    rows[b] = rows[b] + [int(nxt[b])]
                ours = steps.send((nxt, active.copy()))[:, -1].copy()
            cases.append({"prompts": lens, "inputs": source, "logits_max_abs": worst,
                          "magnitude": size, "top1_agreement": agree / seen})
    worst_case = max(cases, key=lambda c: c["logits_max_abs"])
    bound = reorder_bound(cfg, max(c["magnitude"] for c in cases))
    if not worst_case["logits_max_abs"] <= bound:
        failures.append(f"logits: max abs diff {worst_case['logits_max_abs']:.3g} > "
                        f"{bound:.3g} (fp32 rounding) at {worst_case['prompts']} "
                        f"({worst_case['inputs']})")
    generation = greedy_generation(  # the runtime limits itself to the tokenizer's ids
        model, ckpt.tokenizer, T, gen_tokens,
        lambda prompt, n: lm.generate_ids([prompt], max_new_tokens=n,
                                          min_new_tokens=n)[0].token_ids, failures)
    longest = max(max(c["prompts"]) for c in cases) + 6
    return {"passed": not failures, "failures": failures, "graph": SHARED_CACHE_KIND,
            "sizes": {"longest_sequence": min(longest, T), "context": T, "batch": 3,
                      "highest_position": min(longest, T) - 1, "generated_tokens": gen_tokens},
            "tolerances": {"logits": bound},
            "worst": {"logits": {"max_abs": worst_case["logits_max_abs"], "bound": bound,
                                 "case": {k: worst_case[k] for k in ("prompts", "inputs")}}},
            "cases": cases, "generation": generation}
