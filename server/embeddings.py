"""Sentence embeddings for `tinyt serve` on an encoder artifact (POST /v1/embeddings): an
Embedder thread owns the encoder's session and runs the requests waiting when it is free
together, so concurrent clients share runs instead of queueing one run each.

    handler ── rows (tokenized texts | token ids as given) ──submit──▶ pending (max_queue)
    Embedder thread:  take the pending requests, whole, up to max_batch inputs (at least one)
                      ──▶ sort their inputs by length ──▶ runs of max_batch ──▶ each its rows
    handler ◀── Future[np.ndarray [inputs, dim]] ── embedding_answer (float | base64)

No request waits for company: a run starts as soon as the encoder is free, with whatever is
pending then; under load, the requests that arrive during a run share the next one.
"""
from __future__ import annotations

import base64
import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from tinyt.errors import ConfigError, QueueFull
from tinyt.runtime.embed import Encoder

Row = tuple[list[int], list[int]]  # (token ids, token type ids) of one input
EMBED_BATCH = 32  # inputs per run unless told (--max-batch): Encoder.embed's batch_size


@dataclass
class Pending:
    """One request's inputs and where its embeddings go."""
    rows: list[Row]
    future: Future


def run_rows(enc: Encoder, rows: Sequence[Row]) -> np.ndarray:
    """Sentence embeddings [len(rows), dim] of inputs already tokenized, in one run (right
    padded; the mask hides the padding)."""
    return enc.embed_rows(list(rows))


def embedding_answer(vectors: np.ndarray, fmt: str, model_id: str, tokens: int) -> dict:
    """OpenAI's answer: one embedding per input, as floats or base64 of little-endian float32."""
    if fmt == "base64":
        data = [base64.b64encode(v.astype("<f4").tobytes()).decode("ascii") for v in vectors]
    else:
        data = vectors.astype(np.float32).tolist()
    return {"object": "list",
            "data": [{"object": "embedding", "index": i, "embedding": e}
                     for i, e in enumerate(data)],
            "model": model_id, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


class Embedder:
    """The encoder of one server and the thread that runs its embedding requests (started and
    stopped with the app, as the decoders' Engine is)."""

    def __init__(self, enc: Encoder, *, max_batch: int = EMBED_BATCH, max_queue: int = 64):
        if "sentence_embedding" not in [o.name for o in enc.session.get_outputs()]:
            raise ConfigError(f"{enc.artifact.path} is an encoder without a pooling (hidden "
                              "states only), so it has no sentence embeddings to serve: import "
                              "a sentence-transformers directory, whose Pooling module says "
                              "how tokens make a sentence")
        for name, value in (("max_batch", max_batch), ("max_queue", max_queue)):
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                raise ConfigError(f"{name}={value!r} must be an integer >= 1")
        self.enc, self.max_batch, self.max_queue = enc, max_batch, max_queue
        self.dim, self.max_length = enc.dim, enc.max_length
        self.vocab_size = enc.config.vocab_size
        self.runs = 0  # runs of the session so far (each up to max_batch inputs)
        self._pending: deque[Pending] = deque()
        self._cv = threading.Condition()
        self._running = 0  # inputs of the requests being run
        self._stopping = False
        self._thread: threading.Thread | None = None

    # -- what the metrics read (EngineLoad) ---------------------------------------------------
    @property
    def queue_depth(self) -> int:
        """Requests waiting for the encoder."""
        return len(self._pending)

    @property
    def running(self) -> int:
        """Inputs of the requests being run."""
        return self._running

    @property
    def alive(self) -> bool:
        """The encoder's thread was started and still runs (a replica's health check)."""
        return self._thread is not None and self._thread.is_alive()

    # -- the handlers' side -------------------------------------------------------------------
    def rows(self, texts: list[str], ids: list[list[int]]) -> list[Row]:
        """The inputs to run: texts tokenized as the encoder does ([CLS] ... [SEP], cut at
        max_length), or token ids as given (one token type)."""
        if texts:
            return self.enc.encode(texts)
        return [(row, [0] * len(row)) for row in ids]

    def submit(self, rows: list[Row]) -> Future:
        """A Future of the rows' embeddings [len(rows), dim]; QueueFull when max_queue
        requests wait already. Cancelling it before its run drops it."""
        future: Future = Future()
        with self._cv:
            if self._stopping:
                raise QueueFull("the server is stopping")
            if len(self._pending) >= self.max_queue:
                raise QueueFull(f"{len(self._pending)} requests are waiting (max_queue "
                                f"{self.max_queue})")
            self._pending.append(Pending(rows, future))
            self._cv.notify()
        return future

    # -- the thread ---------------------------------------------------------------------------
    def start(self) -> Embedder:
        self._thread = threading.Thread(target=self._loop, name="tinyt-embedder", daemon=True)
        self._thread.start()
        return self

    def stop(self, *, timeout: float | None = 30.0) -> None:
        """Take no more requests, run those waiting, then end the thread."""
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._pending and not self._stopping:
                    self._cv.wait()
                if not self._pending:
                    return  # stopping, nothing left
                batch = self._take()
                self._running = sum(len(p.rows) for p in batch)
            if not batch:  # every one taken was cancelled
                continue
            try:
                self._run(batch)
            finally:
                self._running = 0

    def _take(self) -> list[Pending]:
        """The pending requests, whole and in order, up to max_batch inputs (at least one
        request: a larger one runs alone, in runs of max_batch); cancelled ones dropped."""
        batch: list[Pending] = []
        size = 0
        while self._pending:
            nxt = self._pending[0]
            if batch and size + len(nxt.rows) > self.max_batch:
                break
            self._pending.popleft()
            if nxt.future.set_running_or_notify_cancel():
                batch.append(nxt)
                size += len(nxt.rows)
        return batch

    def _run(self, batch: list[Pending]) -> None:
        """The batch's inputs sorted by length (a short one is not padded to a long one's)
        in runs of max_batch, each request's embeddings set on its future."""
        rows = [row for p in batch for row in p.rows]
        out = np.empty((len(rows), self.dim), dtype=np.float32)
        order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]))
        try:
            for s in range(0, len(order), self.max_batch):
                part = order[s:s + self.max_batch]
                out[part] = run_rows(self.enc, [rows[i] for i in part])
                self.runs += 1
        except Exception as e:  # the failure is each request's answer, not the thread's end
            for p in batch:
                p.future.set_exception(e)
            return
        start = 0
        for p in batch:
            p.future.set_result(out[start:start + len(p.rows)])
            start += len(p.rows)
