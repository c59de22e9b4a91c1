"""`tinyt package ARTIFACT OUT --format web` for an encoder, a classifier or a token
classifier: the page embeds, classifies or tags the user's texts in the browser.

    ARTIFACT (encoder | classifier | token_classifier)
      ──▶ OUT/index.html, tinyt.mjs, tokenizers.min.mjs, ort files   as for a language model
          OUT/model.onnx, tokenizer.json, config.json (id2label), web.json, manifest.json
      checked before it is written, under Node on the package's own files: each check text's
      ids and token types ([CLS] ... [SEP], <s> ... </s>, the cut at the model's max_length;
      a classifier's text pairs too, [CLS] a [SEP] b [SEP] cut longest-first) equal
      tinyt.runtime's, and so do its embeddings (within WEB_ATOL), or its labels and
      probabilities (a token classifier's tokens with their character offsets).

web.json's `max_length` is where tinyt.runtime cuts a text (tokenizer.json's truncation, an
imported sentence-transformers model's max_seq_length, else the model's context), so the page
and the runtime run the same tokens.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from tinyt.contract import CLASSIFIER, ENCODER, ONNX_FILE, TOKEN_CLASSIFIER
from tinyt.errors import WebPackageError
from tinyt.fsutil import atomic_dir
from tinyt.graphio import DATA_SUFFIX
from tinyt.manifest import Artifact, write_manifest

from ..stage import Built, built, copy_artifact_files
from .tools import (
    CHECK_TEXTS,
    ORT_WEB_VERSION,
    TOKENIZERS_JS_VERSION,
    copy_runtime,
    node_version,
    run_module,
)

TEXT_KINDS = (ENCODER, CLASSIFIER, TOKEN_CLASSIFIER)
METHOD = {ENCODER: "embed", CLASSIFIER: "classify", TOKEN_CLASSIFIER: "tag"}
# The same fp32 graph on ONNX Runtime Web's WebAssembly kernels and on the native CPU ones:
# the same arithmetic summed in other orders (128-bit SIMD against AVX2 / AVX-512 and their
# FMA), a few float32 ulps per layer on values of order 1 -- the order export/compare.py's
# reorder_bound gives two graphs of one model. Embeddings and probabilities; measured on the
# imported BERT, DistilBERT, RoBERTa and XLM-R fixtures: at most 7e-7.
WEB_ATOL = 1e-4
# An INT8 graph quantizes its activations as it runs (MatMulNBits' int8 blocks); where the two
# backends round a value to neighbouring int8 steps, that step travels through the layers.
# Its scale is the INT8 graph's own distance from fp32 (about 1.5% of a unit embedding,
# docs/quantization.md); measured at all-MiniLM-L6-v2's shape: 4.1e-3 (qgemm: 1.2e-7).
WEB_INT8_ATOL = 2e-2


def package_text(src_dir: Path, out_dir: Path, src: Artifact) -> Built:
    """Write the web package of an encoder or a classifier (module docstring); returns out_dir.
    package_web has checked the graph, the tokenizer's model and the tools before this."""
    from tinyt.runtime import load


    if (src_dir / (ONNX_FILE + DATA_SUFFIX)).exists():
        raise WebPackageError(f"{src_dir} keeps its weights in {ONNX_FILE}{DATA_SUFFIX}; the page "
                              "loads one graph file: package a graph under 2 GB")
    kind, cfg, manifest = src.kind, src.config, src.manifest
    model = load(src_dir, threads=1)
    if kind == ENCODER and "sentence_embedding" not in [o.name for o in
                                                        model.session.get_outputs()]:
        raise WebPackageError(f"{src_dir} is an encoder without a pooling (hidden states only); "
                              "the page embeds sentences: import a sentence-transformers "
                              "directory, whose Pooling module says how tokens make a sentence")
    labels = [] if kind == ENCODER else list(model.labels)
    eos = model.tokenizer.eos_id  # the runtime's Classifier pads with it (the mask hides the
    pad = 0 if kind == ENCODER or eos is None else eos  # padding either way)
    web = {"name": src_dir.name, "graph": kind, "graphs": [ONNX_FILE],
           "tokenizer": "tokenizer.json", "context": cfg.block_size,
           "max_length": model.max_length, "vocab_size": cfg.vocab_size,
           "pad_token_id": pad,
           "dim": cfg.n_embd, "labels": labels,
           "onnxruntime_web": ORT_WEB_VERSION, "tokenizers_js": TOKENIZERS_JS_VERSION}
    quantized = bool(manifest.quantization)
    atol = WEB_INT8_ATOL if quantized else WEB_ATOL
    long = "the quick brown fox jumps over the lazy dog. " * model.max_length
    texts = [*CHECK_TEXTS, long]
    run_texts = [t for t in texts if t] if kind != ENCODER else texts  # a classifier wants text
    if kind == CLASSIFIER:  # pairs, one cut on each side (longest_first) and one on both
        pairs = [[CHECK_TEXTS[0], CHECK_TEXTS[1]], [CHECK_TEXTS[3], long], [long, CHECK_TEXTS[4]],
                 [long, long]]
        texts, run_texts = texts + pairs, run_texts + pairs
    with atomic_dir(out_dir) as out:
        shutil.copy2(src_dir / ONNX_FILE, out / ONNX_FILE)
        copy_artifact_files(src_dir, out)
        runtime = copy_runtime(out)
        (out / "web.json").write_text(json.dumps(web, indent=1) + "\n")
        got = run_module(out, {"rows": texts, METHOD[kind]: run_texts})
        if "error" in got:
            raise WebPackageError(f"the packaged model does not run on onnxruntime-web "
                                  f"{ORT_WEB_VERSION}: {got['error']}")
        want_rows = rows(model, texts)
        bad = [t for t, a, b in zip(texts, got["rows"], want_rows) if a != b]
        if bad:
            raise WebPackageError(f"the web tokenizer's ids differ from tinyt's on {bad}")
        worst = compare(model, kind, run_texts, got[METHOD[kind]], atol)
        written = write_manifest(
            out, stage="package", source=src.record(),
            options={"format": "web"}, extra={
                "graph": kind, "package_format": "web", "labels": labels or None,
                "web": {**web, "files": [ONNX_FILE, *runtime], "notes": [],
                        "checked": {"runtime": f"node {node_version()}",
                                    "onnxruntime_web": ORT_WEB_VERSION,
                                    "tokenizers_js": TOKENIZERS_JS_VERSION,
                                    "tokenizer_texts": len(texts), "rows_equal": True,
                                    "pairs": len(texts) - len(CHECK_TEXTS) - 1,
                                    "offsets_equal": kind == TOKEN_CLASSIFIER or None,
                                    METHOD[kind]: len(run_texts), "tolerance": atol,
                                    "worst": worst}},
                **manifest.records("quantization", "accuracy"),
                "versions": manifest.versions})
    return built(out_dir, written)


def rows(model, texts: list[str]) -> list[list[list[int]]]:
    """tinyt.runtime's [ids, token types] of each text, special tokens added, cut where the
    model cuts (its __init__ set tokenizer.json's truncation to max_length)."""
    return [[e.ids, e.type_ids] for e in model.tokenizer.hf.encode_batch(
        [tuple(t) if isinstance(t, list) else t for t in texts], add_special_tokens=True)]


def compare(model, kind: str, texts: list[str], got, atol: float) -> float:
    """The page's embed / classify / tag answer (check.mjs's JSON) against tinyt.runtime's on
    the same texts: embeddings and probabilities within atol; labels equal, except where the
    runtime's own two best labels are within atol of each other (a tie: either may win).
    Returns the worst difference; raises WebPackageError naming the first text that fails."""
    if kind == ENCODER:
        want = model.embed(texts)
        diff = np.abs(np.asarray(got, dtype=np.float32) - want).max(axis=1)
        for text, d in zip(texts, diff):
            if not d <= atol:
                raise WebPackageError(f"the page's embedding of {text[:40]!r} differs from "
                                      f"tinyt.runtime's by {d:.3g} (tolerance {atol})")
        return float(diff.max())
    if kind == CLASSIFIER:
        pairs = [([g["label"]], [g["probabilities"]], [w.label], [w.probabilities])
                 for g, w in zip(got, model.classify(texts))]
    else:  # one label per token
        pairs = []
        for g, w in zip(got, model.tag(texts)):
            got_tokens = [(t["token"], t["start"], t["end"]) for t in g]
            if got_tokens != [(t.token, t.start, t.end) for t in w]:
                raise WebPackageError(f"the page's tokens and character offsets {got_tokens} "
                                      "differ from tinyt.runtime's "
                                      f"{[(t.token, t.start, t.end) for t in w]}")
            pairs.append(([t["label"] for t in g], [{t["label"]: t["probability"]} for t in g],
                          [t.label for t in w], [{t.label: t.probability} for t in w]))
    worst = 0.0
    for text, (g_labels, g_probs, w_labels, w_probs) in zip(texts, pairs):
        for gl, gp, wl, wp in zip(g_labels, g_probs, w_labels, w_probs):
            shared = set(gp) & set(wp)  # a token's: the probability of its label
            d = max([abs(gp[k] - wp[k]) for k in shared], default=0.0)
            # a tie: the runtime's probability of the page's label (a token's: the page's
            # own) within reach of its best
            tie = abs(wp.get(gl, gp[gl]) - wp[wl]) <= 2 * atol
            if not d <= atol or (gl != wl and not tie):
                raise WebPackageError(f"the page's {'label' if kind == CLASSIFIER else 'tags'} "
                                      f"of {text[:40]!r} differ from tinyt.runtime's: {gl} "
                                      f"{gp} vs {wl} {wp} (tolerance {atol})")
            worst = max(worst, d)
    return worst
