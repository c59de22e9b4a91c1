"""A warm interpreter the README test forks its Python commands from (tests/test_readme.py).

Each of the README's ~170 commands is a fresh `python -m ...` that imports torch, onnx, ONNX
Runtime, onnxscript and often transformers before it does anything: 1-3 CPU-seconds a command,
which at the test's small sizes is a large share of the whole. This process imports them once;
for each command it forks a child that becomes the command — its own process, argv, working
directory, environment, standard streams (files), exit status and `atexit` handlers — and runs
the module or script as `python -m` / `python script.py` would (runpy, `__main__`). Only what a
fork shares differs from a fresh interpreter: the modules below are already imported (with the
same environment the command gets: the test starts this process with it).

Protocol (a line of JSON each way): {"argv", "cwd", "env", "out", "err", "timeout"} in; this
process forks, waits (killing the child's process group past `timeout`) and answers {"rc",
"cpu"} (an exit status as subprocess gives it: -N for signal N, "timeout" when it was killed;
the CPU-seconds the command and the processes it waited for used).
"""
from __future__ import annotations

import importlib
import json
import os
import runpy
import signal
import sys
import time
import traceback

PRELOAD = ("numpy", "torch", "onnx", "onnxruntime", "onnxscript", "onnx_ir", "safetensors",
           "tokenizers", "typer", "transformers", "tinyt", "tinyt.checkpoint", "tinyt.export",
           "tinyt.runtime")


def child(req: dict) -> int:
    """Become the command (in the forked child): its exit status."""
    os.setpgid(0, 0)  # its own group: a timeout kills what it started too
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, req["out"]), (2, req["err"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    argv = req["argv"]
    try:
        if argv[1] == "-m":
            sys.argv = [argv[0], *argv[3:]]
            sys.path[0] = os.getcwd()
            runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
        else:
            sys.argv = argv[1:]
            sys.path[0] = os.path.dirname(os.path.abspath(argv[1]))
            runpy.run_path(argv[1], run_name="__main__")
        return 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001 - as the interpreter reports an uncaught one
        traceback.print_exc()
        return 1


def exit_as_python_would(code: int) -> None:
    """The interpreter's exit, but for its C++ static destructors: non-daemon threads joined,
    `atexit` handlers (weakref.finalize's too) run, the streams flushed, then _exit. (A full
    exit in a forked child aborts in a destructor that joins a thread of the parent's, which
    the child does not have: "terminate called after throwing std::system_error".)"""
    import atexit
    import threading
    try:
        threading._shutdown()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed stream: nothing left to flush
                pass
        os._exit(code)


def wait(pid: int, timeout: float) -> tuple[int | str, float]:
    """(The child's exit status as subprocess reports it, or "timeout" (its group killed); the
    CPU-seconds it and the children it waited for used)."""
    deadline = time.monotonic() + timeout
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime
        if time.monotonic() > deadline:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _, _, usage = os.wait4(pid, 0)
            return "timeout", usage.ru_utime + usage.ru_stime
        time.sleep(0.02)


def main() -> None:
    for name in PRELOAD:
        importlib.import_module(name)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            exit_as_python_would(child(req))
        rc, cpu = wait(pid, req["timeout"])
        print(json.dumps({"rc": rc, "cpu": cpu}), flush=True)


class Zygotes:
    """The test's side: one warm interpreter a thread (the README test runs two blocks at a
    time), started with the commands' environment; `run` takes a command as subprocess.run
    would and forks it from there where it is `python -m MODULE` or `python SCRIPT.py` with
    that environment, else runs it as a subprocess; either way it answers (the completed
    process, the CPU-seconds the command used)."""

    def __init__(self, scratch: str):
        import threading
        self._scratch, self._local, self._all = scratch, threading.local(), []
        self._lock = threading.Lock()

    def run(self, argv: list[str], *, cwd, env: dict, timeout: float):
        import subprocess
        import tempfile
        forked = argv[0] == sys.executable and len(argv) > 2 and (
            argv[1] == "-m" or argv[1].endswith(".py"))
        with tempfile.TemporaryDirectory(dir=self._scratch) as tmp:
            out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
            if forked:
                rc, cpu = self._forked(argv, cwd, env, timeout, out, err)
            else:  # its own session: a timeout kills what it started too
                with open(out, "w") as o, open(err, "w") as e:
                    sub = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                           stdout=o, stderr=e, start_new_session=True)
                rc, cpu = wait(sub.pid, timeout)  # (held: no other Popen's cleanup reaps it)
                sub.returncode = -9 if rc == "timeout" else rc
            if rc == "timeout":
                raise subprocess.TimeoutExpired(argv, timeout)
            with open(out, errors="replace") as o, open(err, errors="replace") as e:
                return subprocess.CompletedProcess(argv, rc, o.read(), e.read()), cpu

    def _forked(self, argv, cwd, env: dict, timeout: float, out: str, err: str):
        proc = self._zygote(env)
        proc.stdin.write(json.dumps({"argv": argv, "cwd": str(cwd), "env": env, "out": out,
                                     "err": err, "timeout": timeout}) + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the README test's zygote ended (exit {proc.wait()})")
        answer = json.loads(line)
        return answer["rc"], answer["cpu"]

    def _zygote(self, env: dict):
        import subprocess
        proc = getattr(self._local, "proc", None)
        if proc is None or proc.poll() is not None:
            proc = subprocess.Popen([sys.executable, __file__], env=env, text=True,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            if json.loads(proc.stdout.readline() or "{}").get("ready") is not True:
                raise RuntimeError("the README test's zygote did not start")
            self._local.proc, self._local.env = proc, env
            with self._lock:
                self._all.append(proc)
        assert env == self._local.env, "every README command runs with one environment"
        return proc

    def close(self) -> None:
        for proc in self._all:
            proc.stdin.close()
            try:
                proc.wait(timeout=30)
            except Exception:  # noqa: BLE001 - a stuck one is killed
                proc.kill()


if __name__ == "__main__":
    main()
