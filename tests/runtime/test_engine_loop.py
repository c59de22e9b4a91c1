"""runtime/engine_loop.py, the lifecycle both engines share, on a model-free engine: a step
that raises ends every request in flight with Done('error') and the next request is served;
a full queue and a stopping engine refuse; stop(cancel=True) cancels what waits and runs."""
import threading

import pytest

from tinyt.errors import QueueFull
from tinyt.runtime.engine_loop import EngineLoop
from tinyt.runtime.request import Done, Request
from tinyt.runtime.sampling import SamplingParams


class Toy(EngineLoop):
    """One row per request; a request's token is its prompt's first id; a prompt [13] breaks
    the model; a prompt [7] runs until cancelled (held at `gate`)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.rows: list[Request] = []
        self.gate = threading.Event()

    def submit(self, ids):
        req = Request(ids, SamplingParams(max_new_tokens=1))
        self._enqueue(req)
        return req

    def _busy(self):
        return bool(self.rows)

    def _admit(self):
        new = list(self._waiting)
        self._waiting.clear()
        return new

    def _iterate(self, new):
        self.rows += new
        if any(req.prompt_ids == [13] for req in self.rows):  # one run for all the rows
            raise RuntimeError("the model broke")
        for req in list(self.rows):
            if req.prompt_ids == [7] and not req.cancelled:
                self.gate.set()
                continue
            self.rows.remove(req)
            req._emit(Done("cancelled" if req.cancelled else "length", str(req.prompt_ids[0])))

    def _in_flight(self, new):
        return [*(new or ()), *self.rows]

    def _reset(self):
        self.rows = []


def test_a_step_that_raises_ends_every_request_in_flight_and_the_next_is_served():
    engine = Toy(max_queue=8)
    with engine.together():  # admitted in one step with the breaking one
        engine.start()
        a, broken = engine.submit([1]), engine.submit([13])
    for req in (a, broken):
        done = req.wait(10)
        assert done.finish_reason == "error" and done.error == "RuntimeError: the model broke"
    assert engine.rows == []  # reset
    assert engine.submit([2]).wait(10) == Done("length", "2")
    engine.stop()
    assert not engine._thread.is_alive()


def test_a_full_queue_and_a_stopping_engine_refuse():
    engine = Toy(max_queue=2)  # not started: nothing leaves the queue
    engine.submit([1]), engine.submit([2])
    with pytest.raises(QueueFull, match=r"2 requests are waiting \(max_queue 2\)"):
        engine.submit([3])
    engine.stop(cancel=True)
    with pytest.raises(QueueFull, match="stopping and takes no new requests"):
        engine.submit([4])


def test_stop_with_cancel_cancels_what_waits_and_what_runs():
    engine = Toy(max_queue=8).start()
    running = engine.submit([7])
    assert engine.gate.wait(10)
    with engine.together():  # queued behind the running row, never admitted
        waiting = engine.submit([5])
        engine.stop(cancel=True, timeout=0)
    engine._thread.join(10)
    assert running.cancelled and waiting.cancelled
    assert running.done == Done("cancelled", "7")
    assert not engine._thread.is_alive()
