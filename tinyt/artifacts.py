"""The artifact variants, as data (torch-free): one row per directory tinyt makes under an
artifacts root, naming what it is made from, the stage and options that make it, and the
label the harness reports it under. The pipeline makes its rows in this order, the harness
times the rows marked timed, and the peer benchmark's engines run rows named in its own table
(tinyt.benchmarks.peers.engines), making its on-demand rows when asked.

    checkpoint ─export─▶ onnx ─optimize─▶ onnx-opt ─quantize─▶ onnx-int8 ─gqa─▶ onnx-int8-gqa
                          │                  │                                       ▲ (prompts)
                          │                  ├─quantize qgemm──────▶ onnx-int8-qgemm ┘
                          │                  ├─quantize qgemm-rows─▶ onnx-int8-rows ─gqa─▶
                          │                  │                        onnx-int8-rows-gqa
                          │                  ├─quantize 4-bit─▶ onnx-int4 ─gqa─▶ onnx-int4-gqa
                          │                  ├─4-bit, lm_head 8─▶ onnx-int4-head8 ─gqa─▶ ...-gqa
                          │                  └─4-bit blocks of 128, lm_head 8─▶
                          │                           onnx-int4-k128-head8 ─gqa─▶ ...-gqa
                          │                         (the peer benchmark's, when asked)
                          └─quantize static─▶ onnx-int8-static
    clf ─export─▶ clf-onnx ─optimize─▶ clf-opt ─quantize─▶ clf-int8   (docs/benchmarks.md)

A stage is one of tinyt.export's functions (export_onnx, optimize, quantize), called as
`stage(source, out, **options)`; `arguments` spells that call out for a row.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from tinyt.contract import (
    CLASSIFIER,
    DECODER_WITH_PAST,
    ENCODER,
    KINDS,
    SEQ2SEQ,
    SHARED_CACHE_KIND,
)
from tinyt.recipe import INT4_BLOCK  # the GenAI model builder's int4 block, so the two compare

CHECKPOINT = "checkpoint"  # the trained language model: ARTIFACTS/checkpoint
CLASSIFIER_CHECKPOINT = "clf"  # a classifier checkpoint, when one is trained beside it
CHECKPOINTS = (CHECKPOINT, CLASSIFIER_CHECKPOINT)
STAGES = ("export", "optimize", "quantize")  # export_onnx, optimize, quantize (tinyt.export)
MAKERS = ("pipeline", "peers", "hand")  # every `tinyt pipeline`; the peer benchmark when asked;
#                                         the commands of docs/benchmarks.md
# What an INT8 artifact may cost the model it quantizes: perplexity on held-out text at most
# +0.5% over the graph it was quantized from (issue 48's target on real SmolLM2-135M, where
# CTranslate2's int8 costs +15.5% and the GenAI builder's +1.0%). A row marked `gated` is kept
# by the pipeline only within it: int8 GEMMs with one activation scale per tensor cost real
# SmolLM2 +59.5% (an outlier channel sets every row's scale), while on tinyt's demo model
# they hold; which holds is measured per model, on the CPU that runs the pipeline.
INT8_PERPLEXITY_BUDGET = 0.005
REJECTED = "rejected"  # ARTIFACTS/rejected/<row>: a gated row beyond the budget, kept for a look


@dataclass(frozen=True)
class Variant:
    """One artifact directory: how it is made and what it is called where it is reported."""

    dir: str  # the directory under the artifacts root
    source: str  # what it is made from: another row's dir, or one of CHECKPOINTS
    stage: str  # one of STAGES
    step: str  # the pipeline's name for the step (its log lines and stage times)
    kind: str  # the graph kind it holds (tinyt.contract)
    options: Mapping[str, str | int | tuple[str, ...]] = field(default_factory=dict)  # keywords
    prefill_from: str | None = None  # a shared-cache pair's prompt graph: the row it comes from
    #   (the pipeline leaves it out, the pair one graph, when that row was not kept)
    gated: bool = False  # kept only within INT8_PERPLEXITY_BUDGET (its accuracy report's)
    # a gated row beyond the budget is made again with these options instead (kept whatever
    # its report says, which then says what it costs); None: set aside
    fallback: Mapping[str, str | int | tuple[str, ...]] | None = None
    data: bool = False  # takes the pipeline's --data (calibration and the accuracy report)
    made_by: str = "pipeline"  # one of MAKERS
    verify: bool = False  # the pipeline checks it against PyTorch (OUT/<dir>-verify.json)
    bench: str | None = None  # its label in the harness and the pipeline report
    timed: bool = False  # the harness times it when the directory exists
    note: str = ""  # what sets it apart (the pipeline's list of hand-made rows, the peers' list)

    def __post_init__(self) -> None:
        for name, value, allowed in (("stage", self.stage, STAGES),
                                     ("made_by", self.made_by, MAKERS),
                                     ("kind", self.kind, (*KINDS, SEQ2SEQ))):
            if value not in allowed:
                raise ValueError(f"variant {self.dir!r}: {name}={value!r} is not one of "
                                 f"{', '.join(allowed)}")
        if self.timed and self.bench is None:
            raise ValueError(f"variant {self.dir!r}: timed, but no bench label to report it")
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))
        if self.fallback is not None:
            if not self.gated:
                raise ValueError(f"variant {self.dir!r}: a fallback is for a gated row")
            object.__setattr__(self, "fallback", MappingProxyType(dict(self.fallback)))

    @property
    def inputs(self) -> tuple[str, ...]:
        """The directories the stage reads: the source, and a pair's prompt graph."""
        return (self.source,) if self.prefill_from is None else (self.source, self.prefill_from)


_PAIR = "shared KV cache; prompts on the qgemm graph, steps on the {} one"

VARIANTS: tuple[Variant, ...] = (
    Variant("onnx", CHECKPOINT, "export", "export", DECODER_WITH_PAST, verify=True,
            bench="ort-fp32", timed=True),
    Variant("onnx-opt", "onnx", "optimize", "optimize", DECODER_WITH_PAST, verify=True,
            bench="ort-optimized", timed=True),
    # int8 activations (MatMulNBits blocks of 64, accuracy_level 4) where they hold; else the
    # same weights with fp32 products: on real SmolLM2-135M the first costs +0.82% perplexity,
    # the second +0.04% — but decodes at 322 ms a token against fp32's 38 (ONNX Runtime's
    # 8-bit MatMulNBits has no fast fp32 path on an AVX2 CPU). The fast recipes between them
    # straddle the budget (the lm_head fp32: +0.39% on the report's text, +0.53% on held-out
    # prose; with blocks of 32, +0.55% and +0.35%), so the one that holds is kept
    # (docs/quantization.md)
    Variant("onnx-int8", "onnx-opt", "quantize", "quantize", DECODER_WITH_PAST, data=True,
            bench="ort-int8-dynamic", timed=True, gated=True,
            fallback={"mode": "weight-only"}),
    # static (QDQ) INT8 is not the main job's: one calibrated scale per activation tensor
    # cannot hold a real model's outlier channels (real SmolLM2-135M: greedy agreement with
    # fp32 2.6%; all-MiniLM-L6-v2: recall@10 0.74), far from dynamic INT8's quality
    Variant("onnx-int8-static", "onnx", "quantize", "quantize-static", DECODER_WITH_PAST,
            {"mode": "static"}, data=True, made_by="hand", bench="ort-int8-static", timed=True,
            note="not built by `tinyt pipeline`: static (QDQ) INT8 with one calibrated scale "
                 "per activation tensor cannot hold a real model's outlier channels (real "
                 "SmolLM2-135M: greedy agreement with fp32 2.6%; all-MiniLM-L6-v2: recall@10 "
                 "0.74; docs/quantization.md); `tinyt quantize OUT/onnx OUT/onnx-int8-static "
                 "--mode static` makes it"),
    Variant("onnx-int8-qgemm", "onnx-opt", "quantize", "quantize-qgemm", DECODER_WITH_PAST,
            {"kernel": "qgemm"}, data=True, bench="ort-int8-qgemm", gated=True),
    Variant("onnx-int8-gqa", "onnx-int8", "optimize", "shared-cache", SHARED_CACHE_KIND,
            {"target": "gqa"}, prefill_from="onnx-int8-qgemm", bench="ort-int8-gqa",
            note=_PAIR.format("MatMulNBits")),
    # one graph, every row as if alone: the one `tinyt serve` batches prompts and steps with
    # int8 GEMMs with an activation scale per row where they hold; else the MatMulNBits
    # weights with fp32 products (rows as independent): on real SmolLM2-135M the first costs
    # +3.7% perplexity, the second +0.04% (docs/quantization.md)
    Variant("onnx-int8-rows", "onnx-opt", "quantize", "quantize-rows", DECODER_WITH_PAST,
            {"kernel": "qgemm-rows"}, data=True, gated=True,
            fallback={"kernel": "nbits", "mode": "weight-only"}),
    Variant("onnx-int8-rows-gqa", "onnx-int8-rows", "optimize", "shared-cache-rows",
            SHARED_CACHE_KIND, {"target": "gqa"}, bench="ort-int8-rows-gqa"),
    Variant("onnx-int4", "onnx-opt", "quantize", "quantize-int4", DECODER_WITH_PAST,
            {"bits": 4, "block_size": INT4_BLOCK}, made_by="peers", bench="ort-int4",
            timed=True,
            note=f"MatMulNBits 4-bit, block {INT4_BLOCK}, made from onnx-opt"),
    # one graph for prompts and steps, its weights once: a qgemm prompt graph beside it held a
    # second, 8-bit copy (Qwen3-0.6B's shape: 1,023 MB of files, 1.5 GB resident, against
    # the builder int4's 395 MB and 0.7 GB) for a faster prompt pass (docs/quantization.md)
    Variant("onnx-int4-gqa", "onnx-int4", "optimize", "shared-cache-int4", SHARED_CACHE_KIND,
            {"target": "gqa"}, made_by="peers",
            note="shared KV cache; prompts and steps on the 4-bit graph (its weights once)"),
    # the builder's int4 with its tied table at 8 bits (its shared int8 embeddings): the table
    # decides the argmax, and at Gemma 3's 262,144 ids it is most of the model
    Variant("onnx-int4-head8", "onnx-opt", "quantize", "quantize-int4-head8", DECODER_WITH_PAST,
            {"bits": 4, "block_size": INT4_BLOCK, "keep_8bit": ("lm_head",)}, made_by="peers",
            note=f"MatMulNBits 4-bit, block {INT4_BLOCK}, the lm_head (a tied table for both "
                 "its readers) at 8 bits"),
    Variant("onnx-int4-head8-gqa", "onnx-int4-head8", "optimize", "shared-cache-int4-head8",
            SHARED_CACHE_KIND, {"target": "gqa"}, prefill_from="onnx-int8-qgemm",
            made_by="peers",
            note=_PAIR.format("4-bit, lm_head 8-bit")),
    # the same with blocks of 128: ONNX Runtime's 4-bit kernel reads fewer scale bytes and runs
    # ~20% faster than with blocks of 32 (lab/step_kernels.py), for some accuracy
    Variant("onnx-int4-k128-head8", "onnx-opt", "quantize", "quantize-int4-k128-head8",
            DECODER_WITH_PAST, {"bits": 4, "block_size": 128, "keep_8bit": ("lm_head",)},
            made_by="peers",
            note="MatMulNBits 4-bit, block 128, the lm_head (a tied table for both its readers) "
                 "at 8 bits"),
    Variant("onnx-int4-k128-head8-gqa", "onnx-int4-k128-head8", "optimize",
            "shared-cache-int4-k128-head8", SHARED_CACHE_KIND, {"target": "gqa"},
            prefill_from="onnx-int8-qgemm", made_by="peers",
            note=_PAIR.format("4-bit blocks of 128, lm_head 8-bit")),
    Variant("clf-onnx", CLASSIFIER_CHECKPOINT, "export", "export-clf", CLASSIFIER,
            made_by="hand", bench="ort-clf-fp32", timed=True),
    Variant("clf-opt", "clf-onnx", "optimize", "optimize-clf", CLASSIFIER, made_by="hand",
            bench="ort-clf-optimized", timed=True),
    Variant("clf-int8", "clf-opt", "quantize", "quantize-clf", CLASSIFIER, made_by="hand",
            bench="ort-clf-int8", timed=True),
)
# An encoder checkpoint's rows (a sentence-transformers or BERT-family import), which the
# pipeline makes instead of the decoder rows above (rows_for): no KV cache, no pair, no static
# INT8 (on all-MiniLM-L6-v2 static QDQ keeps recall@10 at 0.79 of fp32's; docs/encoders.md).
#   checkpoint ─export─▶ onnx ─optimize─▶ onnx-opt ─quantize ENCODER_INT8─▶ onnx-int8
# ENCODER_INT8: the word, position and token-type tables at 8 bits, the layers' matmuls kept
# fp32. Measured on the real all-MiniLM-L6-v2, AMD EPYC AVX2 without VNNI, against fp32 on the
# docstring set (docs/quantization.md): recall@10 0.996, cosine 0.99998 mean / 0.9999 min,
# 61% of fp32's bytes, fp32's speed. 8-bit weights in every matmul (quantize's default) give
# 27% of the bytes but move each query-passage score by 3.7e-3 rms (weight-only: 1.9e-3),
# where fp32's 10th and 11th passages sit 6.7e-3 apart (median): recall@10 0.988 (0.992).
ENCODER_INT8: Mapping[str, str | int | tuple[str, ...]] = MappingProxyType(
    {"exclude": ("transformer.h",)})
ENCODER_VARIANTS: tuple[Variant, ...] = (
    Variant("onnx", CHECKPOINT, "export", "export", ENCODER, verify=True, bench="ort-fp32",
            timed=True),
    Variant("onnx-opt", "onnx", "optimize", "optimize", ENCODER, verify=True,
            bench="ort-optimized", timed=True),
    Variant("onnx-int8", "onnx-opt", "quantize", "quantize", ENCODER, ENCODER_INT8,
            bench="ort-int8", timed=True),
)
# An encoder-decoder checkpoint's rows (tinyt train --task seq2seq, or an imported Marian, BART,
# mBART, M2M100 / NLLB, T5): each directory Optimum's three graphs (export/seq2seq_export.py),
# quantized by one recipe, each quantization reported by chrF / BLEU of its greedy outputs
# against fp32's on held-out pairs (export/seq2seq_accuracy.py); no shared-cache pair.
#   checkpoint ─export─▶ onnx ─optimize─▶ onnx-opt ─quantize─▶ onnx-int8, onnx-int4
#                         └─quantize static─▶ onnx-int8-static   onnx-opt ─qgemm─▶ onnx-int8-qgemm
#                                                                  (by hand)
SEQ2SEQ_VARIANTS: tuple[Variant, ...] = (
    Variant("onnx", CHECKPOINT, "export", "export", SEQ2SEQ, verify=True),
    Variant("onnx-opt", "onnx", "optimize", "optimize", SEQ2SEQ, verify=True),
    Variant("onnx-int8", "onnx-opt", "quantize", "quantize", SEQ2SEQ, data=True),
    Variant("onnx-int4", "onnx-opt", "quantize", "quantize-int4", SEQ2SEQ,
            {"bits": 4, "block_size": INT4_BLOCK}, data=True),
    Variant("onnx-int8-qgemm", "onnx-opt", "quantize", "quantize-qgemm", SEQ2SEQ,
            {"kernel": "qgemm"}, data=True, made_by="hand",
            note="int8 GEMMs (DynamicQuantizeMatMul, activations per tensor): `tinyt quantize "
                 "OUT/onnx-opt OUT/onnx-int8-qgemm --kernel qgemm`"),
    Variant("onnx-int8-static", "onnx", "quantize", "quantize-static", SEQ2SEQ,
            {"mode": "static"}, data=True, made_by="hand",
            note="static (QDQ) INT8, activation ranges calibrated on training pairs: `tinyt "
                 "quantize OUT/onnx OUT/onnx-int8-static --mode static`; not built by the "
                 "pipeline, as for decoders (one scale per activation tensor)"),
)
BY_DIR: Mapping[str, Variant] = MappingProxyType({v.dir: v for v in VARIANTS})


def variant(name: str) -> Variant:
    """The row of directory `name`."""
    if name not in BY_DIR:
        raise ValueError(f"no artifact variant {name!r}; known: {', '.join(BY_DIR)}")
    return BY_DIR[name]


def made_by(maker: str) -> tuple[Variant, ...]:
    """The rows `maker` makes, in making order."""
    if maker not in MAKERS:
        raise ValueError(f"maker {maker!r} is not one of {', '.join(MAKERS)}")
    return tuple(v for v in VARIANTS if v.made_by == maker)


def rows_for(kind: str) -> tuple[Variant, ...]:
    """The rows the pipeline makes for a checkpoint whose graph is `kind` (tinyt.contract), in
    making order."""
    if kind == ENCODER:
        return ENCODER_VARIANTS
    if kind == DECODER_WITH_PAST:
        return made_by("pipeline")
    if kind == SEQ2SEQ:
        return tuple(v for v in SEQ2SEQ_VARIANTS if v.made_by == "pipeline")
    raise ValueError(f"the pipeline takes a language model ({DECODER_WITH_PAST}), a sentence "
                     f"encoder ({ENCODER}) or an encoder-decoder ({SEQ2SEQ}) checkpoint, not a "
                     f"{kind}; run export, optimize and quantize on it one by one "
                     "(docs/encoders.md)")


def arguments(v: Variant, root: Path, *, checkpoint: Path | None = None,
              data: str | None = None) -> tuple[Path, Path, dict[str, object]]:
    """(source, out, keywords) of the stage call that makes `v` under `root`; `checkpoint`
    replaces root/checkpoint (the pipeline's --skip-train)."""
    source = checkpoint if (v.source == CHECKPOINT and checkpoint is not None) \
        else root / v.source
    keywords: dict[str, object] = dict(v.options)
    if v.prefill_from is not None:
        keywords["prefill_from"] = root / v.prefill_from
    if v.data:
        keywords["data"] = data
    return source, root / v.dir, keywords
