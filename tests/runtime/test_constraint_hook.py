"""The constrained-decoding hook (runtime/sampling.Constraint) in the engine and in
LanguageModel.choose_next: masked tokens are never chosen, each chosen token is told, and a
finished constraint ends the request with 'stop'."""
import numpy as np
import pytest

import tinyt.runtime as rt
from tinyt.runtime.engine import Engine
from tinyt.runtime.sampling import SamplingParams


class Only:
    """Tokens from `allowed`, finished after `length` of them."""

    def __init__(self, allowed, length):
        self.allowed, self.length, self.seen = np.asarray(allowed), length, []

    def mask(self, logits):
        keep = logits[self.allowed].copy()
        logits[:] = -np.inf
        logits[self.allowed] = keep

    def accept(self, token):
        assert token in self.allowed
        self.seen.append(token)

    @property
    def finished(self):
        return len(self.seen) >= self.length


@pytest.fixture(scope="module")
def lm(lm_onnx, tmp_path_factory):
    from tinyt.export.optimize import optimize

    root = tmp_path_factory.mktemp("hook")
    return rt.load(optimize(optimize(lm_onnx, root / "opt"), root / "gqa", target="gqa"),
                   threads=1, tune=False)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_engine_follows_a_constraint(lm, temperature):
    ids = lm.tokenizer.encode("def f(x):")
    free = lm.generate_ids([ids], max_new_tokens=6)[0].token_ids
    allowed = [t for t in range(40, 60) if t not in free[:1]]  # the free first token: not allowed
    engine = Engine(lm, max_batch=2).start()
    try:
        c = Only(allowed, 4)
        req = engine.submit(ids, SamplingParams(max_new_tokens=10, temperature=temperature,
                                                seed=1), constraint=c)
        other = engine.submit(ids, SamplingParams(max_new_tokens=6))  # unconstrained beside it
        done = req.wait(30)
        assert other.wait(30).finish_reason == "length"
    finally:
        engine.stop()
    assert done.finish_reason == "stop" and req.out == c.seen and len(req.out) == 4
    assert set(req.out) <= set(allowed)
    assert other.out == free  # the row beside it is its own


def test_choose_next_masks_a_copy(lm):
    logits = np.arange(lm.config.vocab_size, dtype=np.float32)
    out = []
    c = Only([3, 5], 1)
    reason = lm.choose_next(logits, SamplingParams(max_new_tokens=5), None, [1], out,
                            constraint=c)
    assert out == [5] and reason == "stop"
    assert logits[-1] == lm.config.vocab_size - 1  # the caller's row is left as it was
