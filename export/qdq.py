"""Static INT8: QuantizeLinear / DequantizeLinear pairs with activation ranges calibrated on the
training corpus (ONNX Runtime's quantize_static). Standard ONNX ops only; ONNX Runtime fuses
the pairs into integer kernels when it loads the model.

What the calibration runs (the training split, never validation; 4 a batch):

    decoder                32 windows of check_tokens(cfg) tokens, fed as prefill
    encoder, classifier,   32 texts cut to 4, 16, 64 and 256 words in turn, so each batch pads
    token classifier       short texts under the mask beside a long one; tokenized as the
                           runtime does ([CLS] ... [SEP], its cut, at most check_tokens(cfg));
                           a sequence classifier's 16-word texts go in as pairs (token type 1)

Only weight matmuls and embedding gathers are quantized; attention's activation x activation
matmuls stay float. The tied matrix becomes one int8 initializer and one DequantizeLinear
that feeds both the embedding Gather and the lm_head.
"""
from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path

import numpy as np
import onnx
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_static,
)

from tinyt import data as D
from tinyt.config import ModelConfig
from tinyt.contract import CLASSIFIER, ENCODER
from tinyt.errors import DataError
from tinyt.graphio import graph_files
from tinyt.recipe import QuantRecipe
from tinyt.runtime.feeds import check_tokens, prefill_feeds
from tinyt.tokenizer import Tokenizer

from .blockquant import QuantReport, excluded_by, module_of
from .text_batches import TEXT_KINDS, Item, batch_feeds, encode_items

# tinyt.recipe.CALIBRATIONS -> ONNX Runtime's calibrators
CALIBRATION_METHODS = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
                       "percentile": CalibrationMethod.Percentile}
CALIBRATION_WINDOWS = 32
CALIBRATION_BATCH = 4
CALIBRATION_TEXTS = 32  # an encoder's, a classifier's: 8 batches of 4, as the windows
# Words kept of each calibration text, in turn within every batch: a query, a sentence, a
# paragraph, and past the cut of most models (check_tokens bounds it): every batch pads.
TEXT_WORDS = (4, 16, 64, 256)
_TYPES = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}


class _Feeds(CalibrationDataReader):
    """One batch of feeds at a time."""

    def __init__(self, batches: list[dict[str, np.ndarray]]):
        self.batches = iter(batches)

    def get_next(self):
        return next(self.batches, None)


def calibration_windows(tokenizer: Tokenizer, cfg: ModelConfig, data: str | None,
                        count: int = CALIBRATION_WINDOWS) -> np.ndarray:
    """Windows of check_tokens(cfg) tokens (the block of the presets and GPT-2, at most 128 for
    computed positions, whatever the context) from the corpus' training split (never
    validation)."""
    corpus = D.load_corpus(data)
    tokens = D.encode_documents(tokenizer, corpus.train[:200])
    W = check_tokens(cfg)
    try:
        D.check_lm_tokens(tokens, W, "calibration")
    except DataError as e:
        raise DataError(f"calibration set from {corpus.source}: {e}") from None
    # each begins as the model's sequences do (its BOS, where its tokenizer puts one first)
    return D.lm_eval_windows(tokens, W, count, start=tokenizer.start_id)[0]


def calibration_texts(kind: str, data: str | None,
                      count: int = CALIBRATION_TEXTS) -> tuple[list[Item], str]:
    """`count` texts from the training split (never validation): of the built-in corpus, or,
    for a classifier given labelled data, of its training texts. Text i starts at the
    (i / count)-th of the split's snippets and takes TEXT_WORDS[i % 4] words (following
    snippets where one is short); a sequence classifier's 16-word texts are pairs of 8 and 8
    words. Returns (the texts, where they came from)."""
    if data is not None and kind != ENCODER:  # a classifier's labelled directory
        source, split = data, [t for t, _ in D.load_classification(data).train]
    else:
        corpus = D.load_corpus(data)
        source = corpus.source
        split = [s for t in corpus.train[:200] for s in D.snippets(t)]
    if len(split) < count:
        raise DataError(f"calibration set from {source}: {len(split)} training snippets, "
                        f"{count} needed; give a larger corpus")
    items: list[Item] = []
    for i in range(count):
        want, j = TEXT_WORDS[i % len(TEXT_WORDS)], i * len(split) // count
        words: list[str] = []
        while len(words) < want and j < len(split):
            words += split[j].split()
            j += 1
        words = words[:want]
        half = len(words) // 2
        pair = kind == CLASSIFIER and want == TEXT_WORDS[1] and half > 0
        items.append((" ".join(words[:half]), " ".join(words[half:])) if pair
                     else " ".join(words))
    return items, source


def calibration_batches(tokenizer: Tokenizer, cfg: ModelConfig, kind: str,
                        data: str | None) -> tuple[list[dict[str, np.ndarray]], dict]:
    """The calibration's feeds, CALIBRATION_BATCH a batch, and what they hold (for the
    manifest): decoder windows as prefill, or texts as the runtime feeds them."""
    if kind not in TEXT_KINDS:
        windows = calibration_windows(tokenizer, cfg, data)
        return ([prefill_feeds(cfg, kind, windows[i:i + CALIBRATION_BATCH])
                 for i in range(0, len(windows), CALIBRATION_BATCH)],
                {"windows": len(windows), "window": int(windows.shape[1])})
    items, source = calibration_texts(kind, data)
    rows = encode_items(tokenizer, cfg, items, longest=check_tokens(cfg))
    lengths = [len(ids) for ids, _ in rows]
    # every batch padded to the longest text: the histogram calibrators (entropy, percentile)
    # stack the batches' activations, so their shapes must agree
    return ([batch_feeds(tokenizer, cfg, kind, rows[i:i + CALIBRATION_BATCH],
                         length=max(lengths))
             for i in range(0, len(rows), CALIBRATION_BATCH)],
            {"data": source, "texts": len(items),
             "pairs": sum(not isinstance(t, str) for t in items),
             "shortest_tokens": min(lengths), "longest_tokens": max(lengths),
             "tokens": sum(lengths), "batch": CALIBRATION_BATCH})


def weight_nodes(proto: onnx.ModelProto) -> list[tuple[onnx.NodeProto, str]]:
    """(node, weight initializer) for every MatMul / Gather that reads a 2-D weight, directly
    or through a Transpose (the tied lm_head)."""
    inits = {i.name for i in proto.graph.initializer}
    transposed = {n.output[0]: n.input[0] for n in proto.graph.node
                  if n.op_type == "Transpose" and n.input[0] in inits}
    out = []
    for n in proto.graph.node:
        if n.op_type == "MatMul":
            w = transposed.get(n.input[1], n.input[1])
        elif n.op_type == "Gather":
            w = n.input[0]
        else:
            continue
        if w in inits:
            out.append((n, w))
    return out


def quantize_qdq(src: Path, dst: Path, cfg: ModelConfig, kind: str, tokenizer: Tokenizer,
                 recipe: QuantRecipe, *, data: str | None,
                 batches: tuple[list[dict[str, np.ndarray]], dict] | None = None
                 ) -> tuple[QuantReport, dict]:
    """Quantize src's weight matmuls and embedding gathers to QDQ in dst as the (static)
    recipe says, activation ranges calibrated on the training split (calibration_batches,
    or `batches` and what they hold: an encoder-decoder's graph, export/seq2seq_quantize.py);
    (the report, what the calibration ran)."""
    scales = recipe.scales
    if scales is None:
        raise ValueError(f"quantize_qdq makes static recipes; this one is {recipe.mode!r}")
    proto = onnx.load(str(src))
    report = QuantReport()
    wanted = []
    for node, weight in weight_nodes(proto):
        module = module_of(node, weight)
        report.modules.add(module)
        why = excluded_by(module, list(recipe.exclude))
        if why:
            report.excluded.append(f"{module} ({node.op_type}, by '{why}')")
            report.exclusions_used.add(why)
        else:
            wanted.append(node.name)
            report.quantized.append(f"{module} ({node.op_type})")
    skip = [n.name for n in proto.graph.node
            if n.op_type in ("MatMul", "Gather") and n.name not in wanted]
    feeds, calibrated = calibration_batches(tokenizer, cfg, kind, data) if batches is None \
        else batches
    reader = _Feeds(feeds)
    root = logging.getLogger()
    level, root.level = root.level, logging.ERROR  # its advice to pre-process: see README
    with contextlib.redirect_stdout(io.StringIO()):  # the percentile calibrator prints
        quantize_static(
            str(src), str(dst), reader, quant_format=QuantFormat.QDQ,
            op_types_to_quantize=["MatMul", "Gather"], nodes_to_exclude=skip,
            per_channel=scales.per_channel, reduce_range=recipe.reduce_range,
            activation_type=_TYPES[scales.activation_type], weight_type=QuantType.QInt8,
            calibrate_method=CALIBRATION_METHODS[scales.calibration],
            use_external_data_format=len(graph_files(src)) > 1,
        )
    root.setLevel(level)
    q = onnx.load(str(dst))
    dq_users: dict[str, int] = {}
    for n in q.graph.node:
        for name in n.input:
            dq_users[name] = dq_users.get(name, 0) + 1
    report.shared_tables = sorted(
        n.input[0] for n in q.graph.node
        if n.op_type == "DequantizeLinear" and dq_users.get(n.output[0], 0) > 1
        and n.input[0].endswith("_quantized"))
    return report, calibrated
