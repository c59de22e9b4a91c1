"""`tinyt optimize SRC OUT --target gqa`: the shared-cache variant of a cpu-optimized decoder
artifact (fp32 or quantized) as an artifact of graph kind 'decoder_gqa', written after it is
checked against its source (export/shared_cache_checks.py): logits of ragged prompts and of
decode steps within fp32 rounding (compare.reorder_bound), and the same greedy tokens from
the runtime. The graph rewrite is
export/gqa_graph.py; runtime/cache.py runs it.

    SRC (decoder_with_past) ──gqa_graph.to_gqa──▶ model.onnx ─┐
    [PREFILL_FROM ──gqa_graph.to_gqa──▶ prefill.onnx] ────────┴─checks─▶ OUT + manifest

With kv_cache int8 (export/kv_int8.py) the checked graphs are then rewritten to int8 caches
with scales calibrated on the step graph, the same scales in both graphs of a pair (they
share the buffers), and checked against their float32-cache form.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from tinyt.contract import DECODER_WITH_PAST, ONNX_FILE, SHARED_CACHE_KIND
from tinyt.errors import SharedCacheError
from tinyt.graphio import copy_graph, save_graph
from tinyt.manifest import Artifact, Manifest
from tinyt.recipe import KVCacheRecipe

from .gqa_graph import to_gqa
from .shared_cache_checks import _gqa_model, check_against_source, check_pair, fp32_lineage
from .stage import Built, open_source, source_graph, source_versions, write_artifact

PREFILL_FILE = "prefill.onnx"
RANGE = {"per-channel": "kv head and channel", "per-tensor": "tensor"}  # an int8 cache's scales
RULE = {"max": "max |x| per {} (keys: of their rotary pairs' norms) x {}, / 127; beyond: "
               "clipped",
        "mse": "per {}, the range of least squared int8 error over the calibration (keys at "
               "positions drawn over the context) among 0.50-1.00 x its max |x|, / 127; "
               "beyond: clipped"}


def _convert(src: Artifact, tmp: Path, name: str) -> tuple[Path, dict]:
    """(converted graph, its check against the source)."""
    src_dir, manifest, cfg = src.path, src.manifest, src.config
    if manifest.graph != DECODER_WITH_PAST or manifest.fixed_shape:
        raise SharedCacheError(f"{src_dir} holds a {manifest.graph!r} graph"
                               f"{' with pinned shapes' if manifest.fixed_shape else ''};"
                               " the shared-cache variant is made from a KV-cache decoder with "
                               "dynamic shapes")
    proto = source_graph(src)
    layers = to_gqa(proto, cfg)
    if layers != cfg.n_layer:
        raise SharedCacheError(
            f"{src_dir}: attention with a KV cache in {layers} of {cfg.n_layer} layers; make the "
            "variant from the output of `tinyt optimize --target cpu` (or its quantized form)")
    path = tmp / name
    save_graph(proto, path)
    ops = {n.op_type for n in proto.graph.node}
    return path, check_against_source(src_dir, path, cfg, ops)


def shared_cache(src_dir: str | os.PathLike, out_dir: str | os.PathLike, *,
                 prefill_from: str | os.PathLike | None = None,
                 kv_cache: KVCacheRecipe | None = None, kv_data: str | None = None) -> Built:
    """Write the shared-cache (GroupQueryAttention) variant of a cpu-optimized decoder
    artifact, fp32 or quantized; checked against its source first. Returns out_dir.

    prefill_from: another artifact of the same model (e.g. `quantize --kernel qgemm`, whose
    int8 GEMMs are fast over a prompt's rows) whose converted graph runs the prompts, while
    src's runs the decode steps; both read and write one cache (runtime/cache.py).
    kv_cache: what the cache holds (tinyt.recipe.KVCacheRecipe; None: float32); int8 is
    calibrated on the training split of kv_data (as quantize's data; None: the corpus the
    source's quantization read, else the built-in one)."""
    kv_cache = kv_cache or KVCacheRecipe()
    src = open_source(src_dir, out_dir)
    src_dir, manifest, cfg = src.path, src.manifest, src.config
    with tempfile.TemporaryDirectory() as tmp:
        path, worst = _convert(src, Path(tmp), ONNX_FILE)
        graphs = [path]
        extra = {"graph": SHARED_CACHE_KIND, "opset": manifest.record("opset"),
                 "layers": cfg.n_layer, "equivalence": worst, **manifest.records("quantization"),
                 **({"source_accuracy": manifest.accuracy} if manifest.accuracy else {}),
                 "versions": source_versions(src)}
        if prefill_from is not None:
            prefill_from = Path(prefill_from)
            prefill = open_source(prefill_from)
            if prefill.config != cfg or (prefill_from / "tokenizer.json").read_bytes() != \
                    (src_dir / "tokenizer.json").read_bytes():
                raise SharedCacheError(f"{prefill_from} is not the same model as {src_dir} "
                                       "(config or tokenizer differ)")
            if origin(prefill.manifest) != origin(manifest):
                raise SharedCacheError(f"{prefill_from} is not the same model as {src_dir}: "
                                       "their lineages lead to different checkpoints")
            p_path, p_worst = _convert(prefill, Path(tmp), PREFILL_FILE)
            graphs.append(p_path)
            extra.update(prefill_model_file=PREFILL_FILE, prefill_source={
                "path": str(prefill_from.resolve()), "manifest": dict(prefill.manifest.data)},
                prefill_equivalence=p_worst,
                prefill_quantization=prefill.manifest.quantization,
                **({"prefill_accuracy": prefill.manifest.accuracy}
                   if prefill.manifest.accuracy else {}),
                pair=check_pair(src_dir, path, p_path, cfg, prefill.manifest.quantization))
        if kv_cache.quantized:
            if kv_data is None:
                kv_data = manifest.options.get("data")
            extra["kv_cache"] = _int8_cache(src, path, graphs[1] if len(graphs) > 1 else None,
                                            extra.get("prefill_quantization"), kv_cache, kv_data)
        if manifest.accuracy:  # a quantized source: this artifact's own report
            extra["accuracy"] = _own_accuracy(src, path, graphs[1] if len(graphs) > 1 else None,
                                              extra.get("prefill_quantization"))
        return write_artifact(out_dir, src, graphs, stage="shared-cache", options={
            "level": manifest.options.get("level"),
            "prefill_from": None if prefill_from is None else str(prefill_from),
            "kv_cache": kv_cache.to_json()},
            extra=extra, genai=False)


def _int8_cache(src: Artifact, path: Path, prefill: Path | None,
                prefill_quantization: dict | None, recipe: KVCacheRecipe,
                data: str | None) -> dict:
    """Calibrate the int8 cache's scales on the float32-cache graph(s), rewrite them in place,
    check the result against them (export/kv_int8.py); the manifest's "kv_cache" record."""
    import onnx

    from . import kv_int8

    cfg = src.config
    fp32 = _gqa_model(src.path, path, cfg, prefill, prefill_quantization)
    rows = kv_int8.calibration_rows(fp32.tokenizer, cfg, data)
    proto = onnx.load(str(path), load_external_data=False)  # the rotary tables' shapes
    ranges, maxima = kv_int8.kv_ranges(fp32, proto, rows, recipe)
    kv_scales, step = kv_int8.scales(ranges, recipe), kv_int8.largest_step(ranges, maxima)
    checks = kv_int8.check_rows(fp32.tokenizer, cfg, data)
    with tempfile.TemporaryDirectory() as tmp:  # the float32 graphs, for the check
        graphs = [p for p in (path, prefill) if p is not None]
        keep = [copy_graph(p, tmp)[0] for p in graphs]
        for p in graphs:
            kv_int8.write_int8(p, kv_scales, recipe)
        ref = _gqa_model(src.path, keep[0], cfg, keep[1] if prefill else None,
                         prefill_quantization)
        int8 = _gqa_model(src.path, path, cfg, prefill, prefill_quantization)
        check = kv_int8.check_int8(ref, int8, cfg, step, checks)
    return {**recipe.to_json(), "calibration": {
        "data": data or "built-in corpus", "split": "train", "windows": len(rows),
        "tokens": sum(map(len, rows)),
        "rule": RULE[recipe.clip].format(RANGE[recipe.scales], recipe.margin),
        "largest_step": step},
        "check": check}


def _own_accuracy(src: Artifact, path: Path, prefill: Path | None,
                  prefill_quantization: dict | None) -> dict:
    """The accuracy report of the converted artifact itself (export/accuracy.py
    runtime_lm_accuracy) against the fp32 graph its source was quantized from, on the text its
    source's report read: a pair's prompts run through its prompt graph, so its figures are
    not its step graph's."""
    from tinyt.runtime.session import graph_session

    from .accuracy import runtime_lm_accuracy

    fp32 = fp32_lineage(src.path)
    data = src.manifest.options.get("data")
    lm = _gqa_model(src.path, path, src.config, prefill, prefill_quantization)
    ref = graph_session((fp32 or src.path) / ONNX_FILE, level="all")
    report = runtime_lm_accuracy(ref, lm, src.config, DECODER_WITH_PAST, lm.tokenizer, data)
    # where the fp32 graph is gone, the change is from the quantized source, and says so
    return {**report, "reference": str(fp32 or src.path),
            "reference_kind": "fp32" if fp32 else "the quantized source (its fp32 graph is gone)"}


def origin(manifest: Manifest) -> dict | None:
    """The checkpoint an artifact was exported from (its files' sha256), following the
    manifests' lineage back through every stage."""
    source: Any = manifest.source
    for _ in range(32):
        if source.get("kind") == "checkpoint":
            return source.get("sha256")
        source = source.get("manifest", {}).get("source", {})
    return None
