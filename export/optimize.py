"""Graph optimization: artifact directory in, optimized artifact directory out.

    onnx/ ──target cpu: onnxscript ORT fusions (MultiHeadAttention, SkipLayerNorm, BiasGelu),
                        then the KV cache moved into the attention op (kvfuse.py)──────────┐
          ──target portable: onnxscript generic optimizer (standard ONNX ops only)───────────┤
                                                                                             ▼
          ONNX Runtime offline optimization (basic | extended | all), saved ──▶ encoders
          (target cpu): SkipLayerNorm back to Sum + LayerNorm, optionally the embedding into
          EmbedLayerNormalization (encoder_fusions.py) ──▶ self-check vs the input graph
          (reorder_bound) ──▶ onnx-opt/ + manifest (fused-op counts, worst diffs)

ONNX Runtime's own `transformers.optimizer` never fused attention in these graphs (with either
torch exporter); onnxscript's rewriter on the dynamo export does, so that is the fuser.
"""
from __future__ import annotations

import os
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import onnxscript.optimizer
from onnx import numpy_helper
from onnxscript.rewriter.ort_fusions import optimize_for_ort

from tinyt.contract import (
    CLASSIFIER,
    DECODER_WITH_PAST,
    ENCODER,
    ONNX_FILE,
    SEQ2SEQ,
    SEQ2SEQ_FILES,
    TOKEN_CLASSIFIER,
)
from tinyt.errors import OptimizeError
from tinyt.graphio import CONTRIB_DOMAIN, quantized_ops, save_graph
from tinyt.int8 import fp32_entry
from tinyt.manifest import Artifact, Manifest, manifest_of
from tinyt.rope import is_longrope
from tinyt.runtime.session import graph_session, ort_options

from .compare import compare_graphs, grid, grid_sizes, within_bound
from .cross_groups import group_cross_attention
from .encoder_fusions import embed_layer_norm, unfuse_skip_layer_norms
from .kvfuse import attention_with_past, cross_attention_bnsh
from .seq2seq_checks import (
    CONV_GELU_OPS,
    SPEECH_CONVS,
    attention_report,
    beyond_bound,
    check_cases,
    check_sizes,
    conv_gelus,
    fuses_attention,
    is_speech,
    open_graphs,
)
from .seq2seq_checks import compare_graphs as compare_seq2seq
from .stage import Built, open_source, source_graph, source_versions, write_artifact

TARGETS = ("cpu", "portable", "gqa")  # no cuda: there was no GPU to build it against
LEVELS = ("basic", "extended", "all")  # ONNX Runtime's offline levels (runtime.session.LEVELS)
ATTENTION_OPS = {"MultiHeadAttention", "Attention", "GroupQueryAttention",
                 "PackedMultiHeadAttention"}
CONTRIB = CONTRIB_DOMAIN
GELU_OPS = {"gelu": ("BiasGelu", "Gelu"), "gelu_tanh": ("FastGelu",),  # with / without bias
            "geglu_tanh": ("FastGelu",)}  # Gemma's gate
ENCODER_KINDS = (ENCODER, CLASSIFIER, TOKEN_CLASSIFIER)  # bidirectional, no cache
# An encoder's residual sums + LayerNorm, once fused, are written back as Sum + LayerNorm
# (encoder_fusions.py: ONNX Runtime's fused kernel is 3-5x slower over a batch's rows)
RESIDUAL_SUM = "Sum"
EMBED_LAYER_NORM = f"{CONTRIB}.EmbedLayerNormalization"


def op_counts(proto: onnx.ModelProto) -> Counter:
    return Counter(f"{n.domain + '.' if n.domain else ''}{n.op_type}" for n in proto.graph.node)


def _check_request(src: Path, target: str, level: str, manifest: Manifest, cfg, kind: str,
                   fuse_embedding: bool) -> None:
    if target not in TARGETS:
        raise OptimizeError(f"target={target!r} is not one of {', '.join(TARGETS)}")
    if level not in LEVELS:
        raise OptimizeError(f"level={level!r} is not one of {', '.join(LEVELS)}")
    if target == "portable" and level != "basic":
        raise OptimizeError(f"target='portable' keeps standard ONNX ops only, which ONNX "
                            f"Runtime's level={level!r} does not; use level='basic'")
    if manifest.stage != "export":
        raise OptimizeError(f"{src} was made by stage {manifest.stage!r}; optimize takes "
                            "the output of 'tinyt export' (optimizing twice, or after "
                            "quantization, is not supported)")
    if fuse_embedding:
        _check_embedding_fusion(cfg, kind)


def _check_embedding_fusion(cfg, kind: str) -> None:
    """EmbedLayerNormalization sums a word, a position (and a token-type) row and normalizes
    them with a bias: an encoder with a learned position table and an embedding LayerNorm."""
    why = None
    if kind not in ENCODER_KINDS:
        why = f"it is for encoders; this is a {kind!r} graph"
    elif cfg.pos_encoding != "learned":
        why = (f"pos_encoding={cfg.pos_encoding!r}: the op adds a row of a learned position "
               "table, and this model has none (rotary models such as ModernBERT normalize the "
               "word rows alone: nothing to fuse)")
    elif not cfg.embedding_norm or cfg.norm != "layernorm" or not cfg.bias:
        why = ("the op ends in a LayerNorm with a bias, and this model's embeddings have "
               f"none (embedding_norm={cfg.embedding_norm}, norm={cfg.norm!r}, "
               f"bias={cfg.bias})")
    if why:
        raise OptimizeError(f"fuse_embedding=True needs ONNX Runtime's EmbedLayerNormalization, "
                            f"and {why}; leave fuse_embedding off")


def expected_fusions(cfg, kind: str, fuse_embedding: bool = False
                     ) -> list[tuple[str, tuple[str, ...], int]]:
    """What target 'cpu' must have fused, as (what, ops counted, how many at least)."""
    out = []
    if fuse_embedding:
        out.append(("embedding sum + LayerNorm", (EMBED_LAYER_NORM,), 1))
    if cfg.norm == "rmsnorm":  # ln_1, ln_2 per layer and ln_f; ORT fuses the residual Adds in
        norms = ("SimplifiedLayerNormalization", f"{CONTRIB}.SkipSimplifiedLayerNormalization")
        # the block's norms as the config declares them (Gemma's 4, OLMo-2's 2 after the
        # branches), and q's and k's: one SimplifiedLayerNormalization each (over head_dim or
        # over the whole projection)
        qk = 2 * cfg.n_layer if cfg.qk_norm else 0
        out.append(("RMSNorm" + (f" (with {cfg.qk_norm} q/k norms)" if cfg.qk_norm else ""),
                    norms, cfg.norms_per_block * cfg.n_layer + 1 + qk))
    if cfg.norm_placement == "post":  # BERT's LayerNorm(x + branch): two a layer
        out.append(("post-norm residual + LayerNorm", (f"{CONTRIB}.SkipLayerNormalization",)
                    if kind not in ENCODER_KINDS else (RESIDUAL_SUM,), 2 * cfg.n_layer))
    rotary = sum(cfg.rotary_layer(i) for i in range(cfg.n_layer))
    # LongRoPE's frequencies are chosen per call (short or long by the sequence's length) and
    # its cos and sin scaled: not the constant table RotaryEmbedding's fusion matches, so the
    # contract graph turns q and k with Mul and Add (GroupQueryAttention takes both tables)
    if rotary and not is_longrope(cfg):  # q and k of every layer with rotary (SmolLM3: not all)
        out.append(("rotary positions", (f"{CONTRIB}.RotaryEmbedding",), 2 * rotary))
    # The MLP's activation in one kernel with its bias: BiasGelu (exact erf GELU) or FastGelu
    # (the tanh approximation, GPT-2's gelu_new; Gemma's gate). SwiGLU's SiLU-times-up has no
    # CPU kernel.
    if cfg.activation in GELU_OPS:
        out.append((cfg.activation, tuple(f"{CONTRIB}.{op}" for op in GELU_OPS[cfg.activation]),
                    cfg.n_layer))
    return out


def fused_attention_layers(cfg) -> int:
    """How many layers' attention target 'cpu' fuses: every one, but none whose logits are
    soft-capped (Gemma 2): MultiHeadAttention has no cap, and the one CPU kernel with one,
    GroupQueryAttention, reads a right-padded shared cache, not the contract's left-padded
    past, so the contract graph keeps that attention as MatMul, Tanh and Softmax, and the
    shared-cache target (gqa_graph.py) fuses it."""
    return 0 if cfg.attn_softcap is not None else cfg.n_layer


def moves_cache_into_attention(cfg, kind: str) -> bool:
    """kvfuse.py's rewrite applies to MultiHeadAttention reading the cache it extends: not
    with fewer key/value heads than query heads (the cache is repeated out first), nor with
    rotary positions (RotaryEmbedding sits between the projection and the cache)."""
    return kind == DECODER_WITH_PAST and cfg.kv_heads == cfg.n_head and \
        cfg.pos_encoding != "rotary"


def _check_fusions(cfg, kind: str, counts: Counter, fusions: dict[str, int],
                   fuse_embedding: bool) -> None:
    for what, ops, need in expected_fusions(cfg, kind, fuse_embedding):
        have = sum(counts.get(op, 0) for op in ops)
        if have < need:
            raise OptimizeError(f"{what} fused into {' / '.join(ops)} {have} times where "
                                f"{need} were expected; ops now: {dict(counts)}")
    cached = fusions.get("attention_with_past", 0)
    if moves_cache_into_attention(cfg, kind) and cached < cfg.n_layer:
        raise OptimizeError(f"the KV cache moved into attention in {cached} of {cfg.n_layer} "
                            "layers; the graph around attention is not the shape "
                            "export/kvfuse.py expects")


def _last_axis_as_minus_one(model: ir.Model) -> int:
    """torch writes RMSNorm's mean over the last axis as ReduceMean(axes=[2]); onnxscript's
    SimplifiedLayerNormalization fusion matches axes=[-1] only. Spell a last-axis reduction
    the way the fusion reads it (the same op on the same axis). Returns how many changed."""
    changed = 0
    for node in model.graph:
        if node.op_type != "ReduceMean" or len(node.inputs) < 2 or node.inputs[1] is None:
            continue
        x, axes = node.inputs[0], node.inputs[1].const_value
        rank = None if x is None or x.shape is None else len(x.shape)
        if axes is not None and rank and axes.numpy().tolist() == [rank - 1]:
            minus_one = ir.Value(name=f"{node.name}/last_axis",
                                 const_value=ir.tensor(np.array([-1], dtype=np.int64)))
            model.graph.register_initializer(minus_one)
            node.replace_input_with(1, minus_one)
            changed += 1
    return changed


def _fuse(proto: onnx.ModelProto, target: str) -> tuple[onnx.ModelProto, dict[str, int]]:
    model = ir.from_proto(proto)
    if target == "portable":
        onnxscript.optimizer.optimize(model)  # folding and clean-up, standard ops only
        return ir.to_proto(model), {}
    _last_axis_as_minus_one(model)
    model, counts = optimize_for_ort(model)
    fused = ir.to_proto(model)
    _forget_last_matches()
    counts = {k: v for k, v in counts.items() if v}
    if layers := attention_with_past(fused):
        counts["attention_with_past"] = layers
    return fused, counts


def _forget_last_matches() -> None:
    """onnxscript (0.7) keeps each rewrite rule's last match (its matcher's graph, node and
    match; values its pattern classes store while checking), and its rules are module
    globals: the IR graph outlived the fusion, and with it the source proto whose tensors it
    wraps (4.8 GB at the Llama-3.2-1B shape, held to the end of the process). Drop every IR
    object such a rule or an object it holds keeps in an attribute (match state: each match
    sets it again)."""
    import sys

    from onnxscript.rewriter._basics import MatchResult
    from onnxscript.rewriter._rewrite_rule import RewriteRule

    state = (ir.Value, ir.Node, ir.Graph, ir.Function, ir.Model, MatchResult)
    for name, module in list(sys.modules.items()):
        if not name.startswith("onnxscript.rewriter"):
            continue
        for value in list(vars(module).values()):
            rules = getattr(value, "rules", value)  # a RewriteRuleSet, a list, a rule
            for rule in rules if isinstance(rules, list) else [rules]:
                if not isinstance(rule, RewriteRule):
                    continue
                holders = [rule, *(getattr(v, "__self__", v) for v in vars(rule).values())]
                for holder in holders:
                    for attr, held in list(getattr(holder, "__dict__", {}).items()):
                        if isinstance(held, state):
                            setattr(holder, attr, None)


def refold_transposed_copies(proto: onnx.ModelProto) -> int:
    """Constant folding turns the tied lm_head's Transpose(W) into a second stored matrix.
    Put the Transpose node back wherever one 2-D initializer is another's transpose, so the
    file holds the matrix once (ONNX Runtime may fold it again in memory, at load). Returns
    how many copies were removed.

        W [V, C] ──Transpose──▶ W_T [C, V] ──▶ MatMul      (instead of a stored W_T)
    """
    graph = proto.graph
    two_d = {i.name: i for i in graph.initializer if len(i.dims) == 2}
    by_shape: dict[tuple[int, int], list] = {}
    for init in two_d.values():
        by_shape.setdefault(tuple(init.dims), []).append(init)
    removed = []
    for init in list(two_d.values()):
        a, b = init.dims
        if a == b or init.name in removed:
            continue
        for other in by_shape.get((b, a), []):
            if other.name in removed or other.name == init.name:
                continue
            if np.array_equal(numpy_helper.to_array(init).T, numpy_helper.to_array(other)):
                big, small = (init, other) if init.name < other.name else (other, init)
                # keep the first-named copy; the other becomes Transpose(kept)
                graph.node.insert(0, onnx.helper.make_node(
                    "Transpose", [big.name], [small.name], perm=[1, 0],
                    name=f"/{big.name}/Transpose"))
                removed.append(small.name)
                break
    # in place: copying a TensorProto serializes it, and one over 2 GiB (Phi-4-mini's and
    # Gemma 2 2B's fp32 tables, 2.46 / 2.36 GB) cannot be a protobuf message
    for k in reversed(range(len(graph.initializer))):
        if graph.initializer[k].name in removed:
            del graph.initializer[k]
    return len(removed)


def _ort_offline(src: Path, external: bool, level: str, tmp: Path) -> onnx.ModelProto:
    """Let ONNX Runtime apply its graph optimizations at `level` to the graph saved at `src`
    (its weights beside it where `external`) and save the result."""
    dst = tmp / "ort.onnx"
    # (ort_options logs nothing below errors: level 'all' warns its layouts suit this CPU only)
    opts = ort_options(level=level, optimized_model=dst)
    if external:  # ONNX Runtime writes a big graph's weights beside it too
        opts.add_session_config_entry(
            "session.optimized_model_external_initializers_file_name", dst.name + ".data")
        opts.add_session_config_entry(
            "session.optimized_model_external_initializers_min_size_in_bytes", "0")
    ort.InferenceSession(str(src), opts, providers=["CPUExecutionProvider"])
    optimized = onnx.load(str(dst))
    refold_transposed_copies(optimized)
    return optimized


def optimize(src_dir: str | os.PathLike, out_dir: str | os.PathLike, *, target: str = "cpu",
             level: str = "extended", prefill_from: str | os.PathLike | None = None,
             fuse_embedding: bool = False, kv_cache: str = "float32",
             kv_scales: str = "per-channel", kv_data: str | None = None,
             kv_clip: str = "mse") -> Built:
    """Fuse and optimize an exported graph for `target`; the result is checked against the
    input graph (compare.reorder_bound: fp32 rounding of the model's depth and width, relative
    to each output's size) before the directory is written. Returns out_dir.
    fuse_embedding: an encoder's embedding sum + LayerNorm into ONNX Runtime's
    EmbedLayerNormalization (BERT, DistilBERT, RoBERTa / XLM-R); off by default, being slower
    on CPU than the lookups and LayerNorm it replaces (encoder_fusions.py).
    kv_cache, kv_scales, kv_data, kv_clip: target gqa's cache, float32 or int8 (tinyt.recipe.
    KVCacheRecipe; int8's scales calibrated on kv_data's training split, each channel's range
    by the rule kv_clip: export/kv_int8.py)."""
    from tinyt.recipe import KVCacheRecipe

    src_dir, out_dir = Path(src_dir), Path(out_dir)
    kv = KVCacheRecipe(dtype=kv_cache, scales=kv_scales, clip=kv_clip)
    if (kv.quantized or kv_data is not None) and target != "gqa":
        raise OptimizeError(f"kv_cache={kv_cache!r}, kv_data={kv_data!r}: an int8 KV cache is "
                            "the shared-cache graph's (target 'gqa', a decoder with a KV "
                            f"cache); target {target!r} keeps its source's float cache")
    if fuse_embedding and target != "cpu":
        raise OptimizeError(f"fuse_embedding=True puts in ONNX Runtime's EmbedLayerNormalization "
                            f"(a contrib op) for target 'cpu', not {target!r}")
    if target == "gqa":  # a layout of an optimized (or quantized) graph
        if (manifest_of(Path(src_dir)) or {}).get("graph") == SEQ2SEQ:
            raise OptimizeError(f"{src_dir} is an encoder-decoder (seq2seq) artifact: target "
                                "'gqa' is the decoder-only shared-cache variant; optimize it "
                                "with target 'cpu' or 'portable'")
        from .shared_cache import shared_cache

        return shared_cache(src_dir, out_dir, prefill_from=prefill_from, kv_cache=kv,
                            kv_data=kv_data)
    src = open_source(src_dir, out_dir)
    cfg, kind = src.config, src.kind
    _check_request(src_dir, target, level, src.manifest, cfg, kind, fuse_embedding)
    if kind == SEQ2SEQ:
        return _optimize_seq2seq(src, out_dir, target, level)
    proto = source_graph(src)
    if quantized_ops(n.op_type for n in proto.graph.node):
        raise OptimizeError(f"{src_dir / ONNX_FILE} is already quantized; optimize the fp32 "
                            "export, then quantize")
    fused, fusions = _fuse(proto, target)
    del proto  # each copy of a GPT-2-small graph is 0.5 GB: keep one at a time
    with tempfile.TemporaryDirectory() as tmp:
        saved = Path(tmp) / "fused.onnx"
        external = len(save_graph(fused, saved)) > 1
        del fused  # ONNX Runtime reads the file (Llama-3.2-1B shape: this pass 19.2 -> 14.5 GB)
        optimized = _ort_offline(saved, external, level, Path(tmp))
    if target == "cpu" and kind in ENCODER_KINDS:
        if unfused := unfuse_skip_layer_norms(optimized):
            fusions["skip_layer_norm_as_sum"] = unfused
        if fuse_embedding:
            fusions["embed_layer_norm"] = embed_layer_norm(optimized, cfg)
    counts, contrib = _counted(optimized, cfg, kind, target, fusions, fuse_embedding)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ONNX_FILE
        save_graph(optimized, path)
        del optimized  # the sessions below read the files
        worst = compare_graphs(lambda: graph_session(src.model_path, level="disabled"),
                               lambda: graph_session(path, level="all"), cfg, kind)
        if bad := within_bound(cfg, worst):
            raise OptimizeError("the optimized graph differs from its input beyond fp32 "
                                "rounding (compare.reorder_bound: the largest |value| x depth "
                                f"{cfg.n_layer} x sqrt(width)): " + "; ".join(
                                    f"{n} {w['max_abs']:.3g} > {w['bound']:.3g} (|value| up to "
                                    f"{w['magnitude']:.3g}) at {w['case']}"
                                    for n, w in bad.items()))
        return write_artifact(out_dir, src, [path], stage="optimize", options={
            "target": target, "level": level, **({"fuse_embedding": True} if fuse_embedding
                                                  else {})}, extra={
            "graph": kind, "opset": src.manifest.record("opset"), "io": src.manifest.record("io"),
            "fusions": fusions, "op_counts": dict(sorted(counts.items())),
            "contrib_ops": contrib, "equivalence": {"worst": worst,
                                                    "sizes": grid_sizes(cfg, grid(cfg, kind))},
            "versions": source_versions(src, onnxscript=onnxscript.__version__)})


def _counted(optimized, cfg, kind: str, target: str, fusions: dict,
             fuse_embedding: bool) -> tuple[dict, list[str]]:
    """The optimized graph's op counts and contrib ops, checked: attention fused in every
    layer (but for target portable), the CPU target's fusions as its family declares them, no
    contrib op in a portable graph."""
    counts = op_counts(optimized)
    attention = sum(counts.get(f"{CONTRIB}.{op}", 0) for op in ATTENTION_OPS)
    if target != "portable" and attention < fused_attention_layers(cfg):
        raise OptimizeError(f"attention fused in {attention} of {cfg.n_layer} layers for target "
                            f"{target!r}; ops now: {dict(counts)}")
    if target == "cpu":
        _check_fusions(cfg, kind, counts, fusions, fuse_embedding)
    contrib = sorted(k for k in counts if k.startswith(CONTRIB))
    if target == "portable" and contrib:
        raise OptimizeError(f"the portable graph still holds contrib ops {contrib}")
    return counts, contrib


def _optimize_seq2seq(src: Artifact, out_dir: Path, target: str, level: str) -> Built:
    """An encoder-decoder's three graphs, each fused and optimized as a decoder's graph is
    (the encoder's residual sums + LayerNorm written back as an encoder's are), each checked
    against its source graph (export/seq2seq_checks.py) before the directory is written."""
    cfg = src.config
    protos = open_graphs(src)
    ops = {n.op_type for p in protos.values() for n in p.graph.node}
    if quantized_ops(ops):
        raise OptimizeError(f"{src.path} is already quantized; optimize the fp32 export, then "
                            "quantize")
    records: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for role, file in SEQ2SEQ_FILES.items():
            fused, fusions = _fuse(protos.pop(role), target)
            if bnsh := cross_attention_bnsh(fused):  # cached cross keys / values read in place
                fusions["cross_attention_bnsh"] = bnsh
            saved = Path(tmp) / f"fused-{file}"
            external = len(save_graph(fused, saved)) > 1
            del fused  # one graph's copies at a time
            optimized = _ort_offline(saved, external, level, Path(tmp))
            if target == "cpu" and role == "encoder" and \
                    (unfused := unfuse_skip_layer_norms(optimized)):
                fusions["skip_layer_norm_as_sum"] = unfused
            if role == "encoder" and is_speech(cfg):
                fusions["conv_gelu"] = conv_gelus(optimized)
            if role == "decoder_with_past" and (groups := group_cross_attention(optimized)):
                fusions["cross_attention_groups"] = groups  # a source's cache once for its beams
            counts = op_counts(optimized)
            records[file] = {"fusions": fusions, "op_counts": dict(sorted(counts.items())),
                             "attention": attention_report(cfg, role, optimized)}
            paths[role] = Path(tmp) / "out" / file
            paths[role].parent.mkdir(exist_ok=True)
            save_graph(optimized, paths[role])
            del optimized
        _check_seq2seq_fusions(cfg, target, records)
        worst = compare_seq2seq({r: src.path / f for r, f in SEQ2SEQ_FILES.items()}, paths, cfg,
                                lambda p: graph_session(p, level="all"))
        if bad := beyond_bound(worst):
            raise OptimizeError("the optimized graphs differ from their inputs beyond fp32 "
                                "rounding (compare.reorder_bound): " + "; ".join(bad))
        contrib = sorted({k for r in records.values() for k in r["op_counts"]
                          if k.startswith(CONTRIB)})
        return write_artifact(out_dir, src, list(paths.values()), stage="optimize", options={
            "target": target, "level": level}, extra={
            "graph": SEQ2SEQ, "opset": src.manifest.record("opset"),
            "io": src.manifest.record("io"),
            "fusions": {f: r["fusions"] for f, r in records.items()},
            "attention": {f: r["attention"] for f, r in records.items()},
            "op_counts": {f: r["op_counts"] for f, r in records.items()},
            "contrib_ops": contrib, "int8": {f: fp32_entry() for f in SEQ2SEQ_FILES.values()},
            "equivalence": {"worst": worst, "sizes": check_sizes(cfg, check_cases(cfg))},
            "versions": source_versions(src, onnxscript=onnxscript.__version__)})


def _check_seq2seq_fusions(cfg, target: str, records: dict[str, dict]) -> None:
    """Target 'cpu': every attention fused where ONNX Runtime's MultiHeadAttention can hold
    it (seq2seq_checks.fuses_attention), the decoder's cache moved into it in the stepping
    graph; target 'portable': no contrib op at all."""
    if target == "portable":
        contrib = sorted({k for r in records.values() for k in r["op_counts"]
                          if k.startswith(CONTRIB)})
        if contrib:
            raise OptimizeError(f"the portable graphs still hold contrib ops {contrib}")
        return
    encoder = records[SEQ2SEQ_FILES["encoder"]]
    if is_speech(cfg) and encoder["fusions"]["conv_gelu"] < SPEECH_CONVS:
        raise OptimizeError(f"{SEQ2SEQ_FILES['encoder']}: the convolutions' GELU fused into "
                            f"{' / '.join(CONV_GELU_OPS)} {encoder['fusions']['conv_gelu']} "
                            f"times where {SPEECH_CONVS} were expected; ops now: "
                            f"{encoder['op_counts']}")
    if not fuses_attention(cfg):
        return
    for file, r in records.items():
        short = {k: v for k, v in r["attention"].items()
                 if int(v.split(" of ")[0]) < int(v.split(" of ")[1])}
        if short:
            raise OptimizeError(f"{file}: attention fused in {short} layers for target "
                                f"{target!r}; ops now: {r['op_counts']}")
    with_past = records[SEQ2SEQ_FILES["decoder_with_past"]]["fusions"]
    if cfg.kv_heads == cfg.n_head and with_past.get("attention_with_past", 0) < cfg.decoder_layers:
        raise OptimizeError(f"{SEQ2SEQ_FILES['decoder_with_past']}: the decoder's cache moved "
                            f"into attention in {with_past.get('attention_with_past', 0)} of "
                            f"{cfg.decoder_layers} layers; the graph around attention is not "
                            "the shape export/kvfuse.py expects")
