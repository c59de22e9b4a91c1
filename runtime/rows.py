"""The engine's rows (torch-free): where each running request's keys and values live, and how
admitted prompts and a decode step run over them (runtime/engine.py drives them).

    SharedRows    the shared-cache pair (`optimize --target gqa`): one GroupQueryAttention
                  buffer per layer holds every row; a prompt runs through a staging cache and
                  is copied into its row; a step runs all rows at once, reading the weights
                  once for all of them
    SeparateRows  a contract graph (`onnx`, `onnx-int8`): each row its own cache, run alone,
                  so rows interleave instead of batching (a step costs what it costs alone,
                  times the rows)

Either way a row's tokens are its own: rows never mix.
"""
from __future__ import annotations

from collections.abc import Generator

import numpy as np

from tinyt import recipe
from tinyt.manifest import Manifest

from .cache import SharedCache
from .feeds import prefill_feeds
from .generate import LanguageModel
from .prefix import PrefixStore
from .score import Logprob

# What a refusal of the engine's cache (max_batch rows x the context) tells the user to lower.
ENGINE_LOWER = "max_batch (--max-batch) or the context (rt.load's max_context, --max-context)"


class SharedRows:
    """Rows of one SharedCache. Admitted prompts run through a staging cache of just the new
    rows (the lm's pool) and are copied in; a step runs the rows up to the highest one in use,
    all at once (rows are handed out lowest first, so they stay packed)."""

    def __init__(self, lm: LanguageModel, rows: int, prefix_bytes: int = 0):
        self.lm = lm
        self.cache = lm.new_cache(rows, lower=ENGINE_LOWER)
        self.prefixes = PrefixStore(lm, prefix_bytes) if prefix_bytes else None
        self.shared_prompt_tokens = 0  # admit's copies of an identical prompt's row
        # Prompts run together only where no activation scale is shared between rows
        # (quantize --kernel qgemm-rows or nbits, one graph for prompts and steps): the pair's
        # per-tensor qgemm prompt graph would let prompts that arrive together move each
        # other's logits, and a request's output would depend on who arrived with it.
        self.together = rows_independent(lm.artifact.manifest)

    def admit(self, new: dict[int, list[int]], score: dict[int, int]
              ) -> tuple[dict[int, np.ndarray], dict[int, list[Logprob | None]]]:
        """Each new row's last-token logits, and the prompt logprobs of the rows in `score`
        (row -> alternatives), from the same run. A prompt starting with a kept sequence
        (the prefix store) copies those rows and runs the rest; every prompt is kept."""
        out: dict[int, np.ndarray] = {}
        scored: dict[int, list[Logprob | None]] = {}
        # the same prompt in several rows (a request's n samples) runs once: the others copy
        # its row and logits after the run
        first: dict[tuple[int, ...], int] = {}
        twins: dict[int, int] = {}
        for row, ids in new.items():
            if row not in score:
                twins[row] = first.setdefault(tuple(ids), row)
        twins = {row: of for row, of in twins.items() if of != row}
        rest = {row: ids for row, ids in new.items() if row not in twins}
        if self.prefixes is not None:
            for row, ids in list(rest.items()):
                found = None if row in score else self.prefixes.match(ids)
                if found is None:
                    continue
                del rest[row]
                staging = self.lm.take_cache(1, len(ids))
                staging.clear()
                self.prefixes.fill(staging, *found)
                out[row] = staging.extend(ids[found[1]:]).copy()
                self.cache.copy_in(row, staging)
                self.prefixes.keep(ids, staging)
        groups = [rest] if self.together else [{row: ids} for row, ids in rest.items()]
        for group in groups:
            if not group:
                continue
            staging = self.lm.take_cache(len(group), max(map(len, group.values())))
            try:
                out.update(self.cache.admit_from(group, self.lm.pad_id, staging))
                if any(row in score for row in group):
                    hidden = staging.prompt_hidden()
                    for j, (row, ids) in enumerate(group.items()):
                        if row in score:
                            scored[row] = [None, *self.lm.logprobs_from_hidden(
                                hidden[j, :len(ids) - 1], ids[1:], score[row])]
            finally:
                self._keep_or_give(staging, list(group.values()))
        for row, of in twins.items():
            self.cache.copy_in(row, self.cache, of)
            out[row] = out[of].copy()
        self.shared_prompt_tokens += sum(len(new[row]) for row in twins)
        return out, scored

    def _keep_or_give(self, staging: SharedCache, rows: list[list[int]]) -> None:
        """A staging cache's prompts into the prefix store (a one-row cache as it is, each
        row of a larger one copied into its own), or the cache back to the pool."""
        if self.prefixes is None:
            return self.lm.give_cache(staging)
        if staging.B == 1:
            return self.prefixes.keep(rows[0], staging)
        for j, ids in enumerate(rows):
            if len(ids) >= self.prefixes.min_reuse:
                own = self.lm.take_cache(1, len(ids))
                own.copy_in(0, staging, j)
                self.prefixes.keep(ids, own)
        self.lm.give_cache(staging)

    def step(self, nxt: np.ndarray, active: np.ndarray) -> np.ndarray:
        return self.cache.step_rows(int(np.flatnonzero(active).max()) + 1, nxt, active)

    # chunked prefill: a prompt goes through a staging cache of its own, piece by piece
    def start_filling(self, ids: list[int], reuse: bool) -> tuple[SharedCache, int]:
        """A staging cache for a prompt filled in pieces, and the tokens it holds already (a
        kept prefix, where `reuse`)."""
        staging = self.lm.take_cache(1, len(ids))
        staging.clear()
        store = self.prefixes if reuse else None
        found = None if store is None else store.match(ids)
        if store is None or found is None:
            return staging, 0
        store.fill(staging, *found)
        return staging, found[1]

    def fill(self, staging: SharedCache, piece: list[int]) -> np.ndarray:
        return staging.extend(piece).copy()

    def piece_logprobs(self, staging: SharedCache, piece: list[int], following: list[int],
                       top: int) -> list[Logprob]:
        """After fill: the logprobs of `following` (the tokens after each of the piece's
        positions, as far as the prompt goes) from the piece's hidden states."""
        hidden = staging.prompt_hidden()[0, :len(following)]
        return self.lm.logprobs_from_hidden(hidden, following, top)

    def finish_filling(self, row: int, staging: SharedCache | None,
                       ids: list[int] | None) -> None:
        """Copy a whole prompt (`ids`) into its row, or (None) drop it; the staging cache
        (None: never taken, cancelled before its first piece) goes to the prefix store or
        back to the pool."""
        if staging is None:
            return
        if ids is None:
            return self.lm.give_cache(staging)
        self.cache.copy_in(row, staging)
        self._keep_or_give(staging, [ids])

    def release(self, row: int, tokens: list[int] | None = None) -> None:
        """Free a row; a finished sequence's `tokens` (those in its cache) are kept in the
        prefix store first (a conversation's next turn starts with them)."""
        if self.prefixes is not None and tokens is not None \
                and len(tokens) >= self.prefixes.min_reuse:
            own = self.lm.take_cache(1, len(tokens))
            own.copy_in(0, self.cache, row)
            self.prefixes.keep(tokens, own)
        self.cache.clear(row)


def rows_independent(manifest: Manifest) -> bool:
    """Whether every graph of an artifact computes each row of a batch as if it ran alone:
    quantized without per-tensor activation scales (its recipe says so: tinyt.recipe), fp32
    excepted (float GEMMs may sum in another order for another batch size)."""
    graphs = [manifest.quantization]
    if manifest.prefill_model_file:
        graphs.append(manifest.prefill_quantization)
    return all(recipe.rows_independent(q) is True for q in graphs)


class SeparateRows:
    """Contract graphs: each row its own cache, run alone (rows interleave, no batching)."""

    def __init__(self, lm: LanguageModel, rows: int):
        self.lm = lm
        self.steps: list[Generator[np.ndarray, tuple, None] | None] = [None] * rows
        self.logits = np.zeros((rows, lm.config.vocab_size), dtype=np.float32)

    def admit(self, new: dict[int, list[int]], score: dict[int, int]
              ) -> tuple[np.ndarray, dict[int, list[Logprob | None]]]:
        scored: dict[int, list[Logprob | None]] = {}
        for row, ids in new.items():  # (returns rows' logits by row index, as SharedRows)
            steps = self.lm.steps(prefill_feeds(self.lm.config, self.lm.artifact.kind,
                                                np.array([ids], dtype=np.int64),
                                                kv_dtype=self.lm.kv_dtype))
            logits = next(steps)[0]  # [T, V]: every position of the prompt
            self.logits[row] = logits[-1]
            self.steps[row] = steps
            if row in score:
                scored[row] = [None, *self.lm.logprobs_of(logits[:-1], ids[1:], score[row])]
        return self.logits, scored

    def step(self, nxt: np.ndarray, active: np.ndarray) -> np.ndarray:
        one = np.ones(1, dtype=bool)
        for row in np.flatnonzero(active):
            steps = self.steps[row]
            assert steps is not None  # an active row was admitted
            self.logits[row] = steps.send((nxt[row:row + 1], one))[0, -1]
        return self.logits

    def release(self, row: int, tokens: list[int] | None = None) -> None:
        steps, self.steps[row] = self.steps[row], None
        if steps is not None:
            steps.close()
