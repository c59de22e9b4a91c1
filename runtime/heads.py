"""Beam search's reading of a step's logits as one small ONNX Runtime graph, instead of a dozen
numpy passes over rows x vocabulary floats.

    logits [R, V] ──LogSoftmax──(+ mask [V])──TopK(k)──▶ each row's k best log-probabilities
                                                          [R, k] and their ids

mask: 0 or -inf a token, the same for every row (a step's rules that read no history, as
Whisper's suppressed tokens: runtime/rules.StepRules.static_mask), added after the
normalisation as transformers' processors set log-probabilities to -inf. Rules that read each
row's history (Whisper's timestamps, no_repeat_ngram_size) are applied by numpy to the
log-probabilities, whose rows then go through TopK alone (BeamHead.top).

beam_search needs each row's best num_beams x 2 continuations only: a source's best 2K over
all its beams are among the union of each beam's own best 2K (a beam's score shifts its whole
row by one number). At Opus-MT's vocabulary (58,101) with 4 beams numpy's log_softmax,
accumulation, finiteness count and argpartition made ~17% of a beam search's time (1 thread);
the graph reads the row twice (ONNX Runtime's vectorised LogSoftmax, then TopK's heap). With
rules numpy applies, numpy's argpartition over all the beams' rows cost ~4 ms a step at
Whisper's vocabulary with 5 beams (timestamps: 0.26 s of a 64-token window's ~1 s, AMD EPYC,
1 thread) against ~0.3 ms for TopK over each row.
"""
from __future__ import annotations

import threading

import numpy as np
import onnxruntime as ort

from .session import ort_options

OPSET = 18  # LogSoftmax over any axis (13), TopK with k an input (10)


def _model(normalise: bool = True) -> bytes:
    """LogSoftmax over the last axis, the mask added, then the k largest values and their ids
    (k an input); normalise False: the k largest of the scores as they come (no mask)."""
    from onnx import TensorProto, helper

    top = helper.make_node("TopK", ["masked" if normalise else "logits", "k"],
                           ["values", "indices"], axis=-1, largest=1, sorted=1)
    nodes = [helper.make_node("LogSoftmax", ["logits"], ["logp"], axis=-1),
             helper.make_node("Add", ["logp", "mask"], ["masked"]), top] if normalise else [top]
    inputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["rows", "vocab"]),
              helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["vocab"]),
              helper.make_tensor_value_info("k", TensorProto.INT64, [1])]
    graph = helper.make_graph(
        nodes, "beam_head" if normalise else "beam_top",
        inputs if normalise else [inputs[0], inputs[2]],
        [helper.make_tensor_value_info("values", TensorProto.FLOAT, ["rows", "k"]),
         helper.make_tensor_value_info("indices", TensorProto.INT64, ["rows", "k"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    return model.SerializeToString()


class BeamHead:
    """head(logits, k, mask=None): each row's k best log-probabilities [R, k] (best first,
    after `mask` [V] of 0 / -inf) and their token ids [R, k]; head.top(scores, k): each row's
    k largest scores as they are (log-probabilities numpy has already ruled), best first, and
    their ids. Each on a session made at its first call. It runs on the calling thread alone:
    its work is ~1 ms a step at Opus-MT's vocabulary, and a pool of its own would spin beside
    the decoder's after each run (measured: 4 beams at 2 threads took 407 ms against 226 at
    1 thread)."""

    def __init__(self):
        self._sessions: dict[bool, ort.InferenceSession] = {}
        self._lock = threading.Lock()
        self._zeros = np.zeros(0, dtype=np.float32)  # the mask of no rule, at the last width

    def _open(self, normalise: bool = True) -> ort.InferenceSession:
        with self._lock:
            if normalise not in self._sessions:
                opts = ort_options(level="disabled", threads=1)
                self._sessions[normalise] = ort.InferenceSession(
                    _model(normalise), opts, providers=["CPUExecutionProvider"])
            return self._sessions[normalise]

    def __call__(self, logits: np.ndarray, k: int, mask: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
        z = np.ascontiguousarray(logits, dtype=np.float32)
        k = min(k, z.shape[-1])
        if mask is None:
            if self._zeros.shape[0] != z.shape[-1]:
                self._zeros = np.zeros(z.shape[-1], dtype=np.float32)
            mask = self._zeros
        values, ids = self._open().run(None, {"logits": z, "mask": mask,
                                              "k": np.array([k], dtype=np.int64)})
        return values, ids

    def top(self, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Each row's k largest scores [R, k] (ties: the lower id first) and their ids."""
        z = np.ascontiguousarray(scores, dtype=np.float32)
        k = min(k, z.shape[-1])
        values, ids = self._open(False).run(None, {"logits": z,
                                                   "k": np.array([k], dtype=np.int64)})
        return values, ids
