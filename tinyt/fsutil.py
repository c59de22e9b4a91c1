"""Atomic directory and file writes, and file hashing (torch-free).

Every stage writes its artifact directory under a temporary sibling name and swaps it into
place only when all files are complete, so a reader sees the previous directory or the new
one, never a mix, whether the writer finishes, fails, is interrupted or is killed:

    OUT/                          what readers load
    .OUT.tmp-<pid>-<hex>/         a writer's work in progress (removed when it fails)
    .OUT.old-<pid>-<hex>/         the previous OUT for an instant during a swap (fallback only)

The swap is one atomic exchange of the two directory entries where the system has one (Linux
renameat2 RENAME_EXCHANGE), else two renames with signals held off between them. Temporaries
left by a writer that was killed (SIGKILL, a power cut) are removed by the next write of the
same OUT, never those of a process that is still running; a previous OUT stranded under its
`.old-` name by a kill between the two renames is put back first. A writer is known by its
PID on this machine: a temporary left on a shared filesystem by a writer on another host (or
in another PID namespace) may look dead or alive by coincidence — tinyt's stages write their
outputs from one machine.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import glob
import hashlib
import json
import os
import shutil
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_SWAP_ATTEMPTS = 20  # concurrent writers of one OUT: the last one to swap wins, each whole


@contextlib.contextmanager
def atomic_dir(out: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty temporary directory; on success it replaces `out` whole, else vanishes."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(out)
    tag = f"{os.getpid()}-{os.urandom(4).hex()}"
    tmp = out.parent / f".{out.name}.tmp-{tag}"
    tmp.mkdir()
    try:
        yield tmp
        with _signals_held():
            _swap_in(tmp, out, tag)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _swap_in(tmp: Path, out: Path, tag: str) -> None:
    for _ in range(_SWAP_ATTEMPTS):
        if not out.exists():
            try:
                os.rename(tmp, out)  # fails, rather than merging, if a writer got there first
                return
            except OSError as e:
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                continue
        if _exchange(tmp, out):  # tmp now holds the previous OUT
            shutil.rmtree(tmp, ignore_errors=True)
            return
        old = out.parent / f".{out.name}.old-{tag}"
        try:
            os.rename(out, old)
        except FileNotFoundError:  # another writer moved it away meanwhile: try again
            continue
        try:
            os.rename(tmp, out)
        except OSError:
            if not out.exists():
                os.rename(old, out)
            raise
        shutil.rmtree(old, ignore_errors=True)
        return
    raise OSError(errno.EBUSY, f"{out} kept changing under {_SWAP_ATTEMPTS} attempts to replace "
                               "it: other processes are writing it at the same time")


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two existing paths (Linux renameat2 RENAME_EXCHANGE); False where the
    system or the filesystem has no such call."""
    if not sys.platform.startswith("linux"):
        return False
    fn = getattr(_libc(), "renameat2", None)
    if fn is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


_LIBC = None


def _libc():
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT / SIGTERM arrive after the block, not inside it (main thread, POSIX). Blocking
    them in this thread is not enough where the process has other threads (torch's, ONNX
    Runtime's): the kernel then hands the signal to one of those, and Python still runs its
    handler in the main thread at the next bytecode. So the Python-level handlers are swapped
    for one that only records, and what it recorded is raised again after the block."""
    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not \
            threading.main_thread():
        yield
        return
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.getsignal(s) for s in held}
    received: list[int] = []
    swapped = [s for s in held if previous[s] is not None]  # None: not set from Python
    for s in swapped:
        signal.signal(s, lambda signum, frame: received.append(signum))
    before = signal.pthread_sigmask(signal.SIG_BLOCK, set(held))
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
        for s in swapped:
            signal.signal(s, previous[s])
        for signum in dict.fromkeys(received):
            signal.raise_signal(signum)


def _owner_alive(name: str) -> bool:
    """Whether the process that made the temporary `name` (.X.tmp-<pid>-<hex>) still runs."""
    try:
        pid = int(name.rsplit("-", 2)[-2])
    except (ValueError, IndexError):
        return True  # not ours to judge: leave it
    if pid == os.getpid():
        return True  # another thread of this process
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def remove_stale(out: str | os.PathLike) -> list[Path]:
    """Remove the temporaries of `out` whose writer process is gone; put back a previous `out`
    stranded under its `.old-` name. Returns what was removed."""
    out = Path(out)
    removed = []
    prefix = glob.escape(str(out.parent / f".{out.name}"))
    for kind in ("old", "tmp"):
        for name in sorted(glob.glob(f"{prefix}.{kind}-*")):
            path = Path(name)
            if _owner_alive(path.name):
                continue
            if kind == "old" and not out.exists():
                try:
                    os.rename(path, out)  # the previous output, back where readers look
                    continue
                except OSError:
                    pass
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write a whole file or nothing: a temporary beside it, renamed over it."""
    path = Path(path)
    remove_stale(path)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json(path: str | os.PathLike, data: Any) -> None:
    write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def read_json_object(path: Path, error: type[Exception]) -> dict[str, Any]:
    """A JSON file holding an object, or `error` naming the file and what is wrong with it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise error(f"{path} is not readable JSON: {e}") from None
    if not isinstance(data, dict):
        raise error(f"{path} must hold a JSON object")
    return data


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
