"""Log-probabilities of tokens (torch-free): the chosen tokens' and their top alternatives, and
every position of a prompt, as `/v1/completions`' logprobs and echo and
lm-evaluation-harness's loglikelihood read them.

    logits [N, V] ──log_softmax (sums in float64)──▶ each position's token and its top `top`
    a prompt's every position:
      contract graphs (decoder_with_past, decoder)  their prompt pass gives logits [B, S, V]
      shared-cache graphs (decoder_gqa)  the lm_head reads each row's last position only; the
          graph outputs the hidden states it picks from (HIDDEN_OUTPUT [B, S, C]), and the
          head's own nodes (HEAD_INPUT -> logits), cut once from the prompt graph, turn the
          other positions' rows into logits: the same nodes on the same weights, so a position
          scores what the graph would give a prompt ending there

The logprobs are the model's own distribution (log_softmax of the logits), before temperature,
top-k / top-p or penalties, as vLLM and OpenAI report them.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from tinyt.contract import HEAD_INPUT
from tinyt.errors import ConfigError, MemoryLimitError
from tinyt.hardware import memory_refusal

MAX_TOP = 20  # alternatives per position at most (OpenAI's chat top_logprobs limit, vLLM's)
HEAD_ROWS = 256  # positions per run of the head graph: bounds its [rows, vocab] logits


@dataclass(frozen=True)
class Logprob:
    """One position: the token there, its log-probability, and the `top` most likely tokens
    with theirs (most likely first; empty when none were asked for)."""
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def check_top(top, what: str = "top") -> int:
    """`top` as an int in 0..MAX_TOP, else ConfigError naming it."""
    if not (isinstance(top, int) and not isinstance(top, bool) and 0 <= top <= MAX_TOP):
        raise ConfigError(f"{what}={top!r} is invalid: an integer in 0..{MAX_TOP} (the "
                          "alternatives to list at each position)")
    return top


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log_softmax over the last axis, summed in float64 (a 262,144-token vocabulary's sum in
    float32 loses the small probabilities' digits), returned as float64."""
    x = np.asarray(logits, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))


def logprobs_of(logits: np.ndarray, tokens, top: int = 0) -> list[Logprob]:
    """Logprob of tokens[i] under logits[i] ([N, V]) with the top `top` of each row."""
    lp = log_softmax(logits)
    out = []
    for row, t in zip(lp, tokens):
        alts: tuple[tuple[int, float], ...] = ()
        if top:
            best = np.argpartition(-row, top - 1)[:top]
            best = best[np.lexsort((best, -row[best]))]  # most likely first, ties by id
            alts = tuple((int(i), float(row[i])) for i in best)
        out.append(Logprob(int(t), float(row[int(t)]), alts))
    return out


class HeadGraph:
    """The lm_head of a shared-cache graph alone: HEAD_INPUT [N, 1, C] -> logits [N, 1, V],
    the nodes the graph runs on each row's last position, cut from its file (weights read
    once, only the head's). Rows run together unless the graph quantizes activations with one
    scale over all rows (`together` False), where each runs alone, as a prompt ending there."""

    def __init__(self, path: Path, opts: ort.SessionOptions, *, together: bool):
        import onnx
        from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

        proto = onnx.load(str(path), load_external_data=False)
        g = proto.graph
        made = {o: n for n in g.node for o in n.output}
        if HEAD_INPUT not in made or "logits" not in made:
            raise ConfigError(f"{path} has no lm_head of a shared-cache graph ({HEAD_INPUT!r} "
                              "-> logits) to score prompts with: make it again with `tinyt "
                              "optimize --target gqa`")
        keep, stack = set(), ["logits"]
        while stack:  # the nodes between HEAD_INPUT and logits
            name = stack.pop()
            node = made.get(name)
            if name == HEAD_INPUT or node is None or id(node) in keep:
                continue
            keep.add(id(node))
            stack.extend(i for i in node.input if i)
        nodes = [n for n in g.node if id(n) in keep]
        produced = {o for n in nodes for o in n.output} | {HEAD_INPUT}
        needed = {i for n in nodes for i in n.input if i and i not in produced}
        inits = [t for t in g.initializer if t.name in needed]
        missing = needed - {t.name for t in inits}
        if missing:  # the head reads a graph input: not a head this cut can run alone
            raise ConfigError(f"{path}: the lm_head reads {sorted(missing)}, not only its "
                              "weights; prompt scoring cannot run it alone")
        nbytes = sum(int(np.prod(t.dims, dtype=np.int64)) for t in inits) * 4
        why = memory_refusal(nbytes, "the lm_head's weights for scoring prompts",
                             "the model (a smaller or quantized artifact)")
        if why:
            raise MemoryLimitError(why)
        for t in inits:
            if uses_external_data(t):
                load_external_data_for_tensor(t, str(path.parent))
                del t.external_data[:]
                t.data_location = onnx.TensorProto.DEFAULT
        inp = onnx.helper.make_tensor_value_info(HEAD_INPUT, onnx.TensorProto.FLOAT,
                                                 ["rows", 1, None])
        out = next(o for o in g.output if o.name == "logits")
        head = onnx.helper.make_graph(nodes, "lm_head", [inp], [out], inits)
        model = onnx.helper.make_model(head, opset_imports=list(proto.opset_import),
                                       ir_version=proto.ir_version)
        self.session = ort.InferenceSession(model.SerializeToString(), opts,
                                            providers=["CPUExecutionProvider"])
        self.together = together

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        """Logits [N, V] of hidden rows [N, C]."""
        hidden = np.ascontiguousarray(hidden, dtype=np.float32)[:, None]
        step = HEAD_ROWS if self.together else 1
        parts = [self.session.run(["logits"], {HEAD_INPUT: hidden[i:i + step]})[0][:, 0]
                 for i in range(0, len(hidden), step)]
        return np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)


class HeadGraphs:
    """A HeadGraph made on first use, once, by whichever thread asks first."""

    def __init__(self, make):
        self._make, self._head, self._lock = make, None, threading.Lock()

    def get(self) -> HeadGraph:
        with self._lock:
            if self._head is None:
                self._head = self._make()
            return self._head
