"""The lifecycle both engines share (runtime/engine.py's decoder engine, runtime/seq2seq_engine.py's
encoder-decoder one): a bounded queue the callers fill, one thread that admits and steps, and a
stop that finishes or cancels what is in flight.

    submit ──_enqueue (QueueFull past max_queue or once stopping)──▶ _waiting
    the thread, while there is work:  new = _admit()   (the lock held)
                                      _iterate(new)    (the lock free: the model runs)
      a model that raises: every request in flight gets Done('error', …) and the engine's
      rows are reset (_reset), so no caller waits forever and the next request is served

A subclass says what its work is: _busy (rows running), _admit, _iterate, _in_flight (every
request admitted and not finished, the newcomers of a step included) and _reset.
"""
from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from tinyt.errors import QueueFull

from .request import Done, Request


class EngineLoop:
    """A queue of max_queue waiting items and the thread that serves them (see the module)."""

    THREAD_NAME = "tinyt-engine"

    def __init__(self, *, max_queue: int):
        self.max_queue = max_queue
        self._waiting: collections.deque[Any] = collections.deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.steps_run = 0  # steps (one token for every running row), for metrics
        self.tokens_generated = 0

    # -- what a subclass defines ----------------------------------------------------------------
    def _busy(self) -> bool:
        """Rows are running (or filling): the thread has work without a waiting request."""
        raise NotImplementedError

    def _admit(self) -> Any:
        """The waiting requests this step takes (the lock is held)."""
        raise NotImplementedError

    def _iterate(self, new: Any) -> None:
        """One step with the newcomers `new` (the lock is free)."""
        raise NotImplementedError

    def _in_flight(self, new: Any) -> list[Request]:
        """Every request admitted and running, the newcomers `new` included."""
        raise NotImplementedError

    def _reset(self) -> None:
        """After a failed step: no rows running, every row free (the lock is held)."""
        raise NotImplementedError

    @staticmethod
    def _request(item: Any) -> Request:
        """The request of a waiting item (a subclass may queue more beside it)."""
        return item

    # -- the caller's side ------------------------------------------------------------------
    def start(self):
        self._thread = threading.Thread(target=self._run, name=self.THREAD_NAME, daemon=True)
        self._thread.start()
        return self

    def _enqueue(self, item: Any) -> None:
        """Queue a checked request: QueueFull when max_queue wait or the engine stops."""
        with self._cond:
            if self._stopping:
                raise QueueFull("the engine is stopping and takes no new requests")
            if len(self._waiting) >= self.max_queue:
                raise QueueFull(f"{len(self._waiting)} requests are waiting (max_queue "
                                f"{self.max_queue})")
            self._waiting.append(item)
            self._cond.notify()

    @contextlib.contextmanager
    def together(self) -> Iterator[None]:
        """Requests submitted inside wait for the engine's next step together, so one step
        admits them all where rows and its prompt budget allow (a request's n samples: their
        prompt then runs once). The engine's lock, re-entrant, is held meanwhile."""
        with self._cond:
            yield

    def stop(self, *, cancel: bool = False, timeout: float | None = 30.0) -> None:
        """Take no new requests; finish what runs and waits (cancel=True: cancel it), then
        end the thread."""
        with self._cond:
            self._stopping = True
            if cancel:
                for req in [*map(self._request, self._waiting), *self._in_flight(None)]:
                    req.cancel()
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def queue_depth(self) -> int:
        return len(self._waiting)

    @property
    def alive(self) -> bool:
        """The thread was started and still runs (a replica's health check reads it)."""
        return self._thread is not None and self._thread.is_alive()

    # -- the engine's thread ------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._waiting or self._busy() or self._stopping)
                if self._stopping and not self._waiting and not self._busy():
                    return
                new = self._admit()
            try:
                self._iterate(new)
            except Exception as e:  # a broken model: every request learns it, none hangs
                for req in self._in_flight(new):
                    if req.done is None:
                        req._emit(Done("error", "", f"{type(e).__name__}: {e}"))
                with self._cond:
                    self._reset()
