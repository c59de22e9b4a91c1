"""The shared-cache decoder variant: MultiHeadAttention with past/present becomes
GroupQueryAttention on one buffer per layer (runtime/cache.py has the I/O and why).

Per layer, from the graph `tinyt optimize --target cpu` makes (fp32 or quantized):

    x ─MatMul(W_qkv)─ qkv ─Split─ q, k, v ─▶ MHA(q, k, v, bias, mask, past_k, past_v)
                                                 ─▶ out, present.i.key, present.i.value
to
    x ─MatMul(W_qkv)─ qkv ─Add(bias)─▶ GQA(qkv packed, past_k, past_v, seqlens_k,
                                            total_sequence_length, query_seqlens)
                                                 ─▶ out, present.i.key, present.i.value

the attention-mask subgraph goes (GroupQueryAttention is causal over each row's own
tokens), and the lm_head reads one position per row:

    hidden [B, S, C] ─GatherND(query_seqlens - 1, batch_dims=1)─Unsqueeze─ [B, 1, C] ─lm_head─▶

`shared_cache(src, out)` writes the variant as an artifact (graph kind 'decoder_gqa') after
checking it against its source: logits of ragged prompts and of decode steps within
OPT_ATOL, and the same greedy tokens from the runtime.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from tinyt.contract import CAPACITY, ONNX_FILE, SHARED_CACHE_KIND
from tinyt.errors import SharedCacheError
from tinyt.fsutil import atomic_dir
from tinyt.graphio import copy_graph, save_graph
from tinyt.manifest import check_manifest, check_output_dir, read_model_config, write_manifest
from tinyt.runtime.feeds import prefill_feeds
from tinyt.runtime.session import UNFUSED

from .compare import OPT_ATOL, first_difference
from .kvfuse import drop_dead, producers
from .stage import built, copy_artifact_files, open_source

MS = "com.microsoft"
GQA_INPUTS = (("seqlens_k", TensorProto.INT32, ["batch_size"]),
              ("total_sequence_length", TensorProto.INT32, []),
              ("query_seqlens", TensorProto.INT32, ["batch_size"]))
# A quantized source quantizes activations to int8 at run time (MatMulNBits accuracy_level 4):
# the two layouts' fp32 rounding differs in the last bits (attention sums in another order),
# and now and then that moves an activation across an int8 rounding step. Measured on the demo
# INT8 graph: 0.017 at worst, against INT8's own distance from fp32 of ~1.
QUANT_ATOL = 0.1
QUERY_SEQLENS_INPUT = 16  # GroupQueryAttention's input index of query_seqlens (ORT >= 1.2x)
ROTARY_HEAD_MULTIPLE = 16  # GroupQueryAttention's CPU rotary: head_size % 16 == 0


def to_gqa(proto: onnx.ModelProto, cfg) -> int:
    """Rewrite `proto` in place (see the module docstring); returns the layers rewritten."""
    if cfg.pos_encoding == "rotary" or cfg.kv_heads != cfg.n_head:
        done = _cache_outside_attention_to_gqa(proto, cfg)
    else:
        done = _mha_with_past_to_gqa(proto, cfg.n_head)
    g = proto.graph
    _unfuse_skip_layernorm(g)
    _last_position_logits(g)
    _drop_unused(g)
    _retype_io(g)
    return done


def _mha_with_past_to_gqa(proto: onnx.ModelProto, n_head: int) -> int:
    g = proto.graph
    prod = producers(g)
    nodes, done = [], 0
    for node in g.node:
        if not (node.op_type == "MultiHeadAttention" and node.domain == MS
                and len(node.input) >= 8 and node.input[6] and node.input[7]):
            nodes.append(node)
            continue
        split = prod.get(node.input[0])
        if split is None or split.op_type != "Split" \
                or list(split.output) != list(node.input[:3]):
            raise SharedCacheError(f"{node.name}: q, k, v do not come from one Split of a packed "
                                   "projection; only graphs from `tinyt optimize --target cpu`")
        qkv, bias = split.input[0], node.input[3]
        if bias:
            nodes.append(helper.make_node("Add", [qkv, bias], [f"{qkv}_biased"],
                                          name=f"{node.name}/qkv_bias/Add"))
            qkv = f"{qkv}_biased"
        inputs = [qkv, "", "", node.input[6], node.input[7], "seqlens_k", "total_sequence_length"]
        inputs += [""] * (QUERY_SEQLENS_INPUT - len(inputs)) + ["query_seqlens"]
        nodes.append(helper.make_node(
            "GroupQueryAttention", inputs, list(node.output[:3]), domain=MS,
            name=node.name.replace("MultiHeadAttention", "GroupQueryAttention") or None,
            num_heads=n_head, kv_num_heads=n_head))
        done += 1
    del g.node[:]
    g.node.extend(nodes)
    return done


def _upstream(name: str, prod: dict, stop) -> onnx.NodeProto | None:
    """The first producer up the chain of first inputs from `name` for which stop(node)."""
    for _ in range(16):
        node = prod.get(name)
        if node is None or stop(node):
            return node
        name = node.input[0]
    return None


def rope_cache(cfg) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [block_size, head_dim / 2] of the rotary angles, as tinyt.model computes
    them in float32: position times 1 / theta^(2i / head_dim)."""
    hs = cfg.head_dim
    inv_freq = (1.0 / cfg.rope_theta ** (np.arange(0, hs, 2, dtype=np.float32) / hs))
    angles = np.arange(cfg.block_size, dtype=np.float32)[:, None] * \
        inv_freq.astype(np.float32)[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def _cache_outside_attention_to_gqa(proto: onnx.ModelProto, cfg) -> int:
    """The Llama form after `optimize --target cpu`: the cache grows by Concat outside
    MultiHeadAttention, after RotaryEmbedding, and grouped heads are repeated out to it:

        x ─MatMul─ qkv ─Split─┬ q ─RotaryEmbedding──────────────────────────────────┐
                              ├ k ─Reshape─Transpose─RotaryEmbedding─┐              │
                              │          past_k ─Concat─▶ present.i.key ─(repeat)─▶ MHA ─▶ out
                              └ v ─Reshape─Transpose─ past_v ─Concat─▶ present.i.value ┘
    to
        x ─MatMul─ qkv ─▶ GQA(qkv packed, past_k, past_v, seqlens_k, total_sequence_length,
                              cos_cache, sin_cache, query_seqlens; do_rotary, kv_num_heads)
                             ─▶ out, present.i.key, present.i.value

    GroupQueryAttention rotates q and k itself, at each row's own positions (the tokens
    already in its cache, then one more per token of the chunk)."""
    g = proto.graph
    prod = producers(g)
    rotary = cfg.pos_encoding == "rotary"
    if rotary and cfg.head_dim % ROTARY_HEAD_MULTIPLE:
        raise SharedCacheError(f"head_dim={cfg.head_dim}: GroupQueryAttention's rotary kernel "
                               f"(ONNX Runtime {ort.__version__}, CPU) needs a head size that "
                               f"is a multiple of {ROTARY_HEAD_MULTIPLE}; the contract graph "
                               "runs this model")
    if rotary:
        cos, sin = rope_cache(cfg)
        g.initializer.extend([onnx.numpy_helper.from_array(cos, "/rotary/cos_cache"),
                              onnx.numpy_helper.from_array(sin, "/rotary/sin_cache")])
    replaced, nodes, done = set(), {}, 0
    for node in g.node:
        if not (node.op_type == "MultiHeadAttention" and node.domain == MS):
            continue
        split = _upstream(node.input[0], prod, lambda n: n.op_type == "Split")
        concat = _upstream(node.input[1], prod, lambda n: n.output[0].startswith("present."))
        if split is None or len(split.output) != 3 or concat is None \
                or concat.op_type != "Concat" or not concat.output[0].endswith(".key"):
            raise SharedCacheError(f"{node.name}: attention is not fed by one Split of a packed "
                                   "q, k, v projection and a cache Concat; only graphs from "
                                   "`tinyt optimize --target cpu`")
        layer = concat.output[0].split(".")[1]
        past = [f"past_key_values.{layer}.{kv}" for kv in ("key", "value")]
        present = [f"present.{layer}.{kv}" for kv in ("key", "value")]
        replaced.update(present)
        inputs = [split.input[0], "", "", *past, "seqlens_k", "total_sequence_length"]
        inputs += ["/rotary/cos_cache", "/rotary/sin_cache"] if rotary else ["", ""]
        inputs += [""] * (QUERY_SEQLENS_INPUT - len(inputs)) + ["query_seqlens"]
        nodes[id(node)] = helper.make_node(
            "GroupQueryAttention", inputs, [node.output[0], *present], domain=MS,
            name=f"/transformer/h.{layer}/attn/GroupQueryAttention",
            num_heads=cfg.n_head, kv_num_heads=cfg.kv_heads, do_rotary=int(rotary),
            rotary_interleaved=0)
        done += 1
    kept = [nodes.get(id(n), n) for n in g.node if not set(n.output) & replaced]
    del g.node[:]
    g.node.extend(kept)
    return done


def _unfuse_skip_layernorm(g: onnx.GraphProto) -> None:
    """SkipLayerNormalization(x, skip, gamma, beta, bias) -> Add (x + bias), Add (+ skip),
    LayerNormalization.
    ONNX Runtime's CPU kernel for the fused op is slow over many rows: on 127 x 128 it took
    88 us where Add + LayerNormalization took 19 (equal at one row), nine times per prefill
    of the demo model. The runtime keeps ONNX Runtime from fusing them back at load. With the
    bias added to x first, ONNX Runtime folds it into the matmul that makes x (MatMulNBits'
    bias input): 8 fewer nodes per demo step, 3-4% of its time."""
    nodes = []
    for n in g.node:
        if not (n.op_type == "SkipLayerNormalization" and n.domain == MS):
            nodes.append(n)
            continue
        eps = next((a.f for a in n.attribute if a.name == "epsilon"), 1e-12)
        x, skip, gamma = n.input[:3]
        beta = n.input[3] if len(n.input) > 3 else ""
        bias = n.input[4] if len(n.input) > 4 else ""
        out = list(n.output) + [""] * (4 - len(n.output))
        total = out[3] or f"{n.name}/sum"
        if bias:  # x + bias first: ONNX Runtime then folds the bias into x's matmul
            nodes.append(helper.make_node("Add", [x, bias], [f"{n.name}/x_plus_bias"],
                                          name=f"{n.name}/Add_bias"))
            x = f"{n.name}/x_plus_bias"
        nodes.append(helper.make_node("Add", [x, skip], [total], name=f"{n.name}/Add"))
        nodes.append(helper.make_node("LayerNormalization", [total, gamma] + ([beta] if beta
                                                                            else []),
                                      [out[0]], axis=-1, epsilon=eps,
                                      name=f"{n.name}/LayerNormalization"))
    del g.node[:]
    g.node.extend(nodes)


def _last_position_logits(g: onnx.GraphProto) -> None:
    head = next(n for n in g.node if "logits" in n.output)
    hidden = head.input[0]
    new = [
        helper.make_node("Cast", ["query_seqlens"], ["/lm_head/last/qlens64"],
                         to=TensorProto.INT64, name="/lm_head/last/Cast"),
        helper.make_node("Sub", ["/lm_head/last/qlens64", "/lm_head/last/one"],
                         ["/lm_head/last/index"], name="/lm_head/last/Sub"),
        helper.make_node("Unsqueeze", ["/lm_head/last/index", "/lm_head/last/axis1"],
                         ["/lm_head/last/index2"], name="/lm_head/last/Unsqueeze_index"),
        helper.make_node("GatherND", [hidden, "/lm_head/last/index2"], ["/lm_head/last/rows"],
                         batch_dims=1, name="/lm_head/last/GatherND"),  # [B, C]
        helper.make_node("Unsqueeze", ["/lm_head/last/rows", "/lm_head/last/axis1"],
                         ["/lm_head/last/hidden"], name="/lm_head/last/Unsqueeze"),  # [B, 1, C]
    ]
    g.initializer.extend([onnx.numpy_helper.from_array(np.array(1, np.int64), "/lm_head/last/one"),
                          onnx.numpy_helper.from_array(np.array([1], np.int64),
                                                       "/lm_head/last/axis1")])
    head.input[0] = "/lm_head/last/hidden"
    at = list(g.node).index(head)
    for i, n in enumerate(new):
        g.node.insert(at + i, n)


def _drop_unused(g: onnx.GraphProto) -> None:
    """Remove what nothing reads any more (the mask subgraph, the Splits, attention_mask)."""
    drop_dead(g)
    used = {i for n in g.node for i in n.input if i}
    # position_ids stays an input when GroupQueryAttention places the rotary positions itself
    inputs = [i for i in g.input if i.name in used or i.name == "position_ids"]
    del g.input[:]
    g.input.extend(inputs)
    del g.value_info[:]  # shapes of rewritten values; ONNX Runtime infers the rest


def _retype_io(g: onnx.GraphProto) -> None:
    ids_at = next(k for k, i in enumerate(g.input) if i.name == "position_ids") + 1
    for k, (name, dtype, shape) in enumerate(GQA_INPUTS):
        g.input.insert(ids_at + k, helper.make_tensor_value_info(name, dtype, shape))
    for value in list(g.input) + list(g.output):
        dims = value.type.tensor_type.shape.dim
        if value.name.startswith(("past_key_values.", "present.")):
            dims[2].ClearField("dim_value")
            dims[2].dim_param = CAPACITY
        elif value.name == "logits":
            dims[1].ClearField("dim_param")
            dims[1].dim_value = 1


PREFILL_FILE = "prefill.onnx"


def _convert(src_dir: Path, tmp: Path, name: str) -> tuple[dict, Path, dict]:
    """(source manifest, converted graph, its check against the source)."""
    src = open_source(src_dir)
    manifest, cfg = src.manifest, src.config
    if manifest.get("graph") != "decoder_with_past" or manifest.get("fixed_shape"):
        raise SharedCacheError(f"{src_dir} holds a {manifest.get('graph')!r} graph"
                               f"{' with pinned shapes' if manifest.get('fixed_shape') else ''};"
                               " the shared-cache variant is made from a KV-cache decoder with "
                               "dynamic shapes")
    proto = src.graph()
    layers = to_gqa(proto, cfg)
    if layers != cfg.n_layer:
        raise SharedCacheError(
            f"{src_dir}: attention with a KV cache in {layers} of {cfg.n_layer} layers; make the "
            "variant from the output of `tinyt optimize --target cpu` (or its quantized form)")
    path = tmp / name
    save_graph(proto, path)
    ops = {n.op_type for n in proto.graph.node}
    return manifest, path, _check_against_source(src_dir, path, cfg, ops)


def shared_cache(src_dir: str | os.PathLike, out_dir: str | os.PathLike, *,
                 prefill_from: str | os.PathLike | None = None) -> Path:
    """Write the shared-cache (GroupQueryAttention) variant of a cpu-optimized decoder
    artifact, fp32 or quantized; checked against its source first. Returns out_dir.

    prefill_from: another artifact of the same model (e.g. `quantize --kernel qgemm`, whose
    int8 GEMMs are fast over a prompt's rows) whose converted graph runs the prompts, while
    src's runs the decode steps; both read and write one cache (runtime/cache.py)."""
    src_dir, out_dir = Path(src_dir), Path(out_dir)
    check_output_dir(src_dir, out_dir)
    cfg, _ = read_model_config(src_dir)
    with tempfile.TemporaryDirectory() as tmp:
        manifest, path, worst = _convert(src_dir, Path(tmp), ONNX_FILE)
        extra = {"graph": SHARED_CACHE_KIND, "opset": manifest.get("opset"), "layers": cfg.n_layer,
                 "equivalence": worst,
                 **{k: manifest[k] for k in ("quantization", "accuracy") if k in manifest},
                 "versions": {**manifest.get("versions", {}), "onnxruntime": ort.__version__}}
        if prefill_from is not None:
            prefill_from = Path(prefill_from)
            if read_model_config(prefill_from)[0] != cfg or \
                    (prefill_from / "tokenizer.json").read_bytes() != \
                    (src_dir / "tokenizer.json").read_bytes():
                raise SharedCacheError(f"{prefill_from} is not the same model as {src_dir} "
                                       "(config or tokenizer differ)")
            if origin(check_manifest(prefill_from)) != origin(manifest):
                raise SharedCacheError(f"{prefill_from} is not the same model as {src_dir}: "
                                       "their lineages lead to different checkpoints")
            p_manifest, p_path, p_worst = _convert(prefill_from, Path(tmp), PREFILL_FILE)
            extra.update(prefill_model_file=PREFILL_FILE, prefill_source={
                "path": str(prefill_from.resolve()), "manifest": p_manifest},
                prefill_equivalence=p_worst,
                prefill_quantization=p_manifest.get("quantization"),
                pair=_check_pair(src_dir, path, p_path, cfg))
        with atomic_dir(out_dir) as out:
            copy_graph(path, out)
            if prefill_from is not None:
                copy_graph(Path(tmp) / PREFILL_FILE, out)
            copy_artifact_files(src_dir, out)
            written = write_manifest(out, stage="shared-cache", source={
                "kind": "artifact", "path": str(src_dir.resolve()), "manifest": manifest,
            }, options={"level": manifest.get("options", {}).get("level"),
                        "prefill_from": None if prefill_from is None else str(prefill_from)},
                extra=extra)
    return built(out_dir, written)


def _check_against_source(src_dir: Path, path: Path, cfg, ops: set[str]) -> dict:
    """Ragged prompts, then decode steps: last-position logits of both graphs, and the
    runtime's greedy tokens."""
    from tinyt.runtime import load
    from tinyt.runtime.feeds import left_pad

    ref = load(src_dir, threads=1)
    cand = _gqa_model(src_dir, path, cfg)
    rng = np.random.default_rng(0)
    worst = 0.0
    # DynamicQuantizeMatMul quantizes activations with one scale per tensor, so the padding of
    # a batch moves its rows' results (left padding in the source, right padding here): such
    # a graph is compared on single prompts only.
    cases = [[cfg.block_size // 2]] + ([] if "DynamicQuantizeMatMul" in ops
                                       else [[3, cfg.block_size // 3, 1]])
    for lens in cases:
        B, T = len(lens), max(lens)
        ids, mask = left_pad([rng.integers(0, cfg.vocab_size, n).tolist() for n in lens])
        feeds = prefill_feeds(cfg, "decoder_with_past", ids, mask)
        a, b = ref.steps(dict(feeds)), cand.steps(dict(feeds))
        la, lb = next(a)[:, -1].copy(), next(b)[:, -1].copy()
        active = np.ones(B, bool)
        for step in range(min(6, cfg.block_size - T - 1)):
            worst = max(worst, float(np.abs(la[active] - lb[active]).max()))
            if step == 2 and B > 1:
                active[0] = False  # a finished row idles while the others go on
            nxt = la.argmax(-1)
            la = a.send((nxt, active.copy()))[:, -1].copy()
            lb = b.send((nxt, active.copy()))[:, -1].copy()
        worst = max(worst, float(np.abs(la[active] - lb[active]).max()))
    quantized = bool({"MatMulNBits", "DynamicQuantizeMatMul"} & ops)
    atol = QUANT_ATOL if quantized else OPT_ATOL
    if not worst <= atol:
        raise SharedCacheError(f"the shared-cache graph's logits differ from its source's by "
                               f"{worst:.3g} (allowed {atol})")
    prompts = [[1 + i % (cfg.vocab_size - 1) for i in range(n)] for n in (1, 5, 9)]
    n = min(16, cfg.block_size - 10)
    want = [r.token_ids for r in ref.generate_ids(prompts, max_new_tokens=n, min_new_tokens=n)]
    got = [r.token_ids for r in cand.generate_ids(prompts, max_new_tokens=n, min_new_tokens=n)]
    same = sum(a == b for g, w in zip(got, want) for a, b in zip(g, w))
    total = sum(map(len, want))
    ties = 0
    for prompt, g, w in zip(prompts, got, want) if not quantized else ():
        # fp32: the same tokens, but for a tie at fp32 precision where they first differ
        first = first_difference(g, w)
        if first is None:
            continue
        feeds = prefill_feeds(cfg, "decoder_with_past", np.array([prompt + w[:first]]),
                              np.ones((1, len(prompt) + first), np.int64))
        z = next(ref.steps(feeds))[0, -1]
        if not z[w[first]] - z[g[first]] <= 2 * OPT_ATOL:
            raise SharedCacheError(
                "the shared-cache graph generates other greedy tokens than its source: "
                f"{g} vs {w} (at token {first} the source prefers its own by "
                f"{z[w[first]] - z[g[first]]:.3g}, more than a tie at fp32 precision)")
        ties += 1
    return {"tolerance": atol, "logits_max_abs": worst, "greedy_agreement": same / total,
            "greedy_ties": ties}


def _gqa_model(src_dir: Path, path: Path, cfg, prefill: Path | None = None):
    """A runtime LanguageModel on a converted graph (and a pair's prompt graph), one thread."""
    from tinyt.runtime.generate import LanguageModel
    from tinyt.runtime.session import open_artifact
    from tinyt.tokenizer import Tokenizer

    art = open_artifact(src_dir)
    art = art.__class__(path.parent, cfg, SHARED_CACHE_KIND, art.labels, art.manifest)
    opts = ort.SessionOptions()
    opts.log_severity_level, opts.intra_op_num_threads = 3, 1
    sessions = [None if p is None else ort.InferenceSession(
        str(p), opts, providers=["CPUExecutionProvider"], disabled_optimizers=UNFUSED)
        for p in (path, prefill)]
    return LanguageModel(art, sessions[0], Tokenizer.from_file(src_dir / "tokenizer.json"),
                         prefill_session=sessions[1])


def origin(manifest: dict) -> dict | None:
    """The checkpoint an artifact was exported from (its files' sha256), following the
    manifests' lineage back through every stage."""
    source = manifest.get("source", {})
    for _ in range(32):
        if source.get("kind") == "checkpoint":
            return source.get("sha256")
        source = source.get("manifest", {}).get("source", {})
    return None


def _check_pair(src_dir: Path, path: Path, prefill: Path, cfg) -> dict:
    """The pair (prompt graph + step graph on one cache) against the step graph's source, on
    held-out-like prompts: greedy agreement and the worst logits difference. The two graphs
    are two quantizations of one checkpoint (the lineage check above), each checked against
    its own source; how far apart their quantizations put them is reported (demo INT8 pair:
    0.085; an INT4 step graph with INT8 prompts, more), not bounded here."""
    from tinyt.runtime import load

    ref, pair = load(src_dir, threads=1), _gqa_model(src_dir, path, cfg, prefill)
    rng = np.random.default_rng(1)
    worst, same, total = 0.0, 0, 0
    for n in (cfg.block_size // 4, cfg.block_size // 2):
        ids = rng.integers(0, cfg.vocab_size, (1, n))
        feeds = prefill_feeds(cfg, "decoder_with_past", ids, np.ones_like(ids))
        a, b = ref.steps(dict(feeds)), pair.steps(dict(feeds))
        la, lb = next(a)[:, -1].copy(), next(b)[:, -1].copy()
        for _ in range(min(8, cfg.block_size - n - 1)):
            worst = max(worst, float(np.abs(la - lb).max()))
            same += int(la.argmax() == lb.argmax())
            total += 1
            nxt = la.argmax(-1)
            la, lb = a.send((nxt, np.ones(1, bool)))[:, -1].copy(), \
                b.send((nxt, np.ones(1, bool)))[:, -1].copy()
    return {"logits_max_abs": worst, "top1_agreement": same / total}
