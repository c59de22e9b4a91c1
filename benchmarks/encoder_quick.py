"""The pipeline's quick timing of an encoder's artifacts (tinyt against the peers on the same
weights is benchmarks/peers/encoders.py): through tinyt.runtime, tokenization included,

    texts per second: THROUGHPUT[0] texts of THROUGHPUT[1] tokens in one batch
    latency: one text of LATENCY_TOKENS tokens
    rounds interleaved across the artifacts (A, B, C, A, B, C, ...), after one untimed call
    each; medians ──▶ OUT/encoder.json

Lengths are capped by the model's cut. Threads: the runtime's default (the physical cores).
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

from tinyt.fsutil import write_json

THROUGHPUT = (32, 128)  # the peer benchmark's batch (benchmarks/peers/encoders.py)
LATENCY_TOKENS = 16
ROUNDS = 5


def run(root: Path, dirs: list[str], out: Path, *, rounds: int = ROUNDS,
        threads: int | None = None) -> dict:
    """Time the encoder artifacts root/dir for each of `dirs`; writes and returns the rows."""
    import tinyt.runtime as rt

    from .peers.encoders import texts_of

    encoders = {d: rt.load(root / d, threads=threads) for d in dirs}
    first = encoders[dirs[0]]
    batch_n, tokens = THROUGHPUT[0], min(THROUGHPUT[1], first.max_length)
    batch = texts_of(root / dirs[0] / "tokenizer.json", tokens, batch_n)
    one = texts_of(root / dirs[0] / "tokenizer.json", min(LATENCY_TOKENS, tokens), 1)
    times: dict[str, dict[str, list[float]]] = {d: {"batch": [], "one": []} for d in dirs}
    for enc in encoders.values():
        enc.embed(batch, batch_size=batch_n)
        enc.embed(one)
    for _ in range(rounds):
        for d, enc in encoders.items():
            for name, texts in (("batch", batch), ("one", one)):
                t = time.perf_counter()
                enc.embed(texts, batch_size=batch_n)
                times[d][name].append(time.perf_counter() - t)
    rows = [{"variant": d, "texts_per_s": batch_n / statistics.median(t["batch"]),
             "one_text_ms": 1e3 * statistics.median(t["one"])} for d, t in times.items()]
    result = {"batch": batch_n, "tokens": tokens, "latency_tokens": min(LATENCY_TOKENS, tokens),
              "rounds": rounds, "threads": threads, "rows": rows, "raw_s": times}
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "encoder.json", result)
    return result
