"""A request to the continuous-batching engine (runtime/engine.py) and the events it hears
(torch-free).

    engine.submit(...) ──▶ Request ──▶ [Scored(the prompt's logprobs)], Token, Token, ..., Done
                            ▲  next_event() / wait() on the caller's thread; the engine's
                            └─ thread appends (_emit) and a listener may hear each as it comes

A Request is shared by two threads: the engine appends its events under its condition, the
caller reads them or cancels it (an Event the engine checks between steps).
"""
from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .detok import TextStream
from .sampling import Constraint, SamplingParams
from .score import Logprob


@dataclass
class Token:
    id: int
    text: str  # the text this token completes (may be empty: a partial character or stop)
    at: float  # time.perf_counter() when it was chosen
    logprob: Logprob | None = None  # with the request's logprobs: its own and the top N


@dataclass
class Scored:
    """The prompt's tokens with their log-probabilities (the first has none: None), before
    any Token: a request's prompt_logprobs."""
    prompt: list[Logprob | None]


@dataclass
class Done:
    finish_reason: str  # eos | stop | length | context | cancelled | error
    text: str  # the whole generated text, cut at a stop string
    error: str | None = None


@dataclass
class Request:
    """One generation. The engine appends events and sets `finished`; the caller reads them
    with next_event() (or wait()), and may cancel() at any time."""

    prompt_ids: list[int]
    params: SamplingParams
    submitted: float = field(default_factory=time.perf_counter)
    out: list[int] = field(default_factory=list)
    done: Done | None = None
    _events: collections.deque = field(default_factory=collections.deque)
    _ready: threading.Condition = field(default_factory=threading.Condition)
    _cancelled: threading.Event = field(default_factory=threading.Event)
    listener: Callable[[Token | Done | Scored], None] | None = None  # on the engine's thread
    logprobs: int | None = None  # each chosen token's logprob and this many alternatives
    prompt_logprobs: int | None = None  # the prompt's logprobs and this many alternatives
    constraint: Constraint | None = None  # what its tokens must follow (runtime/sampling.py)
    _text: TextStream | None = None  # made when the engine admits it

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def next_event(self, timeout: float | None = None) -> Token | Done | Scored | None:
        """The next event, waiting up to `timeout` seconds (None: until there is one)."""
        with self._ready:
            if not self._events:
                self._ready.wait_for(lambda: bool(self._events), timeout)
            return self._events.popleft() if self._events else None

    def wait(self, timeout: float | None = None) -> Done | None:
        """Block until the request is finished; its Done (None on timeout)."""
        with self._ready:
            self._ready.wait_for(lambda: self.done is not None, timeout)
        return self.done

    def _emit(self, event: Token | Done | Scored) -> None:
        with self._ready:
            if isinstance(event, Done):
                self.done = event
            self._events.append(event)
            self._ready.notify_all()
        if self.listener is not None:  # e.g. an event loop's call_soon_threadsafe
            self.listener(event)
