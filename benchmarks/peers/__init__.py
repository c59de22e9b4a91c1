"""tinyt against the engines a user would pick instead, on the same weights.

    ARTIFACTS/checkpoint ──tinyt.hf──▶ peers/hf (GPT-2, logits checked) ──CTranslate2──▶
        peers/ct2-int8, peers/ct2-float32
    one worker process per (engine, threads), each loading its model once and answering JSON
    lines on stdin:
      1. same computation first: greedy tokens of every engine on held-out prompts, compared
         with tinyt fp32's (fp32 engines must match exactly; INT8 ones report agreement)
      2. then time: rounds interleaved across the workers; in a round each worker runs, for
         every call, `settle` untimed calls and `block` timed ones, then rests (so no engine
         runs while another's worker threads still spin)
    decode ms/token = (t(prompt, N new) - t(prompt, 1 new)) / (N - 1)
    prefill ms      = t(L-token prompt, 1 new token), for L = 128 (or block_size - 1) and
                      block_size - 1
    ──▶ peers.json (environment, every raw time), peers.md, peers.png; ratios of tinyt to the
        fastest peer, the targets tinyt aims at

    .venv/bin/python -m benchmarks.peers artifacts --out benchmarks/results/peers-demo
    tinyt bench artifacts --peers --out benchmarks/results/peers-demo

Every engine is greedy with the end-of-text token suppressed, so each produces exactly the
tokens asked for. An engine whose package is absent is skipped with the reason.

    engines.py   the engines as rows (PeerEngine: how each loads, where its model lives, what
                 it must equal), decoders' and encoders' alike
    protocol.py  the worker process's JSON-lines protocol, both sides (every peer benchmark's)
    adapters.py  a loader per engine family: a greedy generator with next-token logits
    formats.py   the peers' own artifacts of the checkpoint, each by the peer's own tool
    prepare.py   skips with reasons; tinyt's on-demand variants and the conversions made
    worker.py    a decoder engine's worker
    analysis.py  agreement, KL, decode and prefill times, the memory floor, the targets
    report.py    peers.md and the plots
    measure.py   run(): all of it, side by side

The encoders' peers (sentence-transformers, Optimum, fastembed) on the same engine rows and
worker protocol, `python -m benchmarks.peers.encoders`:

    encoders.py          run(): the rows, the directories they load, the check, the times
    encoder_adapters.py  a loader per engine and the worker (a script: the peers' own python)
    encoder_weights.py   --train: a short SimCSE run, so INT8's recall measures more than the init
    encoder_report.py    results.md
    browser_encoders.py  tinyt's encoder page against transformers.js in one Chromium
                         (`python -m benchmarks.browser --encoder`)
"""
from .adapters import genai_greedy, genai_logits, llama_cpp_model
from .analysis import TARGETS, cache_bytes, floor_bytes, read_bandwidth, step_bytes, targets
from .engines import ENGINES, PIPELINE_ENGINES, REFERENCE, TINYT, TINYT_ROWS, PeerEngine, engine
from .formats import BUILDER_VENV, builder_python, llama_cpp_converter
from .measure import run
from .prepare import prepare
from .protocol import Worker
from .report import markdown
from .worker import start, worker

__all__ = ["BUILDER_VENV", "ENGINES", "PIPELINE_ENGINES", "REFERENCE", "TARGETS", "TINYT",
           "TINYT_ROWS", "PeerEngine", "Worker", "builder_python", "cache_bytes", "engine",
           "floor_bytes", "genai_greedy", "genai_logits", "llama_cpp_converter",
           "llama_cpp_model", "markdown", "prepare", "read_bandwidth", "run", "start",
           "step_bytes", "targets", "worker"]
