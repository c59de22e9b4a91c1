"""Continuous batching (torch-free): the engine `tinyt serve` drives, usable by any application.

    submit(prompt ids, SamplingParams) ──bounded queue──▶ the engine's thread, in a loop:
      admit   waiting requests into free rows of one cache [max_batch rows x context: the
              model's, or rt.load's max_context; refused before it is allocated where it does
              not fit the machine's memory], up to
              prefill_tokens prompt tokens at a time (the running rows wait for them): their
              prompts run through the prompt graph, together where the graph computes each
              row as if alone (quantize --kernel qgemm-rows), else one by one; or, with
              prefill_chunk=N, N prompt tokens between two steps, a prompt in pieces that
              continue its own staging cache, so a running row never waits for more than one
              piece
      step    one token for every running row, in one run of the step graph
      choose  each row with its own sampling settings, seed and stop strings; a finished or
              cancelled row frees its place at once, and the next request takes it
    ──▶ per request, events as they happen: [Scored(the prompt's logprobs), asked for with
        prompt_logprobs], Token(id, text piece[, logprob]), then Done(finish_reason)

A request may ask for the log-probabilities of its tokens (logprobs=N: each chosen token's and
the N most likely there) and of its prompt's tokens (prompt_logprobs=N: from the prompt's own
run, which on a shared-cache graph gives the hidden states of every position to the lm_head's
nodes alone, runtime/score.py); max_new_tokens=0 then scores the prompt and makes nothing.
Text is decoded as tokens come (runtime/detok.py), each token once.

On the shared-cache pair (`optimize --target gqa`) rows share one GroupQueryAttention buffer
per layer and one run serves every row: a decode step at GPT-2 size reads the weights once for
all of them. A contract graph (`onnx`, `onnx-int8`) works too, more simply: each row keeps its
own cache and runs alone, so rows interleave instead of batching (a step costs what it costs
alone, times the rows: runtime/rows.py holds both). Either way a request's tokens are its own:
rows never mix, and each row's sampling draws only from its own generator. A Request and its
events are runtime/request.py's.
"""
from __future__ import annotations

import heapq
import time
from collections.abc import Callable

import numpy as np

from tinyt.contract import SHARED_CACHE_KIND
from tinyt.errors import ConfigError, NonFiniteError, QueueFull

from .detok import TextStream
from .engine_loop import EngineLoop
from .generate import LanguageModel
from .request import Done, Request, Scored, Token
from .rows import ENGINE_LOWER, SeparateRows, SharedRows, rows_independent
from .sampling import Constraint, SamplingParams
from .score import check_top

# A request and its events (runtime/request.py) and the rows (runtime/rows.py) are imported
# here by their users: `from tinyt.runtime.engine import Done, Engine, Token`.
__all__ = ["DEFAULT_PREFIX_BYTES", "ENGINE_LOWER", "Done", "Engine", "QueueFull", "Request",
           "Scored", "Token", "rows_independent"]

# The prefix store's budget unless told (prefix_cache_bytes, --prefix-cache-mb): kept prompts'
# keys and values beside the running rows' cache.
DEFAULT_PREFIX_BYTES = 256 << 20


class Engine(EngineLoop):
    """A thread that batches requests continuously on one loaded model.

        engine = Engine(rt.load("artifacts/onnx-int8-gqa"), max_batch=8).start()
        req = engine.submit(lm.tokenizer.encode_prompt("def "), SamplingParams(max_new_tokens=32))
        while not isinstance(event := req.next_event(), Done): print(event.text, end="")
        engine.stop()
    """

    def __init__(self, lm: LanguageModel, *, max_batch: int = 8, max_queue: int = 64,
                 prefill_tokens: int = 64, prefill_chunk: int | None = None,
                 prefix_cache_bytes: int | None = None):
        if not (isinstance(max_batch, int) and max_batch >= 1):
            raise ConfigError(f"max_batch={max_batch!r} must be an integer >= 1")
        if not (isinstance(max_queue, int) and max_queue >= 1):
            raise ConfigError(f"max_queue={max_queue!r} must be an integer >= 1")
        if lm.artifact.fixed:
            raise ConfigError(f"{lm.artifact.path} is pinned to fixed shapes; serve a "
                              "dynamic-shape artifact (the shared-cache pair batches best)")
        if not (isinstance(prefill_tokens, int) and prefill_tokens >= 1):
            raise ConfigError(f"prefill_tokens={prefill_tokens!r} must be an integer >= 1")
        original = lm.longrope_original
        if original is not None and lm.context > original:
            raise ConfigError(
                f"{lm.artifact.path} turns at LongRoPE's long frequencies past "
                f"{original} tokens (a sequence's whole cache made again there), and the rows "
                f"of one batch share one table: serve it with a context of at most {original} "
                f"(rt.load's max_context, --max-context); this one is {lm.context}")
        super().__init__(max_queue=max_queue)
        self.lm, self.max_batch = lm, max_batch
        # Prompt tokens admitted between two steps (at least one request's): the running rows
        # wait for those prompts, so this bounds the time between their tokens.
        self.prefill_tokens = prefill_tokens
        self.batched = lm.artifact.kind == SHARED_CACHE_KIND
        if prefill_chunk is not None and not (isinstance(prefill_chunk, int)
                                              and prefill_chunk >= 1):
            raise ConfigError(f"prefill_chunk={prefill_chunk!r} must be an integer >= 1")
        if prefill_chunk is not None and not self.batched:
            raise ConfigError("prefill_chunk needs a shared-cache graph (optimize --target gqa): "
                              f"{lm.artifact.path} is a {lm.artifact.kind} graph")
        # Prompt tokens run between two steps when prompts go in pieces (None: whole prompts,
        # up to prefill_tokens): a running row waits for one piece at most.
        self.prefill_chunk = prefill_chunk
        # row -> [request, staging cache (taken at its first piece: one prompt is filled at a
        # time, so one staging cache is in use however many wait), tokens done]
        self._filling: dict[int, list] = {}
        self.prefix_cache_bytes = self._prefix_budget(prefix_cache_bytes)
        self.rows = self._make_rows()
        self._running: dict[int, Request] = {}
        self._rngs: dict[int, np.random.Generator | None] = {}
        self._free = list(range(max_batch))  # a heap: the lowest free row is taken first

    def _prefix_budget(self, wanted: int | None) -> int:
        """The prefix store's bytes: `wanted` (None: DEFAULT_PREFIX_BYTES where reuse is
        exact, else 0), checked."""
        if wanted is not None and not (isinstance(wanted, int) and not isinstance(wanted, bool)
                                       and wanted >= 0):
            raise ConfigError(f"prefix_cache_bytes={wanted!r} must be an integer >= 0 (0: off)")
        why = None
        if not self.batched:
            why = (f"{self.lm.artifact.path} is a {self.lm.artifact.kind} graph: rows keep no "
                   "shared cache to copy (optimize --target gqa)")
        elif self.lm.prompt_scales_shared:
            why = (f"{self.lm.artifact.path}'s prompt graph quantizes activations with one "
                   "scale over a run (quantize --kernel qgemm), so a prompt's rows depend on "
                   "what ran with them and reused ones would not be what computing it gives")
        if why is None:
            return DEFAULT_PREFIX_BYTES if wanted is None else wanted
        if wanted:
            raise ConfigError(f"prefix reuse is not offered here: {why}")
        return 0

    def _make_rows(self) -> SharedRows | SeparateRows:
        if self.batched:
            return SharedRows(self.lm, self.max_batch, self.prefix_cache_bytes)
        return SeparateRows(self.lm, self.max_batch)

    @property
    def prefix_reused_tokens(self) -> int:
        """Prompt tokens copied from kept sequences instead of computed (for /metrics)."""
        store = getattr(self.rows, "prefixes", None)
        return 0 if store is None else store.reused_tokens

    @property
    def shared_prompt_tokens(self) -> int:
        """Prompt tokens copied from an identical prompt admitted in the same step (a
        request's n samples) instead of computed (for /metrics)."""
        return getattr(self.rows, "shared_prompt_tokens", 0)

    # -- the caller's side ------------------------------------------------------------------
    def submit(self, prompt_ids: list[int], params: SamplingParams, *,
               listener: Callable[[Token | Done | Scored], None] | None = None,
               logprobs: int | None = None, prompt_logprobs: int | None = None,
               constraint: Constraint | None = None) -> Request:
        """Queue a generation; QueueFull when max_queue are waiting, ConfigError (a
        ValueError) for a prompt that leaves no room for a token. `listener` hears every event
        as it happens. logprobs / prompt_logprobs: None, or the alternatives (0..MAX_TOP) to
        give beside each chosen / prompt token's own logprob. constraint: what the tokens must
        follow (a Constraint of this request's own; it ends the request with 'stop' when
        finished)."""
        (ids,) = self.lm.check_ids([prompt_ids])
        for name, top in (("logprobs", logprobs), ("prompt_logprobs", prompt_logprobs)):
            if top is not None:
                check_top(top, name)
        if prompt_logprobs is not None:
            self.lm.check_scoring()
        req = Request(ids, params, listener=listener, logprobs=logprobs,
                      prompt_logprobs=prompt_logprobs, constraint=constraint)
        self._enqueue(req)
        return req

    @property
    def running(self) -> int:
        return len(self._running)

    # -- the engine's thread (EngineLoop's loop) ------------------------------------------------
    def _busy(self) -> bool:
        return bool(self._running or self._filling)

    def _admit(self) -> dict[int, Request]:
        """The waiting requests this step takes, by row: as many as free rows and the prompt
        budget allow, at least one; a prompt admitted twice (n samples) counts once, as its
        copy runs no prompt."""
        new: dict[int, Request] = {}
        budget = self.prefill_tokens
        runs: set[tuple[int, ...]] = set()  # prompts this step computes (admit's twins)
        while self._waiting and self._free and (
                self.prefill_chunk or not new
                or len(self._waiting[0].prompt_ids) <= budget
                or tuple(self._waiting[0].prompt_ids) in runs):  # a copy: no budget
            req = self._waiting.popleft()
            if req.cancelled:
                req._emit(Done("cancelled", ""))
                continue
            new[heapq.heappop(self._free)] = req
            key = tuple(req.prompt_ids)
            if key not in runs or req.prompt_logprobs is not None:
                budget -= len(req.prompt_ids)
            if req.prompt_logprobs is None:
                runs.add(key)
        return new

    def _in_flight(self, new: dict[int, Request] | None) -> list[Request]:
        return [*(new or {}).values(), *self._running.values(),
                *(f[0] for f in self._filling.values())]

    def _reset(self) -> None:
        self._running.clear()
        self._filling.clear()
        self._free = list(range(self.max_batch))
        self.rows = self._make_rows()

    def _iterate(self, new: dict[int, Request]) -> None:
        for row, req in list(self._running.items()):  # cancelled: freed within a step
            if req.cancelled:
                self._finish(row, req, "cancelled")
        for row, req in new.items():
            self._rngs[row] = (np.random.default_rng(req.params.seed)
                               if req.params.temperature > 0 else None)
            req._text = TextStream(self.lm.tokenizer, req.params.stop)
        if new and self.prefill_chunk:
            for row, req in new.items():
                self._filling[row] = [req, None, 0, [None]]  # staging: at its first piece
        elif new:
            self._running.update(new)
            logits, scored = self.rows.admit(
                {row: req.prompt_ids for row, req in new.items()},
                {row: req.prompt_logprobs for row, req in new.items()
                 if req.prompt_logprobs is not None})
            for row, req in new.items():
                if row in scored:
                    req._emit(Scored(scored[row]))
                self._first(row, req, logits[row])
        if self._filling:
            self._fill_one_piece()
        if not self._running:
            return
        nxt = np.zeros(self.max_batch, dtype=np.int64)
        active = np.zeros(self.max_batch, dtype=bool)
        for row, req in self._running.items():
            nxt[row], active[row] = req.out[-1], True
        logits = self.rows.step(nxt, active)
        self.steps_run += 1
        for row, req in list(self._running.items()):
            self._choose(row, req, logits[row])

    @property
    def _shared(self) -> SharedRows:
        """The rows as one shared cache (prefill_chunk is refused for other graphs)."""
        assert isinstance(self.rows, SharedRows)
        return self.rows

    def _fill_one_piece(self) -> None:
        """The next piece of the oldest prompt being filled; once whole, its row runs."""
        for row, (req, staging, *_) in list(self._filling.items()):
            if req.cancelled:
                del self._filling[row]
                self._shared.finish_filling(row, staging, None)
                self._free_row(row, req, "cancelled")
        if not self._filling:
            return
        row, state = next(iter(self._filling.items()))
        req = state[0]
        if state[1] is None:  # its first piece: a kept prefix may stand for some
            state[1], state[2] = self._shared.start_filling(
                req.prompt_ids, reuse=req.prompt_logprobs is None)
        req, staging, done, scored = state
        piece = req.prompt_ids[done:done + self.prefill_chunk]
        logits = self._shared.fill(staging, piece)
        state[2] = done + len(piece)
        if req.prompt_logprobs is not None:  # the tokens after the piece's positions
            scored.extend(self._shared.piece_logprobs(
                staging, piece, req.prompt_ids[done + 1:state[2] + 1], req.prompt_logprobs))
        if state[2] == len(req.prompt_ids):
            del self._filling[row]
            self._shared.finish_filling(row, staging, req.prompt_ids)
            self._running[row] = req
            if req.prompt_logprobs is not None:
                req._emit(Scored(scored))
            self._first(row, req, logits)

    def _free_row(self, row: int, req: Request, reason: str) -> None:
        """A row that never ran (cancelled while its prompt was filled)."""
        req._emit(Done(reason, ""))
        with self._cond:
            self._rngs.pop(row, None)
            self.rows.release(row)
            heapq.heappush(self._free, row)

    def _first(self, row: int, req: Request, logits: np.ndarray) -> None:
        """After a prompt's run: its first token, or (max_new_tokens 0: a prompt scored
        only) its end."""
        if req.params.max_new_tokens == 0:
            return self._finish(row, req, "length")
        self._choose(row, req, logits)

    def _choose(self, row: int, req: Request, logits: np.ndarray) -> None:
        """The row's next token by generate's own rules (LanguageModel.choose_next), its text,
        and its end if this is one."""
        lm, params, text = self.lm, req.params, req._text
        assert text is not None  # made at admission
        try:  # choose_next masks a copy, not the rows' buffer (the next step's output)
            reason = lm.choose_next(logits, params, self._rngs[row], req.prompt_ids, req.out,
                                    text=text, constraint=req.constraint)
        except NonFiniteError as e:
            return self._finish(row, req, "error", str(e))
        if reason == "eos":
            return self._finish(row, req, "eos")
        self.tokens_generated += 1
        lp = None if req.logprobs is None else \
            lm.logprobs_of(logits[None], req.out[-1:], req.logprobs)[0]
        final = text.finish() if reason else None
        piece = text.last_piece(final) if final is not None else text.piece()
        req._emit(Token(req.out[-1], piece, time.perf_counter(), lp))
        if reason:
            self._finish(row, req, reason, final=final)

    def _finish(self, row: int, req: Request, reason: str, error: str | None = None, *,
                final: str | None = None) -> None:
        """End a running row: Done with the whole text (`final` where the last Token already
        carried it), its row freed."""
        if final is None:
            final = req._text.finish() if req._text is not None else ""
        req._emit(Done(reason, final, error))
        held = None  # the tokens in its cache rows (the last chosen one never ran)
        if reason in ("eos", "stop", "length", "context"):
            held = (req.prompt_ids + req.out)[:len(req.prompt_ids) + max(len(req.out) - 1, 0)]
        with self._cond:
            del self._running[row]
            self._rngs.pop(row, None)
            self.rows.release(row, held)
            heapq.heappush(self._free, row)
