"""Continuous batching for an encoder-decoder (torch-free): the engine `tinyt serve` drives on a
seq2seq artifact, with runtime/engine.py's interface (submit, together, stop; its Request,
Token and Done), so the server's handlers serve either.

    submit(source ids, SamplingParams, tgt_lang) ──bounded queue──▶ the engine's thread, a loop:
      admit   waiting requests into free rows (max_batch in all), up to prefill_tokens source
              tokens at a time (at least one request's): their sources run through
              encoder_model.onnx together (right-padded, masked), then decoder_model.onnx on
              the start token: a new cohort, each row holding its cross-attention keys / values
              and its own self-attention cache (runtime/encoder_decoder.py's DecoderSteps)
      step    per cohort: one token for each of its rows, then one run of
              decoder_with_past_model.onnx over the rows that go on
      choose  each row with its own sampling settings, seed, rules (tgt_lang's forced first
              token, generation_config.json's bad words and forced eos) and stop strings, as
              Seq2SeqModel.generate chooses; a finished or cancelled row leaves its cohort at
              once, and the next waiting request takes its place
    ──▶ per request, events as they happen: Token(id, text piece[, logprob]), Done(reason)

Why cohorts: Optimum's decoder_with_past graph takes no self-attention mask and reads the fed
token's position from the past length, so the rows of one run must share their decoder
position; padding a shorter row's cache would let its padding into the attention. A cohort is
the rows admitted in one step: they stay in step until each ends, and sources of different
lengths share its runs (the encoder mask pads them). Rows of different cohorts take their
token in the same step, one decoder run per cohort. Measured on a random 6-layer, 512-wide model
(docs/serving.md, 2 threads): a run of 8 rows cost about 2 runs of one row (1.9 and 2.1), so
requests that arrive together (a list of prompts, n samples, a burst) batch best.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tinyt.errors import ConfigError, NonFiniteError

from .arguments import token_rows
from .detok import TextStream
from .encoder_decoder import DecoderSteps, Seq2SeqModel
from .engine_loop import EngineLoop
from .request import Done, Request, Scored, Token
from .rules import Rules
from .sampling import SamplingParams, next_token
from .score import check_top, logprobs_of

__all__ = ["Seq2SeqEngine"]

# Source tokens admitted between two steps unless told (--prefill-tokens): sources are read
# whole, once, so a translation server takes a burst of sentences into one cohort.
SOURCE_TOKENS = 512


@dataclass
class _Row:
    """A running request: its rules (the forced first token of its tgt_lang) and generator."""
    req: Request
    rules: Rules
    rng: np.random.Generator  # greedy draws nothing from it


@dataclass
class _Cohort:
    """Rows admitted together, at one decoder position: their caches, and the logits [rows, V]
    each row chooses its next token from."""
    steps: DecoderSteps
    rows: list[_Row]
    logits: np.ndarray


class Seq2SeqEngine(EngineLoop):
    """A thread that batches translation requests continuously on one Seq2SeqModel.

        model = rt.load("artifacts/opus-mt-onnx")
        engine = Seq2SeqEngine(model, max_batch=8).start()
        ids = model.tokenizer.encode_prompt("Hello world.")
        req = engine.submit(ids, SamplingParams(max_new_tokens=64))
        print(req.wait().text); engine.stop()
    """

    THREAD_NAME = "tinyt-seq2seq"

    def __init__(self, model: Seq2SeqModel, *, max_batch: int = 8, max_queue: int = 64,
                 prefill_tokens: int = SOURCE_TOKENS):
        for name, value in (("max_batch", max_batch), ("max_queue", max_queue),
                            ("prefill_tokens", prefill_tokens)):
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                raise ConfigError(f"{name}={value!r} must be an integer >= 1")
        super().__init__(max_queue=max_queue)
        self.model, self.max_batch = model, max_batch
        self.prefill_tokens = prefill_tokens
        self.batched = True  # rows of a cohort share each decoder run
        gen = model.generation
        self._start, self._eos = gen.decoder_start, sorted(set(gen.eos))
        # generate's text skips special tokens (a language token, padding): so does the stream
        self._special = {i for i, t in model.tokenizer.hf.get_added_tokens_decoder().items()
                         if t.special}
        self._cohorts: list[_Cohort] = []
        self._live = 0  # rows in the cohorts
        self.decoder_runs = 0  # runs of the decoder graphs (a cohort's first, then its steps)
        self.widest_step = 0  # the most rows that took a token in one step
        self.widest_run = 0  # the most rows in one decoder run

    # -- the caller's side ------------------------------------------------------------------
    def submit(self, source_ids: list[int], params: SamplingParams, *,
               listener: Callable[[Token | Done | Scored], None] | None = None,
               logprobs: int | None = None, prompt_logprobs: int | None = None,
               constraint: object | None = None, tgt_lang: str | None = None) -> Request:
        """Queue a translation of `source_ids` (special tokens included, as encode_prompt
        gives them); QueueFull when max_queue wait, ConfigError (a ValueError) for what this
        engine cannot do. params.max_new_tokens: at most the model's decoder positions.
        tgt_lang: a multilingual model's target language. logprobs: None, or the
        alternatives (0..MAX_TOP) beside each chosen token's logprob."""
        if prompt_logprobs is not None:
            raise ConfigError("prompt_logprobs: an encoder-decoder's source is read by its "
                              "encoder, not predicted, so it has no log-probabilities")
        if constraint is not None:
            raise ConfigError("a constraint (structured output) is not offered for an "
                              "encoder-decoder")
        cfg = self.model.config
        (ids,) = token_rows([source_ids], vocab_size=cfg.vocab_size, context=cfg.block_size,
                            room=0)
        if logprobs is not None:
            check_top(logprobs, "logprobs")
        rules = self.model.settings(max_new_tokens=params.max_new_tokens, tgt_lang=tgt_lang).rules
        req = Request(ids, params, listener=listener, logprobs=logprobs)
        self._enqueue((req, rules))
        return req

    @property
    def running(self) -> int:
        return self._live

    # -- the engine's thread (EngineLoop's loop) ------------------------------------------------
    def _busy(self) -> bool:
        return bool(self._cohorts)

    @staticmethod
    def _request(item: tuple[Request, Rules]) -> Request:
        return item[0]

    def _in_flight(self, new: list[_Row] | None) -> list[Request]:
        return [row.req for row in [*(new or ()), *(r for c in self._cohorts for r in c.rows)]]

    def _reset(self) -> None:
        self._cohorts, self._live = [], 0

    def _admit(self) -> list[_Row]:
        """The waiting requests this step takes (the caller holds the lock): as many as free
        rows and the source budget allow, at least one; a source repeated (n samples) counts
        once."""
        new: list[_Row] = []
        budget, seen = self.prefill_tokens, set()
        while self._waiting and self._live + len(new) < self.max_batch and (
                not new or len(self._waiting[0][0].prompt_ids) <= budget
                or tuple(self._waiting[0][0].prompt_ids) in seen):
            req, rules = self._waiting.popleft()
            if req.cancelled:
                req._emit(Done("cancelled", ""))
                continue
            key = tuple(req.prompt_ids)
            if key not in seen:
                budget -= len(key)
                seen.add(key)
            new.append(_Row(req, rules, np.random.default_rng(req.params.seed)))
        self._live += len(new)
        return new

    def _iterate(self, new: list[_Row]) -> None:
        """One step: the newcomers' cohort begun, then a token for every running row."""
        if new:
            self._cohorts.append(self._begin(new))
        took = 0
        for cohort in list(self._cohorts):
            took += len(cohort.rows)
            self._advance(cohort)
        self.steps_run += 1
        self.widest_step = max(self.widest_step, took)

    def _begin(self, rows: list[_Row]) -> _Cohort:
        """The rows' sources encoded together and the decoder run on its start token."""
        memory, mask = self.model.encode([row.req.prompt_ids for row in rows])
        steps = DecoderSteps(self.model, memory, mask)
        logits = steps.first(self._start)
        self._ran(len(rows))
        for row in rows:
            row.req._text = TextStream(self.model.tokenizer, row.req.params.stop)
        return _Cohort(steps, rows, logits)

    def _advance(self, cohort: _Cohort) -> None:
        """Each row's next token; the rows that go on run once more, together."""
        keep, tokens = [], []
        for i, row in enumerate(cohort.rows):
            token = self._choose(row, cohort.logits[i])
            if token is not None:
                keep.append(i)
                tokens.append(token)
        cohort.rows = [cohort.rows[i] for i in keep]
        if not keep:
            self._cohorts.remove(cohort)
            return
        cohort.logits = cohort.steps(np.asarray(keep, dtype=np.int64),
                                     np.asarray(tokens, dtype=np.int64))
        self._ran(len(keep))

    def _ran(self, rows: int) -> None:
        self.decoder_runs += 1
        self.widest_run = max(self.widest_run, rows)

    def _choose(self, row: _Row, logits: np.ndarray) -> int | None:
        """The row's next token (Seq2SeqModel.generate's rules, then min_tokens, sampling),
        its text and logprob sent; the token to feed, or None where the row ended."""
        req, params = row.req, row.req.params
        if req.cancelled:
            self._end(row, "cancelled")
            return None
        history = [self._start, *req.out]
        z = logits.astype(np.float32, copy=True)  # [V]; the logits stay as logprobs read them
        if len(req.out) < params.min_new_tokens:
            z[self._eos] = -np.inf
        if row.rules.active:  # applied last: a forced token wins, as in transformers
            row.rules.apply(z[None], [history], len(req.out))
        try:
            token = next_token(z, params, row.rng, history)
        except NonFiniteError as e:
            self._end(row, "error", str(e))
            return None
        if token in self._eos:
            self._end(row, "eos")
            return None
        req.out.append(token)
        self.tokens_generated += 1
        text = req._text
        assert text is not None  # made when its cohort began
        if token not in self._special:
            text.add(token)
        lp = None if req.logprobs is None else \
            logprobs_of(logits[None], [token], req.logprobs)[0]
        reason = "stop" if text.stopped else \
            "length" if len(req.out) >= params.max_new_tokens else None
        final = text.finish() if reason else None
        piece = text.last_piece(final) if final is not None else text.piece()
        req._emit(Token(token, piece, time.perf_counter(), lp))
        if reason is None:
            return token
        self._end(row, reason, final=final)
        return None

    def _end(self, row: _Row, reason: str, error: str | None = None, *,
             final: str | None = None) -> None:
        """A row's Done (the whole text: `final` where its last Token already carried it);
        its place freed."""
        text = row.req._text
        if final is None:
            final = text.finish() if text is not None else ""
        row.req._emit(Done(reason, final, error))
        with self._cond:
            self._live -= 1
