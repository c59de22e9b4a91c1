"""An encoder-decoder's three graphs quantized by one recipe (torch-free): each graph's weight
matmuls and embedding gathers as a decoder's are (export/blockquant.py: a tied table
quantized once and read by both of its users, the decoder's embedding Gather and the
lm_head), or, static, QDQ with activation ranges calibrated on training pairs fed as the
runtime feeds them (export/qdq.py):

    training pairs (CALIBRATION_PAIRS of the split, CALIBRATION_BATCH a batch, every batch
    padded to the same sizes: the histogram calibrators stack them)
      sources                         ──▶ encoder_model.onnx
      fp32 encoder's hidden states, [start] + target (teacher forcing)
                                      ──▶ decoder_model.onnx
      fp32 decoder_model's caches of the target's first half, the next token
                                      ──▶ decoder_with_past_model.onnx (a decode step)
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from tinyt.contract import SEQ2SEQ, SEQ2SEQ_FILES, seq2seq_cache_names
from tinyt.graphio import check_graph, save_graph
from tinyt.hardware import int8_preset
from tinyt.manifest import Artifact
from tinyt.recipe import QuantRecipe
from tinyt.runtime.encoder_decoder import GenerationConfig
from tinyt.runtime.session import graph_session
from tinyt.tokenizer import Tokenizer

from .blockquant import QuantReport, quantize_weights
from .qdq import CALIBRATION_BATCH, CALIBRATION_WINDOWS, quantize_qdq
from .seq2seq_accuracy import pairs_of, side_rows, spread
from .seq2seq_checks import is_speech

CALIBRATION_PAIRS = CALIBRATION_WINDOWS  # as many as a decoder's calibration windows


def quantize_graphs(src: Artifact, protos: dict[str, onnx.ModelProto], out: Path,
                    recipe: QuantRecipe, tokenizer: Tokenizer, data: str | None
                    ) -> tuple[dict[str, QuantReport], dict | None]:
    """Each graph of `protos` (by role) quantized as `recipe` says, written under `out` with
    its file name and checked: what was done to each (by file), and the static recipe's
    calibration set (else None)."""
    reports: dict[str, QuantReport] = {}
    calibrated = None
    if recipe.static:
        batches, calibrated = calibration_feeds(src, tokenizer, data)
        for role, file in SEQ2SEQ_FILES.items():
            reports[file], _ = quantize_qdq(src.path / file, out / file, src.config, SEQ2SEQ,
                                            tokenizer, recipe, data=data,
                                            batches=(batches[role], calibrated))
    else:
        for role, file in SEQ2SEQ_FILES.items():
            proto = protos.pop(role)
            own = graph_recipe(src, role, recipe)
            # (a speech graph's own recipe keeps the tied table one MatMulNBits table)
            reports[file] = quantize_weights(proto, own, head_gemm=own is recipe)
            save_graph(proto, out / file)
            del proto
    for file in SEQ2SEQ_FILES.values():
        check_graph(out / file)
    return reports, calibrated


def graph_recipe(src: Artifact, role: str, recipe: QuantRecipe) -> QuantRecipe:
    """The recipe of one graph: a speech model's encoder and first decoder graph read 1,500
    rows a window (the encoder's matmuls; the first step's cross-attention keys / values), so
    their 8-bit MatMulNBits become int8 GEMMs with each activation row quantized on its own
    (kernel qgemm-rows: a window's states never depend on the other windows of its batch);
    the stepping graph's one row (or a beam's few) a step keeps the recipe asked. Measured on
    whisper-tiny, 1 thread, CPU time on an AMD EPYC with VNNI: the encoder 343 ms a window
    with MatMulNBits, 279 qgemm-rows (255 with qgemm's one scale a tensor); the first decoder
    graph 33 -> 23 ms a window (186 -> 117 for 4)."""
    if role in ("encoder", "decoder") and is_speech(src.config) and recipe.kernel == "nbits" \
            and recipe.bits == 8 and recipe.mode == "dynamic":
        return QuantRecipe.request(mode="dynamic", kernel="qgemm-rows", exclude=recipe.exclude,
                                   reduce_range=bool(int8_preset()["reduce_range"]))
    return recipe


def calibration_feeds(src: Artifact, tokenizer: Tokenizer, data: str | None
                      ) -> tuple[dict[str, list[dict[str, np.ndarray]]], dict]:
    """Each graph's calibration batches (by role), made from the training split of `data`
    (never the held-out pairs) through the fp32 source graphs, and what they hold."""
    cfg = src.config
    pairs = pairs_of(data)
    train = spread(pairs.train, CALIBRATION_PAIRS)
    limit = cfg.block_size
    sources = side_rows(tokenizer, [s for s, _ in train], limit)
    targets = side_rows(tokenizer, [t for _, t in train], limit)
    gen = _generation_ids(src, tokenizer)
    S, T = max(map(len, sources)), max(2, max(map(len, targets)))
    P = T // 2  # the decode step: after the target's first half
    encoder, decoder = (graph_session(src.path / SEQ2SEQ_FILES[r], level="disabled")
                        for r in ("encoder", "decoder"))
    names = [o.name for o in decoder.get_outputs()]
    feeds: dict[str, list[dict[str, np.ndarray]]] = {r: [] for r in SEQ2SEQ_FILES}
    for i in range(0, len(train), CALIBRATION_BATCH):
        B = len(sources[i:i + CALIBRATION_BATCH])
        ids = np.full((B, S), gen["pad"], dtype=np.int64)
        mask = np.zeros((B, S), dtype=np.int64)
        target = np.full((B, T), gen["pad"], dtype=np.int64)
        target[:, 0] = gen["start"]
        for r in range(B):
            s, t = sources[i + r], targets[i + r]
            ids[r, :len(s)], mask[r, :len(s)] = s, 1
            target[r, 1:len(t)] = t[:-1]
        feeds["encoder"].append({"input_ids": ids, "attention_mask": mask})
        (memory,) = encoder.run(["last_hidden_state"], feeds["encoder"][-1])
        feeds["decoder"].append({"encoder_attention_mask": mask, "input_ids": target,
                                 "encoder_hidden_states": memory})
        out = dict(zip(names, decoder.run(names, {**feeds["decoder"][-1],
                                                  "input_ids": target[:, :P]})))
        step = {"encoder_attention_mask": mask, "input_ids": target[:, P:P + 1]}
        for name in seq2seq_cache_names(cfg.decoder_layers, "past_key_values",
                                         ("decoder", "encoder")):
            step[name] = out[name.replace("past_key_values", "present", 1)]
        feeds["decoder_with_past"].append(step)
    return feeds, {"data": pairs.source, "pairs": len(train), "batch": CALIBRATION_BATCH,
                   "source_tokens": S, "target_tokens": T, "past": P}


def _generation_ids(src: Artifact, tokenizer: Tokenizer) -> dict[str, int]:
    """The decoder's start and the padding, as the runtime reads them (generation_config)."""
    gen = GenerationConfig.read(src, tokenizer)
    return {"start": gen.decoder_start, "pad": gen.pad}
