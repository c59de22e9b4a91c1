"""Quantization: artifact directory in, quantized artifact directory out.

    onnx/ or onnx-opt/ ──block-quantize weight matmuls + the tied table (blockquant.py)──▶
        accuracy vs the input graph on held-out corpus data ──▶ onnx-int8/ + manifest

mode 'dynamic' (default): weights int8 (or int4), activations quantized to int8 at run time by
MatMulNBits (accuracy_level 4), so products use the CPU's int8 dot-product units.
mode 'weight-only': the same weights, products in fp32 (accuracy_level 0).
mode 'static': QDQ with activation ranges calibrated on the training split (qdq.py: decoder
windows, or an encoder's or classifier's texts fed as the runtime feeds them); standard ONNX
ops, from the plain export; settings from the CPU's INT8 preset (tinyt.hardware).

An encoder (sentence embeddings) takes every mode and kernel; its accuracy report is cosine
similarity to the source's embeddings and retrieval recall@10 on queries and passages drawn
from the standard library's docstrings (accuracy.encoder_accuracy), not held-out corpus text.
A classifier's (sequence or token) is label agreement with the source on built-in text, which
needs no labels, with accuracy beside it where labelled data applies (accuracy.classifier_report).
An encoder-decoder's three graphs take one recipe (seq2seq_quantize.py); its report is chrF /
BLEU of its greedy outputs against the source's on held-out pairs (seq2seq_accuracy.py), or a
Whisper's, token agreement and WER of its transcripts against the source's (speech_accuracy.py).
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import onnx

from tinyt import int8
from tinyt.contract import (
    CLASSIFIER,
    ENCODER,
    ONNX_FILE,
    SEQ2SEQ,
    SEQ2SEQ_FILES,
    TOKEN_CLASSIFIER,
)
from tinyt.errors import QuantizeError
from tinyt.graphio import CONTRIB_DOMAIN, check_graph, graph_files, quantized_ops, save_graph
from tinyt.hardware import int8_preset, saturates_here
from tinyt.manifest import Artifact, Manifest
from tinyt.recipe import DEFAULT_BLOCK, SPEECH_BLOCK, QuantRecipe
from tinyt.runtime.feeds import check_tokens
from tinyt.runtime.session import graph_session
from tinyt.tokenizer import Tokenizer

from .accuracy import classifier_report, encoder_accuracy, lm_accuracy
from .blockquant import QuantReport, quantize_weights
from .qdq import calibration_batches, quantize_qdq
from .seq2seq_accuracy import seq2seq_report
from .seq2seq_checks import is_speech, open_graphs
from .seq2seq_quantize import graph_recipe, quantize_graphs
from .speech_accuracy import speech_report
from .stage import Built, open_source, source_graph, source_versions, write_artifact
from .text_batches import TEXT_KINDS


def _check_source(src: Path, manifest: Manifest, proto: onnx.ModelProto, kind: str,
                  recipe: QuantRecipe, data: str | None) -> None:
    """Every refusal of a (valid) recipe for this source, made before any work, each naming
    what is allowed."""
    ops = {n.op_type for n in proto.graph.node}
    if manifest.stage == "quantize" or quantized_ops(ops):
        raise QuantizeError(f"{src} is already quantized ({quantized_ops(ops)}); "
                            "quantize the fp32 export or optimized graph")
    if "EmbedLayerNormalization" in ops:
        raise QuantizeError(f"{src} holds EmbedLayerNormalization (optimize "
                            "--fuse-embedding), whose tables quantization does not read (they "
                            "would stay fp32); quantize the graph optimized without "
                            "--fuse-embedding")
    if recipe.static and manifest.stage != "export":
        why = ("the optimized graph's constant folding turns computed matmuls (ModernBERT's "
               "rotary positions x frequencies) into matmuls of an initializer, which static "
               "quantization would take for weights" if kind in TEXT_KINDS else
               "ONNX Runtime's quantizer cannot infer shapes through fused contrib ops")
        raise QuantizeError(f"static (QDQ) quantization takes the plain export, not the output "
                            f"of stage {manifest.stage!r}: {why}")
    if not recipe.static and manifest.options.get("target") == "portable":
        raise QuantizeError(f"{src} is a 'portable' graph (standard ONNX ops only), and this "
                            "quantization uses ONNX Runtime contrib ops; quantize the export "
                            "or the 'cpu' optimized graph")
    if data is not None and kind == TOKEN_CLASSIFIER:
        raise QuantizeError(f"{src} is a token classifier: its report is label agreement with "
                            "the source on built-in text, and no labelled data format holds a "
                            f"label per token, so data={data!r} does not apply; leave it out")
    if data is not None and kind == ENCODER:
        raise QuantizeError(f"{src} is an encoder: its accuracy report reads queries and "
                            "passages drawn from the standard library's docstrings "
                            "(tinyt.export.retrieval_set), so data="
                            f"{data!r} (a corpus or classification directory) does not apply; "
                            "leave it out")


def quantize(src_dir: str | os.PathLike | Artifact, out_dir: str | os.PathLike, *, bits: int = 8,
             block_size: int | None = None, mode: str = "dynamic",
             exclude: list[str] | tuple[str, ...] = (), data: str | None = None,
             calibration: str = "minmax", per_channel: bool = True,
             reduce_range: bool | None = None, search: dict | None = None,
             kernel: str = "nbits", keep_8bit: list[str] | tuple[str, ...] = (),
             scheme: str | None = None, scale_search: bool | None = None,
             gguf_blocks: bool = False, awq: bool = False,
             max_bytes: int | None = None, activations: str = "float") -> Built:
    """Quantize an artifact's weights and measure the accuracy change against it on held-out
    data (`data`: the corpus or classification directory; default the built-in one). The
    keywords make one QuantRecipe (tinyt/recipe.py), which says what each allows; block_size
    None: DEFAULT_BLOCK, or SPEECH_BLOCK for a speech artifact's 8-bit tables. Static
    mode calibrates on the training split of the same corpus; reduce_range=None takes this
    CPU's preset. keep_8bit (bits=4): modules kept at 8 bits, e.g. 'lm_head' (the tied table
    then 8-bit for both its readers: export/blockquant.py). scheme / scale_search: how a
    block's values map to levels (tinyt.recipe.SCHEMES: symmetric, symmetric-full,
    asymmetric with zero points; the least-squared-error scale per block); None takes
    tinyt.recipe.DEFAULT_SCHEME for the bits (4: asymmetric with the search, 8: symmetric).
    gguf_blocks: the weights a GGUF import kept as Q4_0 / Q4_1 / Q8_0 blocks become
    MatMulNBits tables of those blocks, not quantized again (export/gguf_blocks.py); the
    others follow the recipe; activations='q8' (with gguf_blocks, mode weight-only) rounds
    the activations before each carried table as llama.cpp does for its integer products
    (export/gguf_activations.py), so the graph computes llama.cpp's numbers. awq (bits=4):
    activation-aware scales per input channel, searched on each matmul's output error over
    calibration windows of the training split (export/awq.py); max_bytes (bits=4): the weight
    tables whose 4 bits move the logits most kept at 8 bits while the model file stays within
    these bytes (export/mixed.py)."""
    src = open_source(src_dir, out_dir)  # an Artifact already opened: not hashed again
    src_dir, out_dir = src.path, Path(out_dir)
    manifest = src.manifest
    cfg, kind = src.config, src.kind
    if block_size is None:
        block_size = SPEECH_BLOCK if is_speech(cfg) and bits == 8 else DEFAULT_BLOCK
    preset = int8_preset()
    if reduce_range is not None:
        preset = {**preset, "reduce_range": reduce_range}
    recipe = QuantRecipe.request(
        mode=mode, bits=bits, block_size=block_size, kernel=kernel, exclude=exclude,
        keep_8bit=keep_8bit, scheme=scheme, scale_search=scale_search,
        reduce_range=bool(preset["reduce_range"]), calibration=calibration,
        per_channel=per_channel, activation_type=str(preset["activation_type"]), awq=awq,
        max_bytes=max_bytes, activations=activations)
    _refuse_what_does_not_apply(recipe, kind, gguf_blocks)
    if kind == SEQ2SEQ:
        return _quantize_seq2seq(src, out_dir, recipe, preset, data)
    proto = source_graph(src)
    _check_source(src_dir, manifest, proto, kind, recipe, data)
    gguf = _gguf_blocks(src_dir, recipe) if gguf_blocks else None
    exactness = _exactness(recipe, kernel, mode)
    # whether a row's outputs are independent of the other rows of its batch (no activation
    # scale is shared between rows): serving may then batch prompts, the accuracy check too
    independent = recipe.rows_independent
    tokenizer = Tokenizer.from_file(src_dir / "tokenizer.json")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ONNX_FILE
        report, calibrated = _quantized_graph(src, proto, path, recipe, tokenizer, data, gguf)
        accuracy = _accuracy(src, path, tokenizer, data, independent)
        src_bytes, out_bytes = _bytes(src.model_path), _bytes(path)
        # "options": the keys this stage has always written (QuantRecipe.from_manifest reads
        # each form); "quantization"."recipe": the recipe whole, which later stages carry
        return write_artifact(out_dir, src, [path], stage="quantize", options={
            **recipe.options(), "data": data,
            **({"hardware_preset": preset} if recipe.static else {})},
            extra={
            "graph": kind, "opset": manifest.record("opset"), "io": manifest.record("io"),
            "quantization": {
                **_record(report, recipe, src_bytes, out_bytes, calibrated),
                "rows_independent": independent,
                **({"calibration_window": check_tokens(cfg)} if recipe.static else {}),
                **({"gguf_blocks": {"carried": report.carried, "not_carried": report.not_carried,
                                    "activations_rounded": report.rounded,
                                    "norms_in_double": report.double_norms}}
                   if gguf_blocks else {}),
            },
            "int8": {ONNX_FILE: exactness},
            "accuracy": accuracy, **({"search": search} if search else {}),
            "versions": source_versions(src)})


def _refuse_what_does_not_apply(recipe: QuantRecipe, kind: str, gguf_blocks: bool) -> None:
    if recipe.activations != "float" and not gguf_blocks:
        raise QuantizeError(f"activations={recipe.activations!r} rounds the activations of "
                            "carried GGUF tables as llama.cpp does: it needs gguf_blocks")
    if recipe.calibrated and (kind in TEXT_KINDS or kind == SEQ2SEQ or gguf_blocks):
        what = "gguf_blocks, which carries the stored blocks" if gguf_blocks else kind
        raise QuantizeError(f"awq={recipe.awq}, max_bytes={recipe.max_bytes}: calibrated 4-bit "
                            f"weights are for a decoder's graph (its logits score each table), "
                            f"not {what}")


def _record(report, recipe: QuantRecipe, src_bytes: int, out_bytes: int,
            calibrated: Any) -> dict:
    """The manifest's "quantization" record of a decoder's or an encoder's graph: what was
    quantized, kept, shared, its sizes and recipe."""
    return {"quantized": report.quantized, "excluded": report.excluded,
            "skipped": report.skipped, "shared_tables": report.shared_tables,
            **({"kept_8bit": report.kept_8bit} if report.kept_8bit else {}),
            "contrib_domain": CONTRIB_DOMAIN, "bytes": out_bytes,
            "bytes_of_source": src_bytes, "size_ratio": out_bytes / src_bytes,
            "recipe": recipe.to_json(),
            **({"calibration_set": calibrated} if calibrated else {}),
            **({"calibrated_4bit": report.calibrated} if recipe.calibrated else {})}


def _exactness(recipe: QuantRecipe, kernel: str, mode: str) -> dict:
    """The recipe's int8 exactness record (tinyt/int8.py); QuantizeError where its 8-bit
    products saturate on this CPU, so that the accuracy check would measure wrong ones."""
    exactness = int8.recipe_entry(recipe)
    if not int8.exact_everywhere(exactness) and saturates_here():
        raise QuantizeError(
            f"8-bit u8 x s8 weights (kernel={kernel!r}, mode={mode!r}, reduce_range=False) "
            "saturate on this CPU (x86 without VNNI / AMX adds pairs of products in 16 bits), "
            "so the accuracy check would measure wrong products: quantize on a CPU with VNNI, "
            "AMX or ARM dot products, or keep 7-bit weights here (the default; exact on every "
            "CPU)")
    return exactness


def _gguf_blocks(src: Path, recipe: QuantRecipe) -> dict:
    """The GGUF import's blocks behind `src` (its lineage's checkpoint), refused where the
    recipe cannot carry them or there are none."""
    from tinyt.hf.gguf import read_blocks

    from .gguf_blocks import BLOCK, checkpoint_of

    if not recipe.block_wise or recipe.block_size != BLOCK:
        raise QuantizeError(f"gguf_blocks carries GGUF's blocks of {BLOCK} into MatMulNBits: "
                            f"it needs mode dynamic or weight-only, kernel nbits, block_size "
                            f"{BLOCK}; this is mode={recipe.mode!r}, kernel={recipe.kernel!r}, "
                            f"block_size={recipe.block_size}")
    checkpoint = checkpoint_of(src)
    blocks = read_blocks(checkpoint) if checkpoint is not None else {}
    if not blocks:
        raise QuantizeError(f"{src} was not exported from a GGUF import with Q4_0 / Q4_1 / "
                            f"Q8_0 blocks (its checkpoint: {checkpoint}); leave gguf_blocks out")
    return blocks


def _quantized_graph(src: Artifact, proto: onnx.ModelProto, path: Path, recipe: QuantRecipe,
                     tokenizer: Tokenizer, data: str | None,
                     gguf: dict | None = None) -> tuple[QuantReport, dict | None]:
    """The source's graph quantized as `recipe` says, written to `path` and checked: what
    was done, and the static recipe's calibration set (else None). QuantizeError where an
    --exclude or --keep-8bit name matches no module, or nothing was quantized."""
    calibrated: dict | None = None
    if recipe.static:
        report, calibrated = quantize_qdq(src.path / ONNX_FILE, path, src.config, src.kind,
                                          tokenizer, recipe, data=data)
    elif recipe.calibrated:
        from .mixed import calibrate

        batches, calibrated = calibration_batches(tokenizer, src.config, src.kind, data)
        rounding, record = calibrate(proto, recipe, batches)
        report = quantize_weights(proto, rounding, gguf)
        report.calibrated = record
        save_graph(proto, path)
        if recipe.max_bytes is not None and _bytes(path) > recipe.max_bytes:
            raise QuantizeError(f"the quantized model is {_bytes(path):,} bytes, beyond "
                                f"max_bytes={recipe.max_bytes:,} (estimated "
                                f"{record['mixed']['estimated_bytes']:,})")
    else:
        report = quantize_weights(proto, recipe, gguf)
        if recipe.activations == "q8":
            report.rounded = _round_activations(proto, report)
        save_graph(proto, path)
    _check_done(recipe, report, src.path / ONNX_FILE)
    check_graph(path)
    return report, calibrated


def _round_activations(proto: onnx.ModelProto, report: QuantReport) -> list[str]:
    """llama.cpp's activation rounding before each carried table, and its RMSNorms' means in
    double (export/gguf_activations.py); QuantizeError where no table was carried."""
    from .gguf_activations import double_norms, round_activations
    from .kvfuse import drop_dead

    carried = dict(c[:-1].split(" (") for c in report.carried)  # "name (Q4_0)"
    rounded = round_activations(proto.graph, carried)
    if not rounded:
        raise QuantizeError("activations='q8' rounds the activations of carried GGUF tables; "
                            f"none was carried: {report.not_carried}")
    drop_dead(proto.graph)  # the q8_1 terms of chains only q8_0 tables read
    report.double_norms = double_norms(proto.graph)  # ggml's mean of squares, in double
    return rounded


def _check_done(recipe: QuantRecipe, report: QuantReport, where: Path) -> None:
    """QuantizeError where an --exclude or --keep-8bit name matched no module, or nothing in
    `where` was quantized."""
    for flag, names, used in (("--exclude", recipe.exclude, report.exclusions_used),
                              ("--keep-8bit", recipe.keep_8bit, report.keep_8bit_used)):
        unused = [e for e in names if e not in used]
        if unused:
            raise QuantizeError(f"{flag} {', '.join(unused)} names no module with weights; "
                                f"modules: {sorted(report.modules)}")
    if not report.quantized:
        raise QuantizeError(f"nothing in {where} was quantized: {report.skipped}")


def _quantize_seq2seq(src: Artifact, out_dir: Path, recipe: QuantRecipe, preset: dict,
                      data: str | None) -> Built:
    """An encoder-decoder's three graphs by one recipe (export/seq2seq_quantize.py), with
    its report: chrF and BLEU of greedy outputs against the source's, token agreement, and
    the next-token measures along held-out targets (export/seq2seq_accuracy.py). The
    quantization record lists each graph's modules as `file: module (op)`."""
    if recipe.static and is_speech(src.config):
        raise QuantizeError("static (QDQ) quantization of a speech (Whisper) artifact is not "
                            "built: its calibration reads text pairs; use the dynamic recipes "
                            "(the default INT8, or --bits 4)")
    protos = open_graphs(src)
    for role, file in SEQ2SEQ_FILES.items():
        _check_source(src.path / file, src.manifest, protos[role], SEQ2SEQ, recipe, data)
    exactness = {f: _exactness(r, r.kernel, r.mode) for f, r in (
        (file, graph_recipe(src, role, recipe)) for role, file in SEQ2SEQ_FILES.items())}
    tokenizer = Tokenizer.from_file(src.path / "tokenizer.json")
    files = list(SEQ2SEQ_FILES.values())
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        reports, calibrated = quantize_graphs(src, protos, out, recipe, tokenizer, data)
        merged = QuantReport(
            quantized=[f"{f}: {q}" for f, r in reports.items() for q in r.quantized],
            excluded=[f"{f}: {q}" for f, r in reports.items() for q in r.excluded],
            skipped={f"{f}: {n}": why for f, r in reports.items() for n, why in r.skipped.items()},
            shared_tables=[f"{f}: {t}" for f, r in reports.items() for t in r.shared_tables],
            kept_8bit=[f"{f}: {q}" for f, r in reports.items() for q in r.kept_8bit],
            exclusions_used=set().union(*(r.exclusions_used for r in reports.values())),
            keep_8bit_used=set().union(*(r.keep_8bit_used for r in reports.values())),
            modules=set().union(*(r.modules for r in reports.values())))
        _check_done(recipe, merged, src.path)
        graphs = {r: out / f for r, f in SEQ2SEQ_FILES.items()}
        accuracy = speech_report(src, graphs, tokenizer, data) if is_speech(src.config) else \
            seq2seq_report(src, graphs, tokenizer, data, rows_independent=recipe.rows_independent)
        src_bytes = sum(_bytes(src.path / f) for f in files)
        out_bytes = sum(_bytes(out / f) for f in files)
        return write_artifact(out_dir, src, [out / f for f in files], stage="quantize", options={
            **recipe.options(), "data": data,
            **({"hardware_preset": preset} if recipe.static else {})},
            extra={
            "graph": SEQ2SEQ, "opset": src.manifest.record("opset"),
            "io": src.manifest.record("io"),
            "quantization": {
                "quantized": merged.quantized, "excluded": merged.excluded,
                "skipped": merged.skipped, "shared_tables": merged.shared_tables,
                **({"kept_8bit": merged.kept_8bit} if recipe.keep_8bit else {}),
                "contrib_domain": CONTRIB_DOMAIN, "bytes": out_bytes,
                "bytes_of_source": src_bytes, "size_ratio": out_bytes / src_bytes,
                "rows_independent": recipe.rows_independent, "recipe": recipe.to_json(),
                **({"calibration_set": calibrated} if calibrated else {})},
            "int8": exactness, "accuracy": accuracy,
            "versions": source_versions(src)})


def _accuracy(src: Artifact, path: Path, tokenizer: Tokenizer, data: str | None,
              independent: bool) -> dict[str, Any]:
    """The quantized graph at `path` against its source on held-out data, by the graph's
    kind: label agreement (classifiers), embeddings and retrieval (encoders), or the
    language model's metrics (accuracy.py)."""
    cfg, kind = src.config, src.kind
    ref = graph_session(src.path / ONNX_FILE, level="all")
    cand = graph_session(path, level="all")
    if kind in (CLASSIFIER, TOKEN_CLASSIFIER):
        return classifier_report(ref, cand, cfg, kind, tokenizer, src.block["labels"], data,
                                 rows_independent=independent)
    if kind == ENCODER:
        return encoder_accuracy(ref, cand, src, tokenizer, rows_independent=independent)
    return lm_accuracy(ref, cand, cfg, kind, tokenizer, data, rows_independent=independent)


def _bytes(model: Path) -> int:
    """A model's size on disk, its external data included."""
    return sum(f.stat().st_size for f in graph_files(model))
