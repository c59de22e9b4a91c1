"""The shared-cache decoder (GroupQueryAttention layout): one KV buffer per layer that the
graph writes into in place, bound once (torch-free).

    inputs:  input_ids [B, S] right-padded, position_ids [B, S],
             seqlens_k [B] int32 (tokens in the cache after this step, less one),
             total_sequence_length [] int32 (the largest of those, plus one),
             query_seqlens [B] int32 (real tokens of this chunk per row; 0 = the row idles),
             [window_seqlens_k [B], window_total_sequence_length []: the same counts for the
              windowed layers' buffers, where they hold the window alone]
             past_key_values.{i}.key / .value [B, nh, capacity, hs]  ─┐ the same memory
    outputs: logits [B, 1, vocab] (each row's last real token),      │
             present.{i}.key / .value [B, nh, capacity, hs]          ─┘
             hidden_states [B, S, C] (what the lm_head picks its rows from: prompt scoring)

A layer with a sliding window shorter than the context (tinyt.contract.compact_window_layers:
Gemma 3's local layers, Mistral's) has buffers of window + slack tokens (window_slack), not
capacity: when a row's next tokens would not fit, its last `window` tokens move to the front of
its buffer (the others are outside every later query's window), and GroupQueryAttention rotates
the new tokens by position_ids, not by their slot. A step after 4,096 tokens then reads 512
tokens in those layers, not 4,096 (ONNX Runtime's kernel computes scores over the whole past
and masks the window after), and a 32,768-token cache of Gemma-3-270M holds 3 layers at its
capacity and 15 at 640 tokens. A prompt piece longer than the slack runs through temporary
buffers of its length (prefill's and extend's transient cost), then keeps its window.

Compared with the contract graph (export/kvfuse.py's MultiHeadAttention), a decode step copies
no cache (MultiHeadAttention writes past + new into a fresh present every step), builds no
attention mask, computes the lm_head for one position only, and the loop binds every buffer
once: a step writes a few integers in place and runs. The layout is not Optimum's, so it is a
variant next to the contract artifact (`tinyt optimize SRC OUT --target gqa`), never instead.
"""
from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import onnxruntime as ort

from tinyt.config import ModelConfig
from tinyt.contract import (
    HIDDEN_OUTPUT,
    WINDOW_INPUTS,
    compact_window_layers,
    kv_shape,
    past_names,
    present_names,
    window_slack,
)
from tinyt.errors import ConfigError, MemoryLimitError
from tinyt.hardware import memory_refusal

# A cache holds what a call needs, not the model's context: its capacity is the tokens the
# call can reach rounded up to a power of two, at least MIN_CAPACITY, at most the context. So
# pooled caches serve calls of nearby sizes (a 300-token and a 400-token generation share a
# 512 one), a cache is at most twice what its call needs, and a model with a 131,072-token
# context costs a 64-token generation what a 256-token model does.
MIN_CAPACITY = 256
# What a refusal of a cache too large for the machine tells the user to lower.
LOWER = "the rows or the tokens (max_new_tokens, max_context / --max-context, max_batch / " \
        "--max-batch)"


# The KV cache's numpy type from a graph's past inputs: float16 on GPU variants, int8 in a
# shared-cache graph made with --kv-cache int8 (export/kv_int8.py), else float32
KV_DTYPES: dict[str, type[np.number]] = {"tensor(float16)": np.float16, "tensor(int8)": np.int8}


def graph_kv_dtype(session: ort.InferenceSession) -> type[np.number]:
    """The element type of `session`'s KV cache inputs (float32 where it has none)."""
    past = [i for i in session.get_inputs() if i.name.startswith("past_key_values")]
    return KV_DTYPES.get(past[0].type, np.float32) if past else np.float32


def capacity_for(tokens: int, context: int) -> int:
    """The capacity of a cache for `tokens` (prompt + new tokens): the next power of two, at
    least MIN_CAPACITY, at most `context`."""
    want = max(int(tokens), MIN_CAPACITY)
    return min(int(context), 1 << (want - 1).bit_length())


def window_capacity(cfg: ModelConfig, capacity: int, compact: bool = True) -> int:
    """The tokens a windowed layer's buffer holds in a cache of `capacity` (module docstring):
    window + slack, or capacity where that is no more (or the graph keeps every layer at
    capacity: compact=False, or no compact windowed layers)."""
    window = cfg.sliding_window
    if window is None or not (compact and compact_window_layers(cfg)):
        return capacity
    return min(capacity, window + window_slack(window))


def kv_bytes(cfg: ModelConfig, rows: int, capacity: int, kv_dtype=np.float32,
             compact: bool = False) -> int:
    """Bytes of a KV cache of `rows` x `capacity` tokens: every layer's keys and values
    (compact: the windowed layers' buffers at window_capacity)."""
    windowed = len(compact_window_layers(cfg)) if compact else 0
    tokens = (cfg.n_layer - windowed) * capacity + \
        windowed * window_capacity(cfg, capacity, compact)
    return 2 * tokens * int(np.prod(kv_shape(cfg, rows, 1))) * np.dtype(kv_dtype).itemsize


def check_kv_fits(cfg: ModelConfig, rows: int, capacity: int, kv_dtype=np.float32, *,
                  lower: str = LOWER, copies: int = 1, compact: bool = False) -> None:
    """MemoryLimitError, before anything is allocated, if `copies` KV caches of rows x capacity
    tokens do not fit this machine's available memory."""
    nbytes = copies * kv_bytes(cfg, rows, capacity, kv_dtype, compact)
    why = memory_refusal(nbytes, f"KV buffers of {rows} row(s) x {capacity} tokens "
                                 f"({cfg.n_layer} layers, keys and values"
                                 + (f", {copies} copies" if copies > 1 else "") + ")", lower)
    if why:
        raise MemoryLimitError(why)


class SharedCache:
    """Buffers and one I/O binding for a generation of `batch` rows of at most `capacity`
    tokens each. prefill(rows) then step(next_tokens, active) return logits [B, 1, vocab]
    (a buffer that the next call overwrites). Buffers that would not fit the machine's
    available memory are refused before they are allocated (MemoryLimitError naming the size
    and `lower`, what to make smaller)."""

    def __init__(self, session: ort.InferenceSession, cfg: ModelConfig, batch: int,
                 capacity: int, *, kv_dtype=None,
                 prefill_session: ort.InferenceSession | None = None, lower: str = LOWER):
        names = {i.name for i in session.get_inputs()}
        if prefill_session is not None and \
                (WINDOW_INPUTS[0] in names) != any(i.name == WINDOW_INPUTS[0]
                                                   for i in prefill_session.get_inputs()):
            raise ConfigError("the pair's graphs keep their windowed layers' caches "
                              "differently (one was made by an older tinyt): make both again "
                              "with `tinyt optimize --target gqa`")
        compact = WINDOW_INPUTS[0] in names
        kv_dtype = graph_kv_dtype(session) if kv_dtype is None else kv_dtype
        check_kv_fits(cfg, batch, capacity, kv_dtype, lower=lower, compact=compact)
        self.session, self.cfg, self.B, self.capacity = session, cfg, batch, capacity
        # windowed layers with buffers of their own (module docstring): which, and how long
        self.window_layers = set(compact_window_layers(cfg)) if compact else set()
        self.window = cfg.sliding_window or 0  # read only where there are window_layers
        self.wcap = window_capacity(cfg, capacity, compact)
        self.lower = lower
        self.kv_dtype = kv_dtype
        # A pair: prompts run through prefill_session's graph (made for many rows), steps
        # through session's; both read and write the same cache buffers.
        self.prefill_session = prefill_session or session
        self.binding = session.io_binding()
        self.prefill_binding = (self.binding if prefill_session is None
                                else prefill_session.io_binding())
        shape = kv_shape(cfg, batch, capacity)
        self.kv = []
        self.wseqlens = np.zeros(batch, dtype=np.int32)
        self.wtotal = np.zeros((), dtype=np.int32)
        self.wlens = np.zeros(batch, dtype=np.int64)  # tokens in the windowed layers' buffers
        self.logits = np.zeros((batch, 1, cfg.vocab_size), dtype=np.float32)
        self.seqlens = np.zeros(batch, dtype=np.int32)
        self.qlens = np.zeros(batch, dtype=np.int32)
        self.total = np.zeros((), dtype=np.int32)
        self.lens = np.zeros(batch, dtype=np.int64)  # tokens in the cache per row
        for k, (past, present) in enumerate(zip(past_names(cfg.n_layer),
                                                present_names(cfg.n_layer))):
            buf = np.zeros(kv_shape(cfg, batch, self.wcap) if k // 2 in self.window_layers
                           else shape, dtype=kv_dtype)
            self.kv.append(buf)  # past and present are the same memory
            self._bind(past, buf)
            self._bind(present, buf, output=True)
        self._bind("logits", self.logits, output=True)
        # The prompt graph's hidden states (every position, export/gqa_graph.py), kept by ONNX
        # Runtime after each prompt run for a caller scoring it (prompt_hidden); graphs made
        # before they were an output have none.
        # A step's are written to a buffer of their own, never read (bound once, as the
        # logits); a prompt run's are left to ONNX Runtime to allocate, their shape changing.
        self._hidden_at = None
        self._hidden: ort.OrtValue | None = None  # the last prompt run's
        self.hidden_step = None
        if any(o.name == HIDDEN_OUTPUT for o in self.prefill_session.get_outputs()):
            self._hidden_at = 2 * cfg.n_layer + 1  # after the presents and the logits
            self.hidden_step = np.zeros((batch, 1, cfg.n_embd), dtype=np.float32)
            self._bind(HIDDEN_OUTPUT, self.hidden_step, output=True)
        for name, buf in (("seqlens_k", self.seqlens), ("query_seqlens", self.qlens),
                          ("total_sequence_length", self.total),
                          *zip(WINDOW_INPUTS if compact else (), (self.wseqlens, self.wtotal))):
            self._bind(name, buf)
        self.ids = np.zeros((batch, 1), dtype=np.int64)
        self.pos = np.zeros((batch, 1), dtype=np.int64)
        self._bind("input_ids", self.ids, prefill=False)  # one token per row per step
        self._bind("position_ids", self.pos, prefill=False)
        self._rows = batch  # rows the step binding covers (step_rows may bind fewer)

    def _bind(self, name: str, buf: np.ndarray, output: bool = False,
              prefill: bool | None = None) -> None:
        """Bind `buf` in the step binding (prefill=False), the prompt's (True), or both."""
        for binding in {id(b): b for b, phase in ((self.binding, False),
                                                  (self.prefill_binding, True))
                        if prefill is None or phase == prefill}.values():
            bind = binding.bind_output if output else binding.bind_input
            bind(name, "cpu", 0, buf.dtype, list(buf.shape), buf.ctypes.data)

    def prefill(self, rows: list[list[int]], pad: int) -> np.ndarray:
        """Run every row's prompt (right-padded into one chunk); logits of each last token."""
        lens = np.array([len(r) for r in rows], dtype=np.int64)
        if len(rows) != self.B or lens.max() > self.capacity:
            raise ConfigError(f"{len(rows)} rows of up to {lens.max()} tokens do not fit a cache "
                             f"of {self.B} rows x {self.capacity} tokens")
        T = int(lens.max())
        ids = np.full((self.B, T), pad, dtype=np.int64)
        for b, row in enumerate(rows):
            ids[b, :len(row)] = row
        pos = np.minimum(np.arange(T, dtype=np.int64), lens[:, None] - 1)  # padding: any valid
        self._bind("input_ids", ids, prefill=True)
        self._bind("position_ids", pos, prefill=True)
        self.qlens[:] = lens
        self.seqlens[:] = lens - 1
        self.total[...] = T
        self.wlens[:] = 0
        self._run_prompt(lens, self.B)
        self.lens[:] = lens
        if self.prefill_binding is self.binding:  # one graph: steps need their inputs back
            self._step_io_back()
        return self.logits

    def _step_io_back(self) -> None:
        """Bind back what the step reads and writes of its own, after a prompt ran through the
        same binding (a pair of one graph)."""
        k = self._rows
        self._bind("input_ids", self.ids[:k])
        self._bind("position_ids", self.pos[:k])
        if self.hidden_step is not None:
            self._bind(HIDDEN_OUTPUT, self.hidden_step[:k], output=True)

    def prompt_hidden(self) -> np.ndarray:
        """The hidden states [B, T, C] of every position of the last prompt run (prefill or
        extend), right-padded as it ran; ConfigError for a graph without them."""
        if self._hidden_at is None:
            raise ConfigError(f"this shared-cache graph has no {HIDDEN_OUTPUT!r} output (made "
                              "by an older tinyt): make it again with `tinyt optimize --target "
                              "gqa` to score prompts")
        assert self._hidden is not None  # every prompt run keeps its own
        return self._hidden.numpy()

    def extend(self, ids: list[int]) -> np.ndarray:
        """One row (B == 1): run the next piece of a prompt whose first lens[0] tokens are in
        the cache already (chunked prefill, runtime/engine.py); logits of its last token."""
        start, n = int(self.lens[0]), len(ids)
        if self.B != 1 or start + n > self.capacity:
            raise ConfigError(f"extend takes one row with room for {n} more tokens "
                             f"(rows {self.B}, {start} of {self.capacity} used)")
        tokens = np.array([ids], dtype=np.int64)  # alive through the run: bound by address
        pos = np.arange(start, start + n, dtype=np.int64)[None]
        self._bind("input_ids", tokens, prefill=True)
        self._bind("position_ids", pos, prefill=True)
        self.qlens[0], self.seqlens[0], self.total[...] = n, start + n - 1, start + n
        self._run_prompt(np.array([n]), 1)
        self.lens[0] = start + n
        if self.prefill_binding is self.binding:  # one graph: steps need their inputs back
            self._step_io_back()
        return self.logits[0, 0]

    def _keep_window(self, b: int) -> None:
        """Row b's windowed buffers keep their last `window` tokens, moved to the front (no
        later query of the row reaches the others)."""
        n = int(self.wlens[b])
        k = min(n, self.window)
        if k < n:
            for i, buf in enumerate(self.kv):
                if i // 2 in self.window_layers:
                    buf[b, :, :k] = buf[b, :, n - k:n]
            self.wlens[b] = k

    def _window_lengths(self, adds: np.ndarray, rows: int) -> int:
        """Before a run adding adds[b] tokens to each of the first `rows` rows: a row whose
        windowed buffers would overflow keeps its window; the windowed layers' seqlens_k and
        total_sequence_length are set. Returns the tokens their buffers must hold for the run
        (more than wcap: a prompt piece longer than the slack, run through temporary ones)."""
        for b in np.flatnonzero((self.wlens[:rows] + adds > self.wcap)
                                & (self.wlens[:rows] > self.window)):
            self._keep_window(int(b))
        after = self.wlens[:rows] + adds
        self.wseqlens[:rows] = np.maximum(after - 1, 0)
        self.wtotal[...] = self.wseqlens[:rows].max() + 1
        return int(after.max())

    def _run_prompt(self, adds: np.ndarray, rows: int) -> None:
        """Run the prompt binding (prefill, extend) for adds[b] new tokens of each of the first
        `rows` rows; a piece that the windowed layers' buffers cannot hold runs through
        temporary buffers of its length, which then leave their window in the buffers."""
        if self._hidden_at is not None:  # a fresh output each run: its shape is the run's
            self.prefill_binding.bind_output(HIDDEN_OUTPUT, "cpu")
        try:
            self._run_prompt_binding(adds, rows)
        finally:
            if self._hidden_at is not None:  # kept until the next prompt run (prompt_hidden)
                self._hidden = self.prefill_binding.get_outputs()[self._hidden_at]

    def _run_prompt_binding(self, adds: np.ndarray, rows: int) -> None:
        if not self.window_layers:
            self.prefill_session.run_with_iobinding(self.prefill_binding)
            return
        need = self._window_lengths(adds, rows)
        if need <= self.wcap:
            self.prefill_session.run_with_iobinding(self.prefill_binding)
            self.wlens[:rows] += adds
            return
        nbytes = 2 * len(self.window_layers) * int(np.prod(kv_shape(self.cfg, self.B, need))) \
            * np.dtype(self.kv_dtype).itemsize
        why = memory_refusal(nbytes, f"the windowed layers' temporary buffers for a prompt "
                                     f"piece reaching {need} tokens", self.lower)
        if why:
            raise MemoryLimitError(why)
        names = list(zip(past_names(self.cfg.n_layer), present_names(self.cfg.n_layer)))
        temp = {}
        held = int(self.wlens.max())
        for i, buf in enumerate(self.kv):
            if i // 2 in self.window_layers:
                t = np.zeros((*buf.shape[:2], need, buf.shape[3]), dtype=buf.dtype)
                t[:, :, :held] = buf[:, :, :held]
                temp[i] = t
                self._bind(names[i][0], t, prefill=True)
                self._bind(names[i][1], t, output=True, prefill=True)
        try:
            self.prefill_session.run_with_iobinding(self.prefill_binding)
        finally:
            for i in temp:
                self._bind(names[i][0], self.kv[i], prefill=True)
                self._bind(names[i][1], self.kv[i], output=True, prefill=True)
        after = self.wlens[:rows] + adds
        keep = np.minimum(after, self.window)
        for i, t in temp.items():
            for b in range(rows):
                n, k = int(after[b]), int(keep[b])
                self.kv[i][b, :, :k] = t[b, :, n - k:n]
        self.wlens[:rows] = keep

    def clear(self, row: int | None = None) -> None:
        """Forget the tokens of one row (None: every row); its buffers are reused."""
        rows = slice(None) if row is None else row
        self.lens[rows] = 0
        self.wlens[rows] = 0

    def admit_from(self, new: dict[int, list[int]], pad: int,
                   staging: SharedCache) -> dict[int, np.ndarray]:
        """Continuous batching (runtime/engine.py): run the prompts of some rows (row -> token
        ids) through `staging`, a cache of exactly len(new) rows, then copy their keys and
        values into those rows of this cache, which other rows keep using meanwhile. Only the
        new rows' tokens are computed. Returns each new row's last-token logits [vocab]."""
        logits = staging.prefill(list(new.values()), pad)
        out = {}
        for j, row in enumerate(new):
            self.copy_in(row, staging, j)
            out[row] = logits[j, 0].copy()
        return out

    def copy_from(self, other: SharedCache) -> None:
        """Every row of `other` (a cache of as many rows, smaller or as large) into this one:
        the tokens it holds and their keys and values (a generation moving to a larger cache)."""
        n, m = int(other.lens.max()), int(other.wlens.max())
        for i, (mine, theirs) in enumerate(zip(self.kv, other.kv)):
            k = m if i // 2 in self.window_layers else n  # a larger cache's wcap is no shorter
            mine[:, :, :k] = theirs[:, :, :k]
        self.lens[:] = other.lens
        self.wlens[:] = other.wlens

    def copy_in(self, row: int, staging: SharedCache, j: int = 0) -> None:
        """This cache's `row` becomes staging's row j (its lens[j] tokens of keys and values)."""
        n, m = int(staging.lens[j]), int(staging.wlens[j])
        w = m if m <= self.wcap else min(m, self.window)  # the window, if all will not fit
        for i, (mine, theirs) in enumerate(zip(self.kv, staging.kv)):
            if i // 2 in self.window_layers:
                mine[row, :, :w] = theirs[j, :, m - w:m]
            else:
                mine[row, :, :n] = theirs[j, :, :n]
        self.lens[row] = n
        self.wlens[row] = w

    def step_rows(self, k: int, nxt: np.ndarray, active: np.ndarray) -> np.ndarray:
        """One token for each active row among the first k (the others idle): the step graph
        runs k rows, not the cache's B, so a few requests in a large cache cost what a few
        rows do. Logits [k, vocab]."""
        if k != self._rows:  # bind views of the first k rows: the same memory, a smaller batch
            for past, present, buf in zip(past_names(self.cfg.n_layer),
                                          present_names(self.cfg.n_layer), self.kv):
                self._bind(past, buf[:k], prefill=False)
                self._bind(present, buf[:k], output=True, prefill=False)
            self._bind("logits", self.logits[:k], output=True, prefill=False)
            if self.hidden_step is not None:
                self._bind(HIDDEN_OUTPUT, self.hidden_step[:k], output=True, prefill=False)
            for name, buf in (("seqlens_k", self.seqlens), ("query_seqlens", self.qlens),
                              ("input_ids", self.ids), ("position_ids", self.pos),
                              *(((WINDOW_INPUTS[0], self.wseqlens),) if self.window_layers
                                else ())):
                self._bind(name, buf[:k], prefill=False)
            self._rows = k
        a = active[:k].astype(np.int32)
        self.ids[:k, 0] = nxt[:k]
        self.pos[:k, 0] = self.lens[:k]
        self.qlens[:k] = a
        self.seqlens[:k] = np.maximum(self.lens[:k] - 1 + a, 0)
        self.total[...] = self.seqlens[:k].max() + 1
        if self.window_layers:
            self._window_lengths(a, k)
        self.session.run_with_iobinding(self.binding)
        self.lens[:k] += a
        if self.window_layers:
            self.wlens[:k] += a
        return self.logits[:k, 0]

    def step(self, nxt: np.ndarray, active: np.ndarray | None) -> np.ndarray:
        """One token per active row (None: every row; an inactive row idles, its cache left as
        it is)."""
        if self.B == 1:  # one row, running while the loop does: element writes, no ufuncs
            n = int(self.lens[0])
            self.ids[0, 0], self.pos[0, 0] = nxt[0], n
            self.qlens[0], self.seqlens[0], self.total[()] = 1, n, n + 1
            if self.window_layers:
                if self.wlens[0] >= self.wcap:
                    self._keep_window(0)
                m = int(self.wlens[0])
                self.wseqlens[0], self.wtotal[()] = m, m + 1
            self.session.run_with_iobinding(self.binding)
            self.lens[0] = n + 1
            if self.window_layers:
                self.wlens[0] = m + 1
            return self.logits
        a = np.ones(self.B, np.int32) if active is None else active.astype(np.int32)
        self.ids[:, 0] = nxt
        self.pos[:, 0] = self.lens  # the new token's position: the tokens before it
        self.qlens[:] = a
        self.seqlens[:] = np.maximum(self.lens - 1 + a, 0)  # an empty idle row: 0, unchanged
        self.total[...] = self.seqlens.max() + 1
        if self.window_layers:
            self._window_lengths(a, self.B)
        self.session.run_with_iobinding(self.binding)
        self.lens += a
        if self.window_layers:
            self.wlens += a
        return self.logits


def rows_from_left_padded(ids: np.ndarray, mask: np.ndarray) -> list[list[int]]:
    """The token rows of a left-padded batch (the contract's layout)."""
    return [row[m.astype(bool)].tolist() for row, m in zip(ids, mask)]


class CachePool:
    """SharedCaches kept between generations, by batch size and capacity: setting one up
    (buffers and some twenty bindings) costs more than tens of decode steps' Python work. A
    cache is used by one generation at a time; at most `keep` wait here. take(batch,
    capacity) hands out the smallest free cache of that batch holding at least `capacity`
    tokens (capacities are capacity_for's powers of two, so nearby sizes share one)."""

    def __init__(self, make: Callable[[int, int], SharedCache], keep: int = 4):
        self.make, self.keep = make, keep
        self.free: list[SharedCache] = []
        self.lock = threading.Lock()

    def take(self, batch: int, capacity: int) -> SharedCache:
        with self.lock:
            fits = [i for i, c in enumerate(self.free) if c.B == batch and c.capacity >= capacity]
            if fits:
                return self.free.pop(min(fits, key=lambda i: self.free[i].capacity))
        return self.make(batch, capacity)

    def give(self, cache: SharedCache) -> None:
        with self.lock:
            self.free.insert(0, cache)
            del self.free[self.keep:]
