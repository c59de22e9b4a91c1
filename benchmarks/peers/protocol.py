"""The worker protocol of every peer benchmark, decoders' and encoders': one process per (engine,
threads) that loads its model once, says hello, then answers one JSON line per JSON line on
stdin until stdin closes.

    parent: Worker(name, threads, argv, env)      worker: serve(hello, answer)
                                           ◀──     hello: {"ready": true, ...} | {"error": ...}
    Worker.ask(op=..., ...)                 ──▶    answer(request) -> reply
                                           ◀──     reply | {"error": ..., "trace": ...}
    Worker.close()                          ──▶    (stdin closed) exits

An error reply is raised in the parent as BenchError (a RuntimeError). The standard library
and numpy only: an encoder peer's worker runs this file in a python without tinyt (its own
venv), beside encoder_adapters.py.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

# Between two workers' blocks, so that no idle worker's threads still spin while the next one is
# timed: ONNX Runtime's spin ~40 ms after a run, Intel OpenMP's (CTranslate2's) up to 200 ms
# (KMP_BLOCKTIME). At 50 ms, Flan-T5-small's shape at 2 threads gave tinyt's batch of 32 37.0
# sentences/s in the 9-engine rotation and 47.8 in a rotation with CTranslate2 int8 alone.
REST_S = 0.3

try:
    from tinyt.errors import BenchError
except ImportError:  # a peer's worker, where tinyt is not installed
    BenchError = RuntimeError  # type: ignore[misc,assignment]


def missing_package(packages) -> str | None:
    """The first of `packages` (dotted names) this python cannot import, or None."""
    import importlib.util

    for name in packages:
        try:
            if importlib.util.find_spec(name) is None:
                return name
        except ModuleNotFoundError:  # its parent package is absent
            return name
    return None


def memory() -> dict | None:
    """This process's resident set now and its peak (VmRSS, VmHWM), in bytes; None where
    /proc does not say (not Linux)."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    kb = {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in status.splitlines()
                                           if line.startswith(("VmRSS:", "VmHWM:")))}
    if len(kb) != 2:
        return None
    return {"rss": kb["VmRSS"] * 1024, "peak_rss": kb["VmHWM"] * 1024}


def reset_peak() -> bool:
    """Start this process's peak resident set again from now (Linux: 5 to /proc/self/clear_refs
    resets VmHWM); whether it could."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def timed(call: Callable[[], object], settle: int, block: int) -> list[float]:
    """`settle` untimed calls, then the seconds of each of `block` timed ones."""
    for _ in range(settle):
        call()
    times = []
    for _ in range(block):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return times


def serve(load: Callable[[], tuple[dict, Callable[[dict], dict]]]) -> None:
    """The worker's side: load (-> the hello, and answer(request) -> reply), then answer JSON
    requests on stdin, one per line, until stdin closes. A hello without "ready" ends it."""
    out = sys.stdout
    sys.stdout = sys.stderr  # libraries' chatter must not reach the protocol
    try:
        hello, answer = load()
    except Exception as e:
        traceback.print_exc()
        hello, answer = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:300]}, None
    out.write(json.dumps(hello) + "\n")
    out.flush()
    if "ready" not in hello or answer is None:
        return
    for line in sys.stdin:
        try:
            reply = answer(json.loads(line))
        except Exception as e:
            reply = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
        out.write(json.dumps(reply) + "\n")
        out.flush()


class Worker:
    """The parent's handle on one worker process: `argv` started with `env` over this
    environment, its stderr to `log` (or dropped); `hello` is its first line."""

    def __init__(self, name: str, threads: int, argv: list[str], env: dict[str, str],
                 log: Path | None = None):
        self.name, self.threads, self.label = name, threads, f"{name}@{threads}t"
        self.log = log
        with open(log, "w") if log else open(os.devnull, "w") as err:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=err, text=True, env={**os.environ, **env})
        self.hello = self._read()
        self.error = self.hello.get("error")  # it could not load: why

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            why = f"worker exited with status {self.proc.wait()}"
            if self.log is not None:
                tail = self.log.read_text(errors="replace").strip().splitlines()[-1:]
                why += f": {' '.join(tail)}"
            return {"error": why}
        return json.loads(line)

    def ask(self, **req) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        reply = self._read()
        if "error" in reply:
            raise BenchError(f"{self.label}: {reply['error']}")
        return reply

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
