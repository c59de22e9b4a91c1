"""runtime/heads.BeamHead: beam search's top-k read from a small ONNX Runtime graph chooses as
numpy's log_softmax over the whole rows does."""
from __future__ import annotations

import numpy as np
import pytest

from tinyt.errors import NonFiniteError
from tinyt.runtime.beam import BeamParams, _log_softmax, beam_search
from tinyt.runtime.heads import BeamHead

V = 700


def test_the_head_gives_each_rows_best_log_probabilities():
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((5, V)) * 4).astype(np.float32)
    logits[2, 10] = -np.inf  # a ruled-out token stays out
    values, ids = BeamHead()(logits, 8)
    want = _log_softmax(logits)
    order = np.argsort(-want, axis=1, kind="stable")[:, :8]
    assert ids.shape == values.shape == (5, 8)
    np.testing.assert_array_equal(ids, order)
    # LogSoftmax in float32 either way: each value within a few ulps of |logp| <= ~30
    np.testing.assert_allclose(values, np.take_along_axis(want, order, 1), rtol=0, atol=2e-5)
    assert (np.diff(values, axis=1) <= 0).all()


def _model(seed: int, eos: int):
    """Logits of a fake decoder: a function of each row's tokens so far (no cache)."""
    seqs: list[list[int]] = []

    def logits_of(seq):
        rng = np.random.default_rng([seed, *seq])
        z = (rng.standard_normal(V) * 3).astype(np.float32)
        z[eos] += 0.4 * len(seq)  # longer hypotheses end more often
        return z

    def first(prefixes):
        seqs[:] = [list(p) for p in prefixes]
        return np.stack([logits_of(s) for s in seqs])

    def step(parents, tokens):
        seqs[:] = [seqs[p] + [int(t)] for p, t in zip(parents, tokens)]
        return np.stack([logits_of(s) for s in seqs])
    return first, step


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("params", [BeamParams(4), BeamParams(3, 2.0, "never"),
                                    BeamParams(5, -0.5, True)])
def test_beam_search_chooses_the_same_with_the_head(seed, params):
    prefixes = [[1, 2], [3], [4, 5, 6]]
    runs = []
    for head in (None, BeamHead()):
        first, step = _model(seed, eos=0)
        runs.append(beam_search(first(prefixes), step, prefixes, params, eos=[0],
                                max_new_tokens=12, head=head))
    assert runs[0] == runs[1]
    assert {reason for _, reason in runs[0]} <= {"eos", "length"}


def test_a_nonfinite_row_is_refused_by_name():
    logits = np.zeros((2, V), dtype=np.float32)
    logits[1, 3] = np.nan
    with pytest.raises(NonFiniteError):
        beam_search(logits, lambda p, t: logits, [[1], [2]], BeamParams(2), eos=[0],
                    max_new_tokens=3, head=BeamHead())


def test_the_mask_is_added_after_the_normalisation():
    rng = np.random.default_rng(1)
    logits = (rng.standard_normal((3, V)) * 4).astype(np.float32)
    mask = np.zeros(V, dtype=np.float32)
    mask[np.argsort(-logits[0])[:5]] = -np.inf  # row 0's five best ruled out
    values, ids = BeamHead()(logits, 6, mask)
    want = _log_softmax(logits) + mask  # transformers' order: log_softmax, then processors
    order = np.argsort(-want, axis=1, kind="stable")[:, :6]
    np.testing.assert_array_equal(ids, order)
    np.testing.assert_allclose(values, np.take_along_axis(want, order, 1), rtol=0, atol=2e-5)
    assert not set(ids[0]) & set(np.argsort(-logits[0])[:5])


class _Suppress:
    """A rule of one mask for every row (as Whisper's suppressed tokens), the first step's
    longer: what runtime/transcribe.WhisperRules does without timestamps."""
    active = True

    def __init__(self, always, at_first):
        self.always, self.at_first = list(always), list(at_first)

    def apply(self, scores, histories, made):
        scores[:, self.always + (self.at_first if made == 0 else [])] = -np.inf

    def static_mask(self, made, vocab):
        mask = np.zeros(vocab, dtype=np.float32)
        mask[self.always + (self.at_first if made == 0 else [])] = -np.inf
        return mask


@pytest.mark.parametrize("seed", range(4))
def test_a_static_mask_rule_chooses_the_same_through_the_head(seed):
    prefixes = [[1, 2], [3]]
    rules = _Suppress(always=range(100, 300), at_first=[0, *range(5, 50)])
    runs, calls, head = [], [], BeamHead()

    def counted(z, k, m):
        calls.append(m)
        return head(z, k, m)
    for top in (None, counted):
        first, step = _model(seed, eos=0)
        runs.append(beam_search(first(prefixes), step, prefixes, BeamParams(4), eos=[0],
                                max_new_tokens=10, rules=rules, head=top))
    assert runs[0] == runs[1]
    assert calls and all(m is not None for m in calls)  # the head ran, with the rule's mask
    assert not any(t in range(100, 300) for hyp, _ in runs[0] for t in hyp)


def test_top_gives_each_rows_largest_scores_the_lower_id_first_on_a_tie():
    rng = np.random.default_rng(2)
    scores = (rng.standard_normal((4, V)) * 4).astype(np.float32)
    scores[1, 50:60] = 30.0  # ten equal best: TopK's tie rule, the lower id first
    scores[2, :690] = -np.inf  # a row ruled down to 10 tokens: its -inf come after them
    values, ids = BeamHead().top(scores, 12)
    order = np.argsort(-scores, axis=1, kind="stable")[:, :12]
    np.testing.assert_array_equal(ids, order)
    np.testing.assert_array_equal(values, np.take_along_axis(scores, order, 1))  # no arithmetic
    assert ids[1, :10].tolist() == list(range(50, 60))


class _NoRepeat:
    """A rule that reads each row's history (no token twice in a row's generated tokens): no
    mask serves every row, so beam_search applies it to numpy's log-probabilities."""
    active = True

    def apply(self, scores, histories, made):
        for r, history in enumerate(histories):
            scores[r, [t for t in history if t >= 10]] = -np.inf

    def static_mask(self, made, vocab):
        return None


@pytest.mark.parametrize("seed", range(4))
def test_a_rule_that_reads_each_row_chooses_the_same_through_top(seed):
    """Each row's best `keep` by BeamHead.top, then a source's best of those: what numpy's
    argpartition over all of a source's rows chose (no ties among random logits)."""
    prefixes = [[1, 2], [3]]
    runs, calls, head = [], [], BeamHead()

    class Counted:
        def __call__(self, z, k, m):
            return head(z, k, m)

        def top(self, z, k):
            calls.append(z.shape)
            return head.top(z, k)
    for top in (None, Counted()):
        first, step = _model(seed, eos=0)
        runs.append(beam_search(first(prefixes), step, prefixes, BeamParams(4), eos=[0],
                                max_new_tokens=10, rules=_NoRepeat(), head=top))
    assert runs[0] == runs[1]
    assert calls and calls[0] == (2, V)  # top ran from the first step: a row a source
    kept = [[t for t in hyp if t >= 10] for hyp, _ in runs[0]]
    assert all(len(set(k)) == len(k) for k in kept)  # the rule held
