"""What the stages after export check an encoder-decoder artifact by (torch-free): its source
opened as the runtime opens it, its three graphs run on random inputs of the contract over a
grid of shapes and compared with the graphs they were made from, and which attentions a graph
holds fused.

    case (batch, source, target, past, padding of row 0's source):
      encoder_model.onnx            ids [batch, source], the mask
      decoder_model.onnx            the mask, target ids [batch, target], random hidden states
      decoder_with_past_model.onnx  the mask, target ids, random caches: the decoder's of past
                                    tokens, the encoder's of the source

The decoder graphs are fed random hidden states and caches (sizes ~1, as a LayerNorm's
output), not the encoder's: each graph is held to the fp32 bound of its own stack
(compare.reorder_bound).

Speech (Whisper): the encoder reads random log-mel features [batch, n_mels, 2 x frames] (sizes
~1, as log_mel's, which lie in [-1.5, 1.5] after its scaling) at the one length it takes; the
decoders take no source mask (padding 0) and hidden states of any length, the encoder's
`frames` among the cases.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from tinyt.config import ModelConfig
from tinyt.contract import SEQ2SEQ_FILES, seq2seq_contract
from tinyt.graphio import CONTRIB_DOMAIN, load_graph
from tinyt.manifest import Artifact
from tinyt.runtime.feeds import check_tokens
from tinyt.runtime.session import create_session

from .compare import (
    FP32_U,
    MAGNITUDE_FLOOR,
    REORDER_SAFETY,
    max_abs,
    max_abs_diff,
    reduction_width,
    reorder_bound,
)

ATTENTION = f"{CONTRIB_DOMAIN}.MultiHeadAttention"
CHECK_TARGET = 32  # target tokens of a check, at most (the source's go to check_tokens(cfg))
CASE_KEYS = ("batch", "source", "target", "past", "padding")


def open_graphs(src: Artifact) -> dict[str, onnx.ModelProto]:
    """Each graph of the source by role, its weights checked finite, after the runtime's own
    checks of it (the contract, config.json against the graph, one probe run), so that a
    mismatch is refused by name before a stage runs it."""
    protos = {}
    for role, file in SEQ2SEQ_FILES.items():
        protos[role] = load_graph(src.path / file)
        create_session(src, threads=1, spinning=False, level="disabled", graph=file)
    return protos


def layers_of(cfg: ModelConfig, role: str) -> int:
    """The blocks a graph's outputs pass through: the encoder's, or the decoder's (the
    decoder graphs are fed hidden states, not the encoder's work)."""
    return cfg.n_layer if role == "encoder" else cfg.decoder_layers


def check_cases(cfg: ModelConfig) -> list[tuple[int, int, int, int, int]]:
    """(batch, source, target, past, padding) cases: one token, a padded batch, the longest
    source a check reads (check_tokens) beside CHECK_TARGET target tokens, a step after a
    past, and one step at the decoder's last position (block_size - 1)."""
    S, T = check_tokens(cfg), min(CHECK_TARGET, cfg.block_size)
    cases = [(1, 1, 1, 0, 0), (2, min(7, S), min(3, T), 0, min(2, S - 1)),
             (3, S, T, 0, min(3, S - 1)), (1, min(5, S), 1, T - 1, 0),
             (2, S, max(1, min(5, T // 2)), T // 2, 1)]
    if cfg.block_size > T:
        cases.append((1, min(4, S), 1, cfg.block_size - 1, 0))
    if is_speech(cfg):  # no source mask; the encoder's own length once, at batch 2
        frames = cfg.source_positions
        cases = [(b, s, t, p, 0) for b, s, t, p, _ in cases] + [(2, frames, 2, 3, 0)]
    return sorted(set(cases))


def is_speech(cfg: ModelConfig) -> bool:
    """Whether the source is log-mel features (Whisper), not token ids."""
    return cfg.n_mels is not None and cfg.source_positions is not None


def graph_bound(cfg: ModelConfig, magnitude: float, layers: int) -> float:
    """compare.reorder_bound for an output `layers` blocks deep; for speech, its arithmetic
    widened to the audio encoder's: the attention over every frame (source_positions terms,
    the encoder's and every cross-attention's), the second convolution's 3 x n_embd products,
    and the two convolutions as two more steps of depth."""
    if not is_speech(cfg):
        return reorder_bound(cfg, magnitude, layers)
    width = max(reduction_width(cfg), cfg.source_positions, 3 * cfg.n_embd, 3 * cfg.n_mels)
    depth = max(layers, 1) + 1 + 2  # the blocks, the head (or final norm), the convolutions
    return REORDER_SAFETY * FP32_U * depth * float(np.sqrt(width)) * \
        max(float(magnitude), MAGNITUDE_FLOOR)


def check_sizes(cfg: ModelConfig, cases) -> dict[str, int]:
    """What a check ran, for a stage's report."""
    return {"longest_source": max(c[1] for c in cases),
            "longest_sequence": max(c[2] + c[3] for c in cases), "context": cfg.block_size,
            "highest_position": max(c[2] + c[3] - 1 for c in cases),
            "batch": max(c[0] for c in cases)}


def graph_feeds(cfg: ModelConfig, role: str, case, rng: np.random.Generator
                ) -> dict[str, np.ndarray]:
    """Random inputs of one graph for one case (its contract's names and shapes)."""
    b, s, t, p, pad = case
    mask = np.ones((b, s), dtype=np.int64)
    mask[0, s - pad:] = 0  # right-padded, as the runtime pads a source batch
    if role == "encoder" and is_speech(cfg):
        frames = 2 * cfg.source_positions
        return {"input_features": rng.uniform(-1.5, 1.5, (b, cfg.n_mels, frames))
                .astype(np.float32)}
    if role == "encoder":
        return {"input_ids": rng.integers(0, cfg.vocab_size, (b, s), dtype=np.int64),
                "attention_mask": mask}
    feeds = {"encoder_attention_mask": mask,
             "input_ids": rng.integers(0, cfg.vocab_size, (b, t), dtype=np.int64)}
    if is_speech(cfg):
        del feeds["encoder_attention_mask"]  # every frame is attended
    inputs, _ = seq2seq_contract(cfg)[role]
    for spec in inputs[len(feeds):]:  # hidden states, or the caches
        sizes = {"batch_size": b, "encoder_sequence_length": s,
                 "past_decoder_sequence_length": p}
        shape = [d if isinstance(d, int) else sizes[d] for d in spec.shape]
        feeds[spec.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def output_group(name: str) -> str:
    """An output's group in a report: the logits, the hidden states, or a graph's caches of
    one kind (a bound per group, at its largest |value|)."""
    if ".decoder." in name:
        return "self-attention cache"
    if ".encoder." in name:
        return "cross-attention cache"
    return name


def role_cases(role: str, cases, cfg: ModelConfig | None = None) -> list[tuple]:
    """The cases that differ for a graph: the encoder reads no target (nor, for speech,
    `cfg`'s, a length of its own), the first decoder graph no past."""
    if role == "encoder" and cfg is not None and is_speech(cfg):  # one length: a case a batch
        return sorted({(b, cfg.source_positions, 1, 0, 0) for b, *_ in cases})
    if role == "encoder":
        return sorted({(b, s, 1, 0, pad) for b, s, _, _, pad in cases})
    if role == "decoder":
        return sorted({(b, s, t, 0, pad) for b, s, t, _, pad in cases})
    return list(cases)


def compare_graphs(source: dict[str, Path], candidate: dict[str, Path], cfg: ModelConfig,
                   opener: Callable[[Path], ort.InferenceSession], *, seed: int = 0
                   ) -> dict[str, dict[str, dict[str, Any]]]:
    """{graph file: {output group: worst max-abs difference, the reference's largest
    |value|, its bound and the case}} between each role's `source` and `candidate` graph,
    sessions opened by `opener` one at a time (a graph's reference outputs are made, its
    session closed, then the candidate's opened)."""
    rng = np.random.default_rng(seed)
    cases = check_cases(cfg)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for role, file in SEQ2SEQ_FILES.items():
        runs = [(case, graph_feeds(cfg, role, case, rng)) for case in role_cases(role, cases, cfg)]
        first = opener(source[role])
        names = [o.name for o in first.get_outputs()]
        expected = [first.run(names, f) for _, f in runs]
        del first
        second = opener(candidate[role])
        worst: dict[str, dict[str, Any]] = {}
        for (case, f), xs in zip(runs, expected):
            for name, x, y in zip(names, xs, second.run(names, f)):
                if x.shape != y.shape:
                    raise ValueError(f"{file} {name}: shape {y.shape} where its source gives "
                                     f"{x.shape}, at {dict(zip(CASE_KEYS, case))}")
                note_worst(worst, name, x, y, dict(zip(CASE_KEYS, case)))
        for w in worst.values():
            w["bound"] = graph_bound(cfg, w["magnitude"], layers_of(cfg, role))
        out[file] = worst
    return out


def note_worst(worst: dict[str, dict[str, Any]], name: str, x: np.ndarray, y: np.ndarray,
               at: dict) -> None:
    """Keep, per output group, the largest |x - y| seen (NaN the worst), where, and the
    largest |x| (the bound's magnitude)."""
    w = worst.setdefault(output_group(name), {"max_abs": 0.0, "magnitude": 0.0, "case": None})
    d = max_abs_diff(x, y)
    if not d <= w["max_abs"]:  # NaN is worse than anything
        w.update(max_abs=d, case=at)
    w["magnitude"] = max(w["magnitude"], max_abs(x))


def beyond_bound(worst: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """Each output group of compare_graphs' answer beyond its bound, as a line naming the
    graph."""
    return [f"{file}: {group} max abs diff {w['max_abs']:.3g} > {w['bound']:.3g} (fp32 "
            f"rounding at |value| up to {w['magnitude']:.3g}) at {w['case']}"
            for file, groups in worst.items() for group, w in groups.items()
            if not w["max_abs"] <= w["bound"]]


def attention_kinds(proto: onnx.ModelProto) -> Counter:
    """How many fused attentions (MultiHeadAttention) a graph holds of each kind: 'cross'
    where its keys do not come from the graph's own sequence (the target's tokens; in the
    encoder its source's ids or log-mel features) but from the encoder's hidden states or a
    cache of them, else 'self'. (Every later block's input depends on the encoder through
    the residual stream; only the cross keys are free of the target.)"""
    producer = {o: n for n in proto.graph.node for o in n.output}

    def from_target(value: str) -> bool:
        seen, todo = set(), [value]
        while todo:
            v = todo.pop()
            if v in ("input_ids", "input_features"):
                return True
            node = producer.get(v)
            if node is None or v in seen or node.op_type in ("Shape", "Size"):
                continue  # a size is not a value: the cross keys' shapes read the batch's
            seen.add(v)
            todo += [i for i in node.input if i]
        return False

    kinds: Counter = Counter()
    for n in proto.graph.node:
        if f"{n.domain}.{n.op_type}" == ATTENTION:
            packed = len(n.input) < 2 or not n.input[1]  # q, k, v in one input: self
            kinds["self" if packed or from_target(n.input[1]) else "cross"] += 1
    return kinds


def attention_report(cfg: ModelConfig, role: str, proto: onnx.ModelProto) -> dict[str, str]:
    """A graph's fused attentions per layer, as 'fused of layers' for each kind it holds."""
    kinds = attention_kinds(proto)
    wanted = {"self": layers_of(cfg, role)}
    if role != "encoder":
        wanted["cross"] = cfg.decoder_layers
    return {k: f"{kinds.get(k, 0)} of {n}" for k, n in wanted.items()}


def fuses_attention(cfg: ModelConfig) -> bool:
    """Whether target 'cpu' must fuse every attention of the three graphs, self and cross:
    yes for every encoder-decoder family tinyt imports (T5's relative bias goes in as
    MultiHeadAttention's attention_bias), but not with soft-capped logits (the op has no
    cap)."""
    return cfg.attn_softcap is None


CONV_GELU_OPS = (f"{CONTRIB_DOMAIN}.Gelu", f"{CONTRIB_DOMAIN}.BiasGelu")
SPEECH_CONVS = 2  # Whisper's encoder stem: two Conv1d, each followed by an erf GELU


def conv_gelus(proto: onnx.ModelProto) -> int:
    """How many of a graph's GELUs run as one contrib kernel (Gelu, BiasGelu) straight on a
    convolution's output: the speech encoder's stem, Conv1d -> GELU twice."""
    conv_out = {o for n in proto.graph.node if n.op_type == "Conv" for o in n.output}
    return sum(1 for n in proto.graph.node
               if f"{n.domain}.{n.op_type}" in CONV_GELU_OPS and n.input[0] in conv_out)
