"""Text generation with the KV cache (torch-free).

    prompts ──tokenize, left-pad──▶ prefill (past 0) ──▶ logits[:, -1] ──sample──▶ token
                 ▲                                                              │
                 └──── decode step: 1 token, past = present, mask += 1 ◀────────┘

A batch of prompts of different lengths is left-padded; positions come from the attention mask,
so each prompt gets the tokens it gets alone. The model has no positions beyond its context
(block_size, or less: rt.load's max_context): a prompt must leave room for one new token (else
ConfigError, a ValueError), and generation stops with finish_reason 'context' when a sequence
reaches it. The context is a limit, not an allocation: a call's KV buffers hold the prompt and
the new tokens it may make (runtime/cache.capacity_for), whatever the model's context.

Beside this file: how each kind of graph steps (runtime/steps.py), the checks of a call's
arguments (runtime/arguments.py) and the one-prompt greedy loop (runtime/greedy.py).
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from tinyt import recipe
from tinyt.contract import DECODER_WITH_PAST, HIDDEN_OUTPUT, SHARED_CACHE_KIND, past_name
from tinyt.errors import ConfigError, NonFiniteError
from tinyt.rope import longrope_original
from tinyt.tokenizer import Tokenizer

from .arguments import prompt_text, sampling_kwargs, token_rows
from .cache import CachePool, SharedCache, capacity_for, check_kv_fits, graph_kv_dtype
from .detok import TextStream, stop_cut
from .feeds import left_pad, prefill_feeds
from .fixed import capacity
from .greedy import greedy_one, stopped
from .heads import BeamHead
from .lm_beams import beam_settings, lm_beam_search
from .sampling import Constraint, SamplingParams, next_token
from .score import HEAD_ROWS, HeadGraph, HeadGraphs, Logprob, check_top, logprobs_of
from .session import Artifact
from .steps import Steps, bound_steps, cpu_steps, fixed_steps, rerun_steps, shared_steps


@dataclass(frozen=True)
class GenerationResult:
    text: str  # the generated text only (the prompt is not repeated)
    token_ids: list[int]
    finish_reason: str  # eos | stop | length | context
    # with logprobs=N: each token's log-probability and the N most likely there
    logprobs: list[Logprob] | None = None


class LanguageModel:
    """A causal LM artifact on an ONNX Runtime session. Thread-safe: calls share only the
    session, whose run() may be called from many threads.

    Beside generate / stream, the pieces a scheduler of its own (runtime/engine.py) drives:
    check_ids, steps, choose_next, pad_id and kv_dtype; and on a shared-cache artifact
    new_cache, take_cache and give_cache."""

    def __init__(self, artifact: Artifact, session: ort.InferenceSession, tokenizer: Tokenizer,
                 *, io_binding: bool | None = None,
                 prefill_session: ort.InferenceSession | None = None, plan=None,
                 max_context: int | None = None):
        self.artifact, self.session, self.tokenizer = artifact, session, tokenizer
        self.plan = plan  # a shared-cache model's per-phase choice (runtime/tuning.Plan)
        self.prefill_session = prefill_session  # a shared-cache pair's prompt graph
        self.config = artifact.config
        self.provider = session.get_providers()[0]
        self._outputs = [o.name for o in session.get_outputs()]
        self._past_names = [past_name(n) for n in self._outputs[1:]]
        self._pad = tokenizer.eos_id if tokenizer.eos_id is not None else 0
        # A vocabulary padded beyond the tokenizer (nanoGPT's 50304 for GPT-2's 50257): the
        # padded ids are never chosen, since no text stands for them.
        self._choosable = (tokenizer.vocab_size if tokenizer.vocab_size < self.config.vocab_size
                           else None)
        # On an accelerator the KV cache stays in device memory between steps (I/O binding);
        # on CPU plain numpy feeds measured as fast (lab/cpu_iobinding.py).
        self.device = "cpu" if self.provider == "CPUExecutionProvider" else "cuda"
        self.beam_head = BeamHead()  # beam search's top-k (a session at first use)
        self.io_binding = (self.device != "cpu") if io_binding is None else io_binding
        self._kv_dtype = graph_kv_dtype(session)  # float16 on GPU variants, int8 (--kv-cache)
        # The most tokens a sequence can hold: block_size, or a pinned graph's window, or
        # less where the caller says (max_context: rt.load checks it).
        self.context = self.config.block_size if artifact.fixed is None else min(
            self.config.block_size, capacity(artifact.kind, artifact.fixed))
        if max_context is not None:
            self.context = min(self.context, max_context)
        if artifact.kind == SHARED_CACHE_KIND:
            self._caches = CachePool(self.new_cache)
            self._heads = HeadGraphs(self._make_head)  # the lm_head alone, made when first asked
        # LongRoPE (Phi-3): past this many tokens the whole sequence turns at other frequencies
        self.longrope_original = longrope_original(self.config)

    # -- public API ------------------------------------------------------------------------
    def generate(self, prompt, **kwargs) -> str | list[str]:
        """Text generated after `prompt` (a str, or a list of them: a batch). Keyword
        arguments: SamplingParams' fields, and json_schema (a JSON Schema object: the text
        is compact JSON valid under it, runtime/constrain.py; {"type": "object"} for any
        object), as for generate_details, generate_ids and stream; num_beams > 1 (with
        length_penalty, early_stopping, no_repeat_ngram_size): beam search with
        transformers' rules (runtime/lm_beams.py; not for stream)."""
        if isinstance(prompt, (list, tuple)):
            return [r.text for r in self.generate_details(prompt, **kwargs)]
        return self.generate_details([prompt], **kwargs)[0].text

    def generate_details(self, prompts: Sequence, **kwargs) -> list[GenerationResult]:
        """Text, token ids and finish reason for each prompt of a batch."""
        if not isinstance(prompts, (list, tuple)) or not prompts:
            raise ConfigError("prompts must be a non-empty list of strings")
        return self.generate_ids([self.tokenizer.encode_prompt(prompt_text(p)) for p in prompts],
                                 **kwargs)

    def stream(self, prompt, **kwargs) -> Iterator[str]:
        """Pieces of generated text as they are decided; they concatenate to generate()'s.
        Arguments are checked here, before the first piece is asked for."""
        schema = kwargs.pop("json_schema", None)
        params = SamplingParams(**sampling_kwargs(kwargs))
        rows = self.check_ids([self.tokenizer.encode_prompt(prompt_text(prompt))])
        return self._stream(rows, params, self._constrained(schema, params, len(rows)))

    def _stream(self, rows: list[list[int]], params: SamplingParams,
                constraints: list[Constraint] | None = None) -> Iterator[str]:
        texts = [TextStream(self.tokenizer, params.stop)]  # each token decoded once
        for _, reasons in self._loop(rows, params, texts, constraints):
            # While running, hold back a partial character or a possible stop-string start.
            piece = texts[0].last_piece(texts[0].finish()) if reasons[0] else texts[0].piece()
            if piece:
                yield piece

    def generate_ids(self, token_ids, **kwargs) -> list[GenerationResult]:
        """Generation from token ids: a list of ints, or a list / 2-D array of rows.
        logprobs=N (0..MAX_TOP): each result carries its tokens' log-probabilities (the
        model's distribution, before sampling settings) and the N most likely tokens there."""
        beams = beam_settings(kwargs)  # num_beams > 1: runtime/lm_beams.py
        schema = kwargs.pop("json_schema", None)
        top = kwargs.pop("logprobs", None)
        if top is not None:
            check_top(top, "logprobs")
        params = SamplingParams(**sampling_kwargs(kwargs))
        rows = self.check_ids(token_ids)
        if beams is not None:
            return [GenerationResult(self.tokenizer.decode(ids), ids, reason) for ids, reason
                    in lm_beam_search(self, rows, params.max_new_tokens, *beams)]
        constraints = self._constrained(schema, params, len(rows))
        scores: list[list[Logprob]] | None = None if top is None else [[] for _ in rows]
        if (constraints is None and scores is None and self.artifact.kind == SHARED_CACHE_KIND
                and len(rows) == 1
                and params.temperature == 0
                and params.repetition_penalty == 1.0 and not params.stop
                and self._recompute_at(rows, params) is None):
            out, reasons = greedy_one(self._caches, rows[0], params, eos=self.tokenizer.eos_id,
                                      limit=self._choosable, context=self.context,
                                      pad=self._pad)
        else:
            for out, reasons in self._loop(rows, params,  # noqa: B007 (the last one counts)
                                           constraints=constraints, scores=scores,
                                           top=top or 0):
                pass
        results = []
        for r, (row, reason) in enumerate(zip(out, reasons)):
            assert reason is not None  # both loops end only when every row has its reason
            text = self.tokenizer.decode(row)
            results.append(GenerationResult(text[:stop_cut(text, params.stop)], row, reason,
                                            None if scores is None else scores[r]))
        return results

    def _constrained(self, schema, params: SamplingParams, rows: int
                     ) -> list[Constraint] | None:
        """Each row's Constraint for a call's json_schema (runtime/constrain.py), or None."""
        if schema is None:
            return None
        if params.min_new_tokens:  # end-of-text may be all the grammar allows
            raise ConfigError("min_new_tokens cannot be combined with json_schema: the "
                              "schema decides where the text ends")
        from .constrain import Constrainer  # llguidance: only where a schema is given

        grammar = Constrainer.of(self.tokenizer).json_schema(schema)
        return [grammar.constraint() for _ in range(rows)]

    # -- the pieces a scheduler drives (runtime/engine.py) ---------------------------------
    @property
    def pad_id(self) -> int:
        """The id fed where a row has no token (left padding, finished rows): end-of-text."""
        return self._pad

    @property
    def kv_dtype(self) -> type[np.number]:
        """The KV cache's element type, as the graph's past inputs declare it."""
        return self._kv_dtype

    def check_ids(self, token_ids, *, room: int = 1) -> list[list[int]]:
        """Prompt rows as lists of ints (from a list of ints, a list of rows or a 1-D / 2-D
        array), each inside the vocabulary and leaving room for `room` new tokens in the
        context (0: a text scored whole); ConfigError naming the row and the limit
        otherwise (runtime/arguments.py)."""
        fixed = self.artifact.fixed
        return token_rows(token_ids, vocab_size=self.config.vocab_size, context=self.context,
                          pinned_batch=fixed["batch_size"] if fixed else None, room=room)

    def choose_next(self, logits: np.ndarray, params: SamplingParams,
                    rng: np.random.Generator | None, prompt: list[int],
                    out: list[int], *, text: TextStream | None = None,
                    constraint: Constraint | None = None) -> str | None:
        """One sequence's next token by generate's own rules (min_new_tokens, repetition
        penalty, sampling, the context, stop strings), appended to `out` unless it is
        end-of-text; its finish reason if this ends it, else None. `logits` [vocab] is
        left as it is (a copy is changed); NonFiniteError for logits that are not finite.
        `text`: the sequence's TextStream, which the token is added to and stop strings are
        found in (without one, `out` is decoded whole). `constraint`: what the tokens must
        follow (masked before the choice; finished: the generation stops, 'stop')."""
        if self._choosable is not None:  # a padded vocabulary: never the ids beyond it
            logits = logits[:self._choosable]
        return self._choose(0, logits.copy(), params, rng, [prompt], [out],
                            None if text is None else [text],
                            None if constraint is None else [constraint])

    # -- log-probabilities (runtime/score.py) ------------------------------------------------
    def logprobs_of(self, logits: np.ndarray, tokens, top: int = 0) -> list[Logprob]:
        """Logprob of tokens[i] under logits[i] ([N, vocab]) and the `top` most likely there:
        the model's distribution over the tokens it can choose (a padded vocabulary's extra
        ids excluded), before any sampling setting."""
        if self._choosable is not None:
            logits = logits[:, :self._choosable]
        return logprobs_of(logits, tokens, top)

    def check_scoring(self) -> None:
        """ConfigError unless this artifact can score every position of a prompt."""
        if self.artifact.fixed is not None:
            raise ConfigError(f"{self.artifact.path} is pinned to fixed shapes and gives the "
                              "last position's logits only; score prompts with a dynamic-shape "
                              "artifact")
        if self.artifact.kind == SHARED_CACHE_KIND:
            graph = self._prompt_graph()
            if not graph.endswith(".onnx"):
                raise ConfigError(f"{self.artifact.path / graph} is in ONNX Runtime's format; "
                                  "scoring prompts cuts the lm_head from an .onnx graph")
            if not any(o.name == HIDDEN_OUTPUT for o in
                       (self.prefill_session or self.session).get_outputs()):
                raise ConfigError(f"{self.artifact.path} has no {HIDDEN_OUTPUT!r} output (made "
                                  "by an older tinyt): make it again with `tinyt optimize "
                                  "--target gqa` to score prompts")

    def _prompt_graph(self) -> str:
        """The file of the graph that runs prompts."""
        if self.plan is not None:
            return self.plan.prompt_graph
        return self.artifact.prefill_file or self.artifact.model_file

    @property
    def prompt_scales_shared(self) -> bool:
        """Whether the graph that runs prompts quantizes activations with one scale over all of
        a run's rows and positions (quantize --kernel qgemm): there a token's result depends on
        the others run with it."""
        graph = self._prompt_graph()
        manifest = self.artifact.manifest
        return recipe.rows_independent(manifest.prefill_quantization
                                       if graph == self.artifact.prefill_file
                                       else manifest.quantization) is False

    def _make_head(self) -> HeadGraph:
        session = self.prefill_session or self.session
        return HeadGraph(self.artifact.path / self._prompt_graph(),
                         session.get_session_options(), together=not self.prompt_scales_shared)

    def logprobs_from_hidden(self, hidden: np.ndarray, tokens, top: int = 0) -> list[Logprob]:
        """logprobs_of the logits that the shared-cache graph's lm_head gives hidden rows
        [N, C] (a prompt's positions), HEAD_ROWS rows at a time."""
        head = self._heads.get()
        out: list[Logprob] = []
        for i in range(0, len(hidden), HEAD_ROWS):
            out += self.logprobs_of(head.logits(hidden[i:i + HEAD_ROWS]),
                                    tokens[i:i + HEAD_ROWS], top)
        return out

    def prompt_logprobs(self, token_ids, *, top: int = 0) -> list[Logprob | None]:
        """Each token of a prompt with its log-probability given the tokens before it (None
        for the first, which has none) and the `top` (0..MAX_TOP) most likely tokens there:
        lm-evaluation-harness's loglikelihood, /v1/completions' echo. One run of the prompt;
        the ids are checked as a prompt (check_ids)."""
        check_top(top)
        (ids,) = self.check_ids([token_ids])
        self.check_scoring()
        if self.artifact.kind == SHARED_CACHE_KIND:
            cache = self.take_cache(1, len(ids) + 1)
            try:
                cache.clear()
                cache.prefill([ids], self._pad)
                hidden = cache.prompt_hidden()[0, :len(ids) - 1].copy()
            finally:
                self.give_cache(cache)
            return [None, *self.logprobs_from_hidden(hidden, ids[1:], top)]
        steps = self.steps(prefill_feeds(self.config, self.artifact.kind,
                                         np.array([ids], dtype=np.int64),
                                         kv_dtype=self._kv_dtype))
        try:
            logits = next(steps)[0]
        finally:
            steps.close()
        return [None, *self.logprobs_of(logits[:-1], ids[1:], top)]

    def prompt_logits(self, token_ids) -> np.ndarray:
        """Logits [S, vocab] of every position of one prompt, from one run of it (a
        shared-cache artifact: its prompt graph's hidden states through its head graph)."""
        (ids,) = self.check_ids([token_ids], room=0)
        self.check_scoring()
        if self.artifact.kind == SHARED_CACHE_KIND:
            cache = self.take_cache(1, len(ids))
            try:
                cache.clear()
                cache.prefill([ids], self._pad)
                hidden = cache.prompt_hidden()[0, :len(ids)].copy()
            finally:
                self.give_cache(cache)
            head = self._heads.get()
            return np.concatenate([head.logits(hidden[i:i + HEAD_ROWS])
                                   for i in range(0, len(hidden), HEAD_ROWS)])
        steps = self.steps(prefill_feeds(self.config, self.artifact.kind,
                                         np.array([ids], dtype=np.int64),
                                         kv_dtype=self._kv_dtype))
        try:
            return next(steps)[0]
        finally:
            steps.close()

    def new_cache(self, rows: int, capacity: int | None = None, *,
                  lower: str | None = None) -> SharedCache:
        """A shared-cache artifact's KV buffers for `rows` sequences of up to `capacity` tokens
        (default: the context), bound to this model's sessions (runtime/cache.py); refused
        before allocating if they do not fit the machine (`lower`: what the refusal tells the
        user to make smaller)."""
        capacity = self.context if capacity is None else min(capacity, self.context)
        return SharedCache(self.session, self.config, rows, capacity,
                           kv_dtype=self._kv_dtype, prefill_session=self.prefill_session,
                           **({} if lower is None else {"lower": lower}))

    def take_cache(self, rows: int, tokens: int | None = None) -> SharedCache:
        """A shared cache of `rows` rows holding at least `tokens` tokens each (default: the
        context) from this model's pool (made if none fits); hand it back with give_cache."""
        return self._shared_pool().take(
            rows, capacity_for(self.context if tokens is None else tokens, self.context))

    def give_cache(self, cache: SharedCache) -> None:
        """Return a cache from take_cache to the pool, for the next generation."""
        self._shared_pool().give(cache)

    def _shared_pool(self) -> CachePool:
        if self.artifact.kind != SHARED_CACHE_KIND:
            raise ConfigError(f"{self.artifact.path} is a {self.artifact.kind} graph: shared "
                              "caches belong to shared-cache graphs (optimize --target gqa)")
        return self._caches

    # -- the loop ------------------------------------------------------------------------------

    def _recompute_at(self, rows: list[list[int]], params: SamplingParams) -> int | None:
        """The length past which this call's cache is made again (LongRoPE: the batch starts
        within the original context and may run past it), or None."""
        original = self.longrope_original
        if original is None or max(map(len, rows)) > original or \
                max(map(len, rows)) + params.max_new_tokens <= original:
            return None
        return original

    def _loop(self, rows: list[list[int]], params: SamplingParams, texts: list | None = None,
              constraints: list[Constraint] | None = None,
              scores: list[list[Logprob]] | None = None, top: int = 0
              ) -> Iterator[tuple[list[list[int]], list[str | None]]]:
        """After every step: the tokens generated so far per row, and each row's finish
        reason (None while it runs). Finished rows are fed padding that nobody reads. texts:
        a TextStream per row that the tokens are added to (and stop strings found in); with
        stop strings and none given, the loop makes its own. constraints: each row's
        Constraint (_choose). scores: each row's list that its tokens' Logprobs (with `top`
        alternatives) are appended to."""
        if texts is None and params.stop:
            texts = [TextStream(self.tokenizer, params.stop) for _ in rows]
        B = len(rows)
        ids, mask = left_pad(rows, self._pad)
        rngs = [np.random.default_rng(params.seed) if params.temperature > 0 else None
                for _ in rows]  # greedy draws nothing
        out: list[list[int]] = [[] for _ in rows]
        reasons: list[str | None] = ["length" if params.max_new_tokens == 0 else None] * B
        if self.artifact.kind == DECODER_WITH_PAST:  # past and present: two caches at a time
            check_kv_fits(self.config, B, min(self.context, ids.shape[1] + params.max_new_tokens),
                          self._kv_dtype, copies=2, lower="the prompts, their length or "
                          "max_new_tokens")
        steps = self.steps(prefill_feeds(self.config, self.artifact.kind, ids, mask,
                                          kv_dtype=self._kv_dtype),
                           new_tokens=params.max_new_tokens)
        logits = next(steps) if not all(reasons) else np.zeros(0)  # read only while rows run
        nxt = np.full(B, self._pad, dtype=np.int64)
        recompute_at = self._recompute_at(rows, params)
        while not all(reasons):
            for r in range(B):
                if reasons[r] is None:
                    row = logits[r, -1] if self._choosable is None else \
                        logits[r, -1, :self._choosable]
                    raw = None if scores is None else row.copy()  # _choose masks the row
                    reasons[r] = self._choose(r, row, params, rngs[r], rows, out, texts,
                                              constraints)
                    if scores is not None and raw is not None and reasons[r] != "eos":
                        scores[r] += logprobs_of(raw[None], out[r][-1:], top)
                    nxt[r] = out[r][-1] if out[r] and reasons[r] != "eos" else self._pad
                else:
                    nxt[r] = self._pad
            yield out, reasons
            if all(reasons):
                break
            if recompute_at is not None and \
                    max(len(rows[r]) + len(out[r]) for r in range(B)) > recompute_at:
                # LongRoPE: the batch now passes the original context, so every token turns at
                # the long frequencies: the cache made at the short ones is made again over
                # the whole sequences (as tinyt.model.generate; transformers drops its cache)
                steps.close()
                ids, mask = left_pad([rows[r] + out[r] for r in range(B)], self._pad)
                steps = self.steps(prefill_feeds(self.config, self.artifact.kind, ids, mask,
                                                 kv_dtype=self._kv_dtype),
                                   new_tokens=params.max_new_tokens)
                logits, recompute_at = next(steps), None
                continue
            logits = steps.send((nxt, np.array([r is None for r in reasons])))
        if params.max_new_tokens == 0:
            yield out, reasons

    def steps(self, feeds: dict[str, np.ndarray], *, new_tokens: int | None = None
              ) -> Steps:
        """The step API that generate and the stages' checks drive: a coroutine over the
        feeds of a prompt batch (runtime.feeds.prefill_feeds). It yields the logits of the
        prompt pass, then of each step; send it (next tokens [B] int64, which rows are still
        running [B] bool) to run the next step. Finished rows are fed what the caller sends
        and their logits are not to be read. Closing it frees the artifact's cache buffers.
        `new_tokens`, the most steps the caller will run, sizes the buffers at the start (a
        shared cache, the mask); without it they start small and grow as the steps go.

            steps = lm.steps(prefill_feeds(lm.config, DECODER_WITH_PAST, ids, mask))
            logits = next(steps)                                   # [B, S or 1, V]
            logits = steps.send((logits[:, -1].argmax(-1), active))
        """
        kind, names, context = self.artifact.kind, self._outputs, self.context
        if kind == SHARED_CACHE_KIND:  # one KV buffer per layer, bound once (runtime/cache.py)
            return shared_steps(self._caches, feeds, new_tokens, context, self._pad)
        if self.artifact.fixed:  # pinned shapes: a window of fixed size (runtime/fixed.py)
            return fixed_steps(self.session, self.config, kind, self.artifact.fixed, feeds,
                               self._kv_dtype)
        if kind != DECODER_WITH_PAST:  # no cache: the whole sequence runs again
            return rerun_steps(self.session, names, kind, feeds)
        if not self.io_binding:
            return cpu_steps(self.session, names, self._past_names, feeds, new_tokens, context)
        return bound_steps(self.session, names, self._past_names, self.device, feeds)

    def _choose(self, r, logits, params, rng, rows, out, texts=None,
                constraints=None) -> str | None:
        """Append row r's next token; return its finish reason if this ends it. texts: the
        rows' TextStreams (the token is added to row r's, stop strings found there), else
        stop strings are found in the row decoded whole. constraints: each row's Constraint
        or None (masks the row's logits, is told the token; once finished, 'stop')."""
        constraint = None if constraints is None else constraints[r]
        if constraint is not None:
            constraint.mask(logits)  # the row is ours to change (a copy)
        history = rows[r] + out[r] if params.repetition_penalty != 1.0 else []
        eos = self.tokenizer.eos_id
        if eos is not None and len(out[r]) < params.min_new_tokens:
            logits[eos] = -np.inf  # end-of-text is not allowed yet (the row is ours to change)
        try:
            tok = next_token(logits, params, rng, history)
        except NonFiniteError as e:
            raise stopped(len(out[r]), r, e) from None
        if tok == eos:
            return "eos"
        out[r].append(tok)
        if texts is not None:
            texts[r].add(tok)
        if constraint is not None:
            constraint.accept(tok)
        if len(out[r]) >= params.max_new_tokens:
            return "length"
        if len(rows[r]) + len(out[r]) >= self.context:
            return "context"
        if constraint is not None and constraint.finished:
            return "stop"
        if texts is not None:
            return "stop" if texts[r].stopped else None
        if params.stop:
            text = self.tokenizer.decode(out[r])
            if stop_cut(text, params.stop) < len(text):
                return "stop"
        return None

