"""Shared fixtures: a small synthetic corpus (fast to tokenize) and tiny configurations."""
from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

# Threads that wait for work sleep instead of spinning: GNU and Intel OpenMP (torch's and
# CTranslate2's pools) read OMP_WAIT_POLICY when they load, so it is set before anything imports
# them, and every process the suite starts inherits it. The README test's commands run with both
# cores beside the other worker: a spinning thread there holds a core the other needs (measured,
# the README test alone beside one busy core, back to back: 1,081 s wall and 1,129 CPU-s with
# libgomp's default, 817 s and 866 CPU-s PASSIVE; `tinyt verify` 19.5 s -> 1.0 s). No test times
# anything, so the suite does not need spinning's faster wake-up.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# and ONNX Runtime's, in tinyt's sessions (runtime/session.default_spinning): with two threads
# beside a busy core, a tiny graph's 400 runs took 1.2 s wall and 0.75 CPU-s spinning, 0.8 s and
# 0.4 CPU-s not
os.environ.setdefault("TINYT_SPINNING", "0")
# Python caches what it compiles (__pycache__) even where the environment says not to: with
# PYTHONDONTWRITEBYTECODE set (this workplace's shells set it) and a setup that installs with
# --no-compile (scripts/setup.sh, 113 s saved), every process the suite starts compiled torch's,
# transformers' and tinyt's sources again on import: 6.5 CPU-s for `import torch, transformers,
# onnxruntime, tinyt.export, tinyt.runtime` in a fresh clone's .venv, 2.3 once cached. The suite
# starts hundreds of such processes (CLI runs, peer workers, conversions, xdist's workers).
# (xdist's workers start without it; this process writes from its imports below on)
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# Each xdist worker keeps to one core of its own (before torch or onnxruntime size their thread
# pools), and everything it runs inherits that: tinyt's default threads are the cores a process
# may run on (tinyt.hardware.physical_cores), so two workers no longer run 2 + 2 spinning threads
# on 2 cores (measured: a 6-file slice of the suite 302 s -> 278 s, user time 486 -> 429 s).
if hasattr(os, "sched_getaffinity"):  # every core this run may use (the README test's)
    ALL_CPUS = sorted(os.sched_getaffinity(0))
else:
    ALL_CPUS = []
if os.environ.get("PYTEST_XDIST_WORKER") and hasattr(os, "sched_setaffinity"):
    _cpus = ALL_CPUS
    if len(_cpus) > 1:
        _worker = int(os.environ["PYTEST_XDIST_WORKER"].removeprefix("gw"))
        os.sched_setaffinity(0, {_cpus[_worker % len(_cpus)]})

sys.dont_write_bytecode = False

import numpy as np  # noqa: E402 - after the environment above, which they read as they load
import pytest  # noqa: E402

from tinyt.config import ModelConfig, TrainConfig  # noqa: E402

# The suite runs on two workers (pytest-xdist, `-n 2 --dist loadfile` in pyproject.toml): each
# file whole on one worker, handed out in collection order. The longest files go first, so no
# worker is left running one of them alone at the end.
# (By the seconds each took in a run of the whole suite, 2026-12-06; the README test alone is
# a quarter of the suite, so it starts first, beside everything else.)
LONGEST_FIRST = ("tests/test_readme.py", "tests/benchmarks/test_encoder_peers.py",
                 "tests/export/test_families_dirs.py", "tests/test_faults.py",
                 "tests/export/test_families_chain.py", "tests/export/test_whisper_stages.py",
                 "tests/runtime/test_whisper_runtime.py", "tests/app/test_cli.py",
                 "tests/benchmarks/test_seq2seq_peers.py", "tests/export/test_web_encoders.py",
                 "tests/benchmarks/test_whisper_peers.py", "tests/benchmarks/test_peers.py",
                 "tests/real/test_minilm.py", "tests/test_packaging.py")


# torch's exporter behind a cache of one directory a run, shared by the workers and every process
# they start (export/export_cache.py; the same tiny checkpoints are exported in many files).
# Made by the process that starts the run (xdist's workers inherit the variable), removed by it.
_EXPORT_CACHE: list[str] = []


def pytest_configure(config):
    if "TINYT_EXPORT_CACHE" not in os.environ and not os.environ.get("PYTEST_XDIST_WORKER"):
        import tempfile
        _EXPORT_CACHE.append(tempfile.mkdtemp(prefix="tinyt-export-cache-"))
        os.environ["TINYT_EXPORT_CACHE"] = _EXPORT_CACHE[0]


def pytest_unconfigure(config):
    if _EXPORT_CACHE:
        import shutil
        shutil.rmtree(_EXPORT_CACHE.pop(), ignore_errors=True)
        del os.environ["TINYT_EXPORT_CACHE"]


def pytest_terminal_summary(terminalreporter):
    from tinyt.export.export_cache import saved_seconds
    if os.environ.get("TINYT_EXPORT_CACHE"):
        hits, misses, saved = saved_seconds(os.environ["TINYT_EXPORT_CACHE"])
        terminalreporter.write_line(f"export cache: {hits} exports read back, {misses} traced, "
                                    f"{saved:.0f} s of tracing saved")
    """The README test's slowest commands (its record_property, which pytest-xdist carries
    back from the worker): where its time goes, in CI's output too."""
    for report in (r for key in ("passed", "failed") for r in terminalreporter.stats.get(key, [])
                   if getattr(r, "when", None) == "call"):
        costs = dict(report.user_properties).get("command_seconds")
        if costs:
            terminalreporter.write_sep("=", "the README test's costliest commands (CPU-s)")
            for seconds, cpu, command in sorted(costs, key=lambda c: -c[1])[:25]:
                terminalreporter.write_line(f"{cpu:7.1f} CPU-s {seconds:7.1f} s  {command[:100]}")
            terminalreporter.write_line(f"{sum(c[1] for c in costs):7.1f} CPU-s in all, over "
                                        f"{len(costs)} commands")


def _cpu_used() -> float:
    import resource
    return sum(r.ru_utime + r.ru_stime for r in (
        resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item._cpu_start = _cpu_used()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each test's CPU seconds, its fixtures' and the processes it waited for included, as its
    teardown report's `cpu_seconds` property (in --junitxml's output): what a test costs,
    whatever the load beside it (wall seconds on a busy machine say little of an idle one's)."""
    outcome = yield
    if call.when == "teardown" and hasattr(item, "_cpu_start"):
        outcome.get_result().user_properties.append(
            ("cpu_seconds", round(_cpu_used() - item._cpu_start, 2)))


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


TINY_MODEL = dict(block_size=32, vocab_size=300, n_layer=2, n_head=2, n_embd=32)
TINY_TRAIN = dict(max_steps=8, batch_size=8, warmup_steps=2, eval_interval=4, eval_batches=2,
                  learning_rate=3e-3, min_lr=3e-4)


def assert_close(a, b, tol: float, what: str) -> float:
    """The one way tests compare outputs (torch tensors or numpy arrays): shape, then dtype,
    then the worst absolute difference against `tol`; returns that difference."""
    assert tuple(a.shape) == tuple(b.shape), f"{what}: shape {tuple(a.shape)} != {tuple(b.shape)}"
    assert a.dtype == b.dtype, f"{what}: dtype {a.dtype} != {b.dtype}"
    x, y = (np.asarray(t.detach().cpu() if hasattr(t, "detach") else t, dtype=np.float64)
            for t in (a, b))
    worst = float(np.abs(x - y).max(initial=0.0))  # NaN fails the check below
    assert worst <= tol, f"{what}: max abs diff {worst:.3g} > {tol}"
    return worst


def run_tinyt(*args) -> subprocess.CompletedProcess:
    """Run the CLI as a user does, in a subprocess (`python -m tinyt ...`)."""
    return subprocess.run([sys.executable, "-m", "tinyt", *map(str, args)], capture_output=True,
                          text=True, timeout=300)


def _python_like(rng: random.Random, i: int) -> str:
    names = ["alpha", "beta", "gamma", "delta", "value", "items", "count", "result"]
    lines = [f'"""Module {i}: synthetic source for tests."""', "import os", ""]
    for j in range(rng.randint(6, 12)):
        a, b = rng.sample(names, 2)
        lines += [f"def {a}_{j}({b}, n={j}):", f"    {a} = {b} * n + {rng.randint(0, 99)}",
                  "    for k in range(n):", f"        {a} += k  # accumulate",
                  f"    return {a}", ""]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory) -> Path:
    """40 small Python-like files: a corpus that trains a tokenizer in well under a second."""
    root = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    for i in range(40):
        (root / f"mod_{i:02d}.py").write_text(_python_like(rng, i), encoding="utf-8")
    return root


@pytest.fixture(scope="session")
def labelled_dir(tmp_path_factory) -> Path:
    """A classification set: two labels whose snippets differ in vocabulary."""
    root = tmp_path_factory.mktemp("labelled")
    rng = random.Random(1)
    for label, word in (("maths", "sum"), ("strings", "join")):
        (root / label).mkdir()
        for i in range(12):
            body = "".join(f"x{j} = {word}({word}_{rng.randint(0, 9)}, {j})\n" for j in range(40))
            (root / label / f"f{i}.py").write_text(body, encoding="utf-8")
    return root


@pytest.fixture()
def tiny_cfgs() -> tuple[ModelConfig, TrainConfig]:
    return ModelConfig(**TINY_MODEL), TrainConfig(**TINY_TRAIN)


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory, corpus_dir) -> Path:
    """A tiny causal-LM checkpoint trained on the synthetic corpus (read-only for tests)."""
    from tinyt.train import train

    out = tmp_path_factory.mktemp("ckpt") / "lm"
    train(ModelConfig(**TINY_MODEL), TrainConfig(**TINY_TRAIN), out, data=str(corpus_dir),
          log=lambda s: None)
    return out


@pytest.fixture(scope="session")
def lm_onnx(tiny_ckpt, tmp_path_factory) -> Path:
    """The tiny checkpoint exported as a KV-cache decoder (read-only for tests)."""
    from tinyt.export import export_onnx

    return export_onnx(tiny_ckpt, tmp_path_factory.mktemp("onnx") / "lm")


@pytest.fixture(scope="session")
def tiny_clf(tmp_path_factory, labelled_dir) -> Path:
    """A tiny classifier checkpoint (read-only for tests)."""
    from tinyt.train import train

    return train(ModelConfig(block_size=32, vocab_size=300, n_layer=1, n_head=2, n_embd=32,
                             task="classifier", num_labels=2),
                 TrainConfig(max_steps=3, batch_size=4, warmup_steps=1, eval_interval=3),
                 tmp_path_factory.mktemp("clf") / "clf", data=str(labelled_dir),
                 log=lambda s: None)


@pytest.fixture(scope="session")
def small_whisper(tmp_path_factory) -> dict[str, Path]:
    """tests/whisper_fixtures.SMALL exported and quantized at 8 and 4 bits (read-only for tests:
    the speech page's and package's; ~25 s on one core). Needs espeak-ng (the quantize stage's
    speech report), skipped without it."""
    import shutil

    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (scripts/setup.sh)")
    from whisper_fixtures import exported_whisper

    return exported_whisper(tmp_path_factory.mktemp("whisper"), quantized=(8, 4))
