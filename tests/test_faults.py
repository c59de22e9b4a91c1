"""Interrupted and concurrent writes: every writing stage killed at random points leaves the
previous output intact and loadable, the next run succeeds and sweeps up what the killed one
left; Ctrl-C exits 130 with one line; atomic_dir's swap holds under kills and races."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import tinyt.runtime as rt
from tinyt.checkpoint import has_train_state, load_checkpoint
from tinyt.fsutil import atomic_dir, remove_stale, write_json
from tinyt.manifest import check_manifest

TINYT = [sys.executable, "-m", "tinyt"]


def as_in_a_terminal() -> None:
    """A child's SIGINT as a terminal gives it: the default. A suite started in the background
    of a script (`cmd &` without job control) or under nohup runs with SIGINT ignored, and its
    children inherit that, so a Ctrl-C test would send a signal nobody takes (tinyt keeps an
    ignored SIGINT ignored, as nohup asks)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.glob(f".{out.name}.*"))


def run_full(cmd: list) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(TINYT + [str(c) for c in cmd], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    return time.perf_counter() - t0


def kill_after(cmd: list, seconds: float) -> int:
    proc = subprocess.Popen(TINYT + [str(c) for c in cmd], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    time.sleep(seconds)
    proc.send_signal(signal.SIGKILL)
    return proc.wait()


def loads_whole(out: Path) -> None:
    """Nothing half-written: every file matches the manifest and the runtime opens it."""
    check_manifest(out)
    rt.load(out, threads=1)


@pytest.fixture(scope="module")
def stages(tiny_ckpt, lm_onnx, corpus_dir):
    return {
        "export": ([tiny_ckpt], loads_whole),
        "optimize": ([lm_onnx], loads_whole),
        "quantize": ([lm_onnx, "--data", corpus_dir], loads_whole),
        "package": ([lm_onnx], loads_whole),
    }


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["export", "optimize", "quantize", "package"])
def test_a_stage_killed_at_random_points_leaves_the_previous_output(stage, stages, tmp_path):
    args, check = stages[stage]
    out = tmp_path / "out"
    cmd = [stage, args[0], out, *args[1:]]
    full = run_full(cmd)
    check(out)
    before = check_manifest(out)
    rng = random.Random(stage)
    for _ in range(2 if stage == "export" else 3):  # export: the slowest, 6 s a run
        kill_after(cmd, rng.uniform(0.4, 1.0) * full)
        check(out)  # the previous output, or a complete new one
        assert check_manifest(out)["files"].keys() == before["files"].keys()
    run_full(cmd)  # the next run succeeds ...
    check(out)
    assert leftovers(out) == []  # ... and removes what the killed runs left


def kill_after_evaluations(cmd: list, count: int, rng: random.Random) -> None:
    """Start `tinyt train`, and SIGKILL it a random instant (0-0.2 s) after its `count`-th
    evaluation line: a point of the work, not of the clock. Evaluation k is printed just
    before checkpoint k is written, so from count >= 2 on, checkpoint 1 is whole on disk."""
    proc = subprocess.Popen(TINYT + [str(c) for c in cmd], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(240, proc.kill)  # a hung run fails below instead of hanging
    watchdog.start()
    seen = 0
    for line in proc.stderr:
        seen += "val_loss" in line
        if seen == count:
            time.sleep(rng.uniform(0.0, 0.2))
            break
    proc.kill()
    proc.wait()
    watchdog.cancel()
    assert seen == count, f"training ended after {seen} evaluations, before the kill"


@pytest.mark.slow
def test_training_killed_at_random_points_always_leaves_a_loadable_checkpoint(corpus_dir,
                                                                               tmp_path):
    out = tmp_path / "ck"
    fresh = ["train", "--preset", "test", "--data", corpus_dir, "--out", out,
             "--max-steps", "60", "--eval-interval", "2"]  # a checkpoint written every 2 steps
    # (60: the three kills come after at most 6 evaluations each, 36 steps in all)
    rng = random.Random(0)
    for _ in range(3):
        kill_after_evaluations(["train", "--out", out, "--resume"] if out.exists() else fresh,
                               rng.randint(2, 6), rng)
        ck = load_checkpoint(out)  # evaluation 2 came after checkpoint 1 was whole
        assert has_train_state(out) and ck.meta["metrics"]["step"] % 2 == 0
    run_full(["train", "--out", out, "--resume"])
    assert load_checkpoint(out).meta["metrics"]["step"] == 60
    assert leftovers(out) == []


@pytest.mark.slow
@pytest.mark.parametrize("point", ["import", "trace", "write"])
def test_ctrl_c_exits_130_with_one_line_and_the_previous_output_intact(point, tiny_ckpt,
                                                                        tmp_path):
    """A Ctrl-C during the verb's imports, inside torch's exporter, and while writing (sent at
    that point of the work by tests/interrupt_worker.py, not after a time)."""
    out = tmp_path / "onnx"
    run_full(["export", tiny_ckpt, out])
    before = check_manifest(out)
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("interrupt_worker.py")),
                           point, "export", str(tiny_ckpt), str(out)],
                          capture_output=True, text=True, timeout=300,
                          preexec_fn=as_in_a_terminal)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 130 and len(lines) == 1, (proc.returncode, proc.stderr)
    assert lines[0].startswith("interrupted: "), proc.stderr
    assert check_manifest(out) == before
    assert leftovers(out) == []  # a Ctrl-C cleans up after itself


def test_ctrl_c_during_training_says_which_checkpoint_it_kept(corpus_dir, tmp_path):
    """SIGINT after the second evaluation line (checkpoint 1 is whole on disk by then: a point
    of the work, not of the clock); the output is read as it comes, so no pipe fills, and a
    watchdog turns a hang into a failure instead of a wait."""
    out = tmp_path / "ck"
    proc = subprocess.Popen(TINYT + ["train", "--preset", "test", "--data", str(corpus_dir),
                                     "--out", str(out), "--max-steps", "100000",
                                     "--eval-interval", "5"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=as_in_a_terminal)
    watchdog = threading.Timer(600, proc.kill)
    watchdog.start()
    lines, evaluations = [], 0
    try:
        for line in proc.stderr:
            lines.append(line)
            evaluations += "val_loss" in line
            if evaluations == 2 and proc.returncode is None:
                proc.send_signal(signal.SIGINT)
                evaluations += 1  # sent once
        proc.wait()
    finally:
        watchdog.cancel()
    err = "".join(lines)
    last = err.strip().splitlines()[-1]
    assert evaluations == 3, f"training ended before its second evaluation: {err[-2000:]}"
    assert proc.returncode == 130 and "Traceback" not in err, err[-2000:]
    assert last.startswith("interrupted: training stopped at step") and "--resume" in last, last
    assert load_checkpoint(out).meta["metrics"]["step"] % 5 == 0


# -- atomic_dir itself ---------------------------------------------------------------------------
def test_a_failed_write_keeps_the_previous_directory(tmp_path):
    out = tmp_path / "out"
    with atomic_dir(out) as tmp:
        (tmp / "a").write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_dir(out) as tmp:
            (tmp / "a").write_text("half")
            raise RuntimeError("stage failed")
    assert (out / "a").read_text() == "old" and leftovers(out) == []


def test_stale_temporaries_of_dead_writers_go_and_live_ones_stay(tmp_path):
    out = tmp_path / "out"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()  # a pid now gone
    (tmp_path / f".out.tmp-{dead}-0badc0de").mkdir()
    (tmp_path / f".out.tmp-{os.getppid()}-0011aabb").mkdir()  # pytest's parent: alive
    with atomic_dir(out) as tmp:
        (tmp / "a").write_text("new")
    assert leftovers(out) == [f".out.tmp-{os.getppid()}-0011aabb"]


def test_concurrent_writers_each_leave_a_whole_directory(tmp_path):
    out = tmp_path / "out"

    def write(i: int) -> None:
        with atomic_dir(out) as tmp:
            for k in range(30):
                (tmp / f"f{k}").write_text(str(i))

    threads = [threading.Thread(target=write, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({(out / f"f{k}").read_text() for k in range(30)}) == 1  # one writer's, whole
    assert leftovers(out) == []


def test_a_kill_between_the_two_renames_of_the_fallback_swap_loses_nothing(tmp_path):
    """Where there is no atomic exchange, the swap is two renames; a process killed between
    them strands the previous output under `.old-`: the next write puts it back first."""
    out = tmp_path / "out"
    with atomic_dir(out) as tmp:
        (tmp / "a").write_text("previous")
    script = textwrap.dedent(f"""
        import os, signal
        import tinyt.fsutil as fs
        fs._exchange = lambda a, b: False  # the fallback
        real = os.rename
        def rename(src, dst):
            real(src, dst)
            if ".old-" in str(dst):
                os.kill(os.getpid(), signal.SIGKILL)
        os.rename = rename
        with fs.atomic_dir({str(out)!r}) as tmp:
            (tmp / "a").write_text("next")
    """)
    proc = subprocess.run([sys.executable, "-c", script])
    assert proc.returncode == -signal.SIGKILL
    assert not out.exists() and any(".old-" in n for n in leftovers(out))
    remove_stale(out)  # what the next writer does first
    assert (out / "a").read_text() == "previous" and leftovers(out) == []
    with pytest.raises(RuntimeError):  # and a next write that fails keeps it
        with atomic_dir(out):
            raise RuntimeError("failed")
    assert (out / "a").read_text() == "previous"


def test_write_json_is_whole_or_nothing(tmp_path, monkeypatch):
    path = tmp_path / "report.json"
    write_json(path, {"a": 1})

    def broken(self, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(Path, "write_text", broken)
    with pytest.raises(OSError):
        write_json(path, {"a": 2})
    monkeypatch.undo()
    assert path.read_text().strip().endswith("}") and '"a": 1' in path.read_text()
    assert leftovers(path) == []


def test_signals_held_hold_in_a_process_with_other_threads():
    """The kernel hands a process-directed SIGINT to a thread that does not block it; Python
    then runs its handler in the main thread at the next bytecode, inside the held block unless
    the handler is deferred too. Here the signal is sent to the other thread itself, and the
    block goes on only once the C-level handler has run (the wake-up fd says so)."""
    import tinyt.fsutil as fs

    r, w = os.pipe()
    os.set_blocking(w, False)
    other = threading.Thread(target=time.sleep, args=(5,), daemon=True)
    other.start()
    old_fd = signal.set_wakeup_fd(w)
    old_handler = signal.signal(signal.SIGINT, signal.default_int_handler)  # even if ignored
    after = []
    try:
        with pytest.raises(KeyboardInterrupt):
            with fs._signals_held():
                signal.pthread_kill(other.ident, signal.SIGINT)
                assert os.read(r, 1) == bytes([signal.SIGINT])  # the signal was taken
                for _ in range(100):
                    after.append(abs(-1))  # calls: where a pending handler would run
            after.append("block left")
    finally:
        signal.signal(signal.SIGINT, old_handler)
        signal.set_wakeup_fd(old_fd)
        os.close(r)
        os.close(w)
    assert after == [1] * 100  # the interrupt came after the block, before the next line
