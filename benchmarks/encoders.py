"""tinyt's encoder artifacts against the engines a user would pick instead, on the same
sentence-transformers directory (issue 31, "Against the peers").

    ST_DIR (default: random weights at all-MiniLM-L6-v2's shape, or --shape bge-small)
      │ --train STEPS: first a short SimCSE run (benchmarks/encoder_weights.py) ─▶ ST_DIR-trained
      ├─tinyt.hf.import_hf─▶ ckpt ──export──▶ onnx ──optimize──▶ opt ──quantize──▶ int8
      ├─Optimum (export=True, save_pretrained)─▶ optimum/   (run by Optimum and by fastembed)
      └─sentence-transformers loads ST_DIR itself (torch; backend="onnx" exports through Optimum)
    one worker process per (engine, threads), started one after another, each loading once:
      1. same embeddings first: the 220 texts of tinyt's retrieval set (export/retrieval_set.py),
         against transformers' hidden states pooled as sentence-transformers pools them; an fp32
         engine below EXACT_COSINE is refused before anything is timed; INT8 reports its cosine
         and recall@10
      2. then time, rounds interleaved across the live workers (engine A round 1, B round 1,
         ...): texts per second at a batch of 32 texts of 128 tokens, and the latency of one
         16-token text; each call `settle` untimed then `block` timed, a rest between workers
    ──▶ results.json (environment, every raw time), results.md; times as ratios to tinyt's
        fastest artifact at the same thread count

    .venv/bin/python -m benchmarks.encoders --out benchmarks/results/encoders-minilm --rounds 10
    .venv/bin/python -m benchmarks.encoders --shape bge-small --out benchmarks/results/encoders-bge
    .venv/bin/python -m benchmarks.encoders --train 30 --rounds 0 --engine tinyt-int8 --out OUT

Random weights crowd every text near one direction, so INT8's recall@10 there measures near-ties
of the init; --train gives the weights a trained model's spread first (a few minutes on 2
cores), from the same seeded init, and the rest runs unchanged on the trained directory.

Peers run with .venv-encoder-peers' python where it exists (bash scripts/setup-encoder-peers.sh;
sentence-transformers and fastembed stay out of .venv), else with this one; a peer whose
package is absent is reported as not installed, with how to install it. Every worker runs
offline (HF_HUB_OFFLINE) with its thread count given to the engine's own setting (torch
set_num_threads, ONNX Runtime intra_op_num_threads, fastembed threads) and to OMP, MKL and
the tokenizers' rayon pool. Timings include each engine's own tokenization: texts in,
embeddings out. A worker runs this file as a script, so at module level it imports only the
standard library and numpy.
"""
from __future__ import annotations

import argparse
import importlib.metadata as md
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

try:  # the parent runs in tinyt's venv; a peer's worker where tinyt is not installed
    from tinyt.errors import BenchError
except ImportError:
    BenchError = RuntimeError  # type: ignore[misc,assignment]

REPO = Path(__file__).resolve().parent.parent
PEER_VENV = REPO / ".venv-encoder-peers"
SETUP = "bash scripts/setup-encoder-peers.sh"
EXACT_COSINE = 0.9999  # an fp32 engine's worst text against the reference, at least
CHECK_BATCH = 32  # texts per call of the same-embeddings check
REST_S = 0.05  # between two workers' blocks: idle worker threads stop spinning
VERSIONS = ("tinyt", "onnxruntime", "torch", "transformers", "tokenizers",
            "sentence-transformers", "optimum", "optimum-onnx", "fastembed", "numpy")
# Random-weight directories at the real models' shapes: (BertConfig keys, pooling,
# max_seq_length). The vocabulary is BERT's 30,522 ids (tests/hf_fixtures.py's WordPiece).
SHAPES = {
    "minilm": (dict(num_hidden_layers=6, hidden_size=384, num_attention_heads=12,
                    intermediate_size=1536), "mean", 256),  # sentence-transformers/all-MiniLM-L6-v2
    "bge-small": (dict(num_hidden_layers=12, hidden_size=384, num_attention_heads=12,
                       intermediate_size=1536), "cls", 512),  # BAAI/bge-small-en-v1.5
    "test": (dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                  intermediate_size=64), "mean", 256),  # seconds: a docs check's run
}
POOLING_MODES = {"mean_tokens": "mean", "cls_token": "cls", "lasttoken": "last"}


@dataclass(frozen=True)
class Engine:
    name: str
    about: str  # what it runs
    loader: str  # a key of LOADERS: how its worker loads it
    model: str  # the directory it loads: "st" (ST_DIR) or one made here (onnx, opt, int8, optimum)
    packages: tuple[str, ...]  # what it imports; one absent: "not installed"
    install: str  # how that gets here
    ours: bool = False  # tinyt's own artifact
    exact: bool = True  # fp32: its embeddings must equal the reference's (EXACT_COSINE)
    options: dict = field(default_factory=dict)  # for the loader (a test's wrong pooling)


def _ours(name: str, model: str, about: str, exact: bool = True) -> Engine:
    return Engine(name, about, "tinyt", model, ("tinyt.runtime",), "bash scripts/setup.sh",
                  ours=True, exact=exact)


_PIP_ST = f"pip install sentence-transformers (or {SETUP})"
_PIP_OPTIMUM = f"pip install 'optimum[onnxruntime]' (or {SETUP})"
ENGINES: dict[str, Engine] = {e.name: e for e in (
    _ours("tinyt-fp32", "onnx", "tinyt.runtime on the fp32 export"),
    _ours("tinyt-opt", "opt", "tinyt.runtime on the optimized export"),
    _ours("tinyt-int8", "int8", "tinyt.runtime on the dynamic INT8 artifact", exact=False),
    Engine("st-torch", "sentence-transformers, PyTorch on CPU", "st_torch", "st",
           ("sentence_transformers", "torch"), _PIP_ST),
    Engine("st-onnx", "sentence-transformers' ONNX backend (it exports through Optimum at load)",
           "st_onnx", "st", ("sentence_transformers", "optimum.onnxruntime"),
           f"pip install 'sentence-transformers[onnx]' (or {SETUP})"),
    Engine("optimum", "Optimum's ORTModelForFeatureExtraction on its own export, pooled in "
           "numpy", "optimum", "optimum", ("optimum.onnxruntime", "transformers"), _PIP_OPTIMUM),
    Engine("fastembed", "fastembed on Optimum's export (add_custom_model, specific_model_path)",
           "fastembed", "optimum", ("fastembed",), f"pip install fastembed (or {SETUP})"),
)}


# --- the worker side: each loader imports its engine's package when called and returns
# embed(texts, batch_size) -> [n, dim] float32 -------------------------------------------------

def pool(h: np.ndarray, mask: np.ndarray, pooling: str, normalize: bool) -> np.ndarray:
    """Sentence embeddings [B, C] from hidden states [B, T, C] and the mask [B, T], as
    sentence-transformers' Pooling (mean clamped at 1e-9; right padding) and Normalize
    (F.normalize's eps of 1e-12) compute them."""
    m = mask[..., None].astype(h.dtype)
    if pooling == "mean":
        e = (h * m).sum(1) / np.maximum(m.sum(1), 1e-9)
    elif pooling == "cls":
        e = h[:, 0]
    elif pooling == "last":
        e = h[np.arange(len(h)), mask.sum(1) - 1]
    else:
        raise ValueError(f"pooling {pooling!r}: one of mean, cls, last")
    if normalize:
        e = e / np.maximum(np.linalg.norm(e, axis=-1, keepdims=True), 1e-12)
    return e.astype(np.float32)


def _ort_options(threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    return so


def _load_tinyt(path: Path, threads: int, **_) -> Callable:
    import tinyt.runtime as rt

    enc = rt.load(path, threads=threads)
    return lambda texts, bs: enc.embed(texts, batch_size=bs)


def _st_encode(model) -> Callable:
    return lambda texts, bs: model.encode(texts, batch_size=bs, convert_to_numpy=True,
                                          show_progress_bar=False)


def _load_st_torch(path: Path, threads: int, **_) -> Callable:
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(threads)
    return _st_encode(SentenceTransformer(str(path), device="cpu"))


def _load_st_onnx(path: Path, threads: int, **_) -> Callable:
    from sentence_transformers import SentenceTransformer

    return _st_encode(SentenceTransformer(str(path), device="cpu", backend="onnx", model_kwargs={
        "provider": "CPUExecutionProvider", "session_options": _ort_options(threads)}))


def _load_optimum(path: Path, threads: int, *, pooling: str, normalize: bool, max_length: int,
                  **_) -> Callable:
    from optimum.onnxruntime import ORTModelForFeatureExtraction
    from transformers import AutoTokenizer

    model = ORTModelForFeatureExtraction.from_pretrained(
        path, provider="CPUExecutionProvider", session_options=_ort_options(threads))
    tok = AutoTokenizer.from_pretrained(path)

    def embed(texts, bs):
        out = []
        for s in range(0, len(texts), bs):
            x = tok(texts[s:s + bs], padding=True, truncation=True, max_length=max_length,
                    return_tensors="np")
            out.append(pool(model(**x).last_hidden_state, x["attention_mask"], pooling,
                            normalize))
        return np.concatenate(out)
    return embed


def _load_fastembed(path: Path, threads: int, *, pooling: str, normalize: bool, dim: int,
                    **_) -> Callable:
    from fastembed import TextEmbedding
    from fastembed.common.model_description import ModelSource, PoolingType

    # A custom model's name and hub source only label it: specific_model_path loads the
    # directory as it is, nothing is downloaded (the worker runs with HF_HUB_OFFLINE).
    name = "tinyt-bench/local-encoder"
    TextEmbedding.add_custom_model(
        name, pooling={"mean": PoolingType.MEAN, "cls": PoolingType.CLS,
                       "last": PoolingType.LAST_TOKEN}[pooling],
        normalization=normalize, sources=ModelSource(hf=name), dim=dim, model_file="model.onnx")
    model = TextEmbedding(name, specific_model_path=str(path), threads=threads,
                          providers=["CPUExecutionProvider"])
    return lambda texts, bs: np.stack(list(model.embed(texts, batch_size=bs)))


LOADERS = {"tinyt": _load_tinyt, "st_torch": _load_st_torch, "st_onnx": _load_st_onnx,
           "optimum": _load_optimum, "fastembed": _load_fastembed}


def _missing(packages) -> str | None:
    for name in packages:
        try:
            if importlib.util.find_spec(name) is None:
                return name
        except ModuleNotFoundError:  # its parent package is absent
            return name
    return None


def _memory() -> dict:
    """This process's resident set and its peak (Linux VmRSS / VmHWM), in bytes."""
    try:
        lines = Path("/proc/self/status").read_text().splitlines()
    except OSError:
        return {}
    kb = {k: int(v.split()[0]) for k, v in (s.split(":", 1) for s in lines)
          if k in ("VmRSS", "VmHWM")}
    return {"rss": kb.get("VmRSS", 0) * 1024, "peak_rss": kb.get("VmHWM", 0) * 1024}


def worker(spec: dict) -> None:
    """Load one engine, then answer JSON lines on stdin until it closes:
    {"op": "embed", "texts", "batch_size", "path"} -> the embeddings saved to path (.npy);
    {"op": "time", "calls": [{"texts", "batch_size"}], "settle", "block"} -> seconds per call;
    {"op": "memory"}. The hello says ready, a missing package, or the load's error."""
    out, sys.stdout = sys.stdout, sys.stderr  # libraries' chatter must not reach the protocol
    missing = _missing(spec["packages"])
    hello: dict = {"missing": missing} if missing else {}
    if not missing:
        try:
            t = time.perf_counter()
            embed = LOADERS[spec["loader"]](Path(spec["path"]), spec["threads"],
                                            **spec["options"])
            hello = {"ready": True, "load_s": time.perf_counter() - t, "memory": _memory(),
                     "python": sys.executable, "versions": {
                         d: v for d in VERSIONS if (v := _version(d))}}
        except Exception as e:
            hello = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:300]}
            traceback.print_exc()
    out.write(json.dumps(hello) + "\n")
    out.flush()
    if "ready" not in hello:
        return
    for line in sys.stdin:
        req = json.loads(line)
        try:
            if req["op"] == "embed":
                np.save(req["path"], np.asarray(embed(req["texts"], req["batch_size"]),
                                                dtype=np.float32))
                reply: dict = {"saved": req["path"]}
            elif req["op"] == "time":
                reply = {"times": [_time_call(embed, c, req["settle"], req["block"])
                                   for c in req["calls"]]}
            else:
                reply = {"memory": _memory()}
        except Exception as e:
            reply = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
        out.write(json.dumps(reply) + "\n")
        out.flush()


def _time_call(embed, call: dict, settle: int, block: int) -> list[float]:
    for _ in range(settle):
        embed(call["texts"], call["batch_size"])
    times = []
    for _ in range(block):
        t = time.perf_counter()
        embed(call["texts"], call["batch_size"])
        times.append(time.perf_counter() - t)
    return times


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def export_optimum(spec: dict) -> None:
    """Optimum's own export of ST_DIR's Transformer (export=True, then save_pretrained), with
    its tokenizer cut at max_seq_length as sentence-transformers cuts (fastembed reads the cut
    from tokenizer_config.json). Prints {"missing": package} where Optimum is absent."""
    missing = _missing(("optimum.onnxruntime", "transformers"))
    if missing:
        print(json.dumps({"missing": missing}))
        return
    from optimum.onnxruntime import ORTModelForFeatureExtraction
    from transformers import AutoTokenizer

    ORTModelForFeatureExtraction.from_pretrained(spec["source"], export=True) \
        .save_pretrained(spec["out"])
    AutoTokenizer.from_pretrained(spec["source"], model_max_length=spec["max_length"]) \
        .save_pretrained(spec["out"])
    print(json.dumps({"saved": spec["out"]}))


# --- the parent: prepare, check, time, report -----------------------------------------------

class Worker:
    """The parent's handle on one engine's worker process at one thread count."""

    def __init__(self, engine: Engine, path: Path, threads: int, python: str, options: dict,
                 log: Path):
        self.engine, self.threads = engine, threads
        self.label = f"{engine.name}@{threads}t"
        n = str(threads)
        env = {**os.environ, "OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n,
               "RAYON_NUM_THREADS": n, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "PYTHONUNBUFFERED": "1"}
        spec = {"loader": engine.loader, "path": str(path), "threads": threads,
                "packages": list(engine.packages), "options": options}
        self.log = log
        with open(log, "w") as err:
            self.proc = subprocess.Popen([python, str(Path(__file__).resolve()), "--worker",
                                          json.dumps(spec)], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        self.hello = self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            tail = self.log.read_text(errors="replace").strip().splitlines()[-1:]
            return {"error": f"worker exited with status {self.proc.wait()}: {' '.join(tail)}"}
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


def peer_python() -> str:
    """The python that runs the peers: .venv-encoder-peers' where it exists, else this one."""
    p = PEER_VENV / "bin" / "python"
    return str(p) if p.exists() else sys.executable


def st_settings(st_dir: Path) -> dict:
    """What a sentence-transformers directory says about its embeddings: the Transformer's
    folder, pooling, Normalize, max_seq_length, width (read here, not through tinyt's import)."""
    modules = {m["type"].rsplit(".", 1)[-1]: m for m in _json(st_dir / "modules.json")}
    if "Transformer" not in modules or "Pooling" not in modules:
        raise BenchError(f"{st_dir}: modules {list(modules)}; the benchmark needs a Transformer "
                         "and a Pooling")
    cfg = _json(st_dir / modules["Pooling"].get("path", "1_Pooling") / "config.json")
    modes = [k.removeprefix("pooling_mode_") for k, v in cfg.items()
             if k.startswith("pooling_mode_") and v is True]
    if len(modes) != 1 or modes[0] not in POOLING_MODES:
        raise BenchError(f"{st_dir}: pooling {modes}; the benchmark runs one of "
                         f"{list(POOLING_MODES)}")
    transformer = st_dir / modules["Transformer"].get("path", "")
    sbc = transformer / "sentence_bert_config.json"
    hf = _json(transformer / "config.json")
    return {"transformer": str(transformer), "pooling": POOLING_MODES[modes[0]],
            "normalize": "Normalize" in modules, "dim": hf["hidden_size"],
            "max_length": _json(sbc).get("max_seq_length") if sbc.is_file() else None,
            "layers": hf.get("num_hidden_layers"), "heads": hf.get("num_attention_heads"),
            "vocab": hf.get("vocab_size")}


def _json(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


def build_st(out: Path, shape: str) -> Path:
    """A sentence-transformers directory of random weights at `shape`: tests/hf_fixtures.py's
    layout and WordPiece tokenizer, and transformers' own initialization (N(0, 0.02), norm
    gains 1), the scale of real weights, seeded. (With the fixture's N(0, 0.2), which keeps a
    tiny model's hidden states lively, tinyt's optimize check saw 1.7e-4 between the graphs at
    the MiniLM shape and 261 tokens, over its 1e-4, on hidden states of rms 1.)"""
    import torch

    sys.path.insert(0, str(REPO / "tests"))
    from hf_fixtures import save_encoder

    overrides, pooling, max_seq_length = SHAPES[shape]
    model = save_encoder("bert", out, pooling=pooling, max_seq_length=max_seq_length,
                         **overrides)
    torch.manual_seed(0)
    type(model)(model.config).save_pretrained(out, safe_serialization=True)
    return out


def reference(settings: dict, texts: list[str]) -> np.ndarray:
    """transformers' hidden states, pooled and normalized as sentence-transformers does [n, C]."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(settings["transformer"])
    model = AutoModel.from_pretrained(settings["transformer"]).eval()
    out = []
    with torch.no_grad():
        for s in range(0, len(texts), CHECK_BATCH):
            x = tok(texts[s:s + CHECK_BATCH], padding=True, truncation=True,
                    max_length=settings["max_length"], return_tensors="pt")
            h = model(**x).last_hidden_state.numpy()
            out.append(pool(h, x["attention_mask"].numpy(), settings["pooling"],
                            settings["normalize"]))
    return np.concatenate(out)


def texts_of(tokenizer_json: Path, tokens: int, count: int) -> list[str]:
    """`count` different texts of exactly `tokens` tokens each, special tokens included: words
    of the retrieval set's passages while they fit, then " ." (one token) to the length."""
    from tokenizers import Tokenizer

    from tinyt.export.retrieval_set import PASSAGES

    tok = Tokenizer.from_file(str(tokenizer_json))
    tok.no_truncation()
    tok.no_padding()
    words = " ".join(PASSAGES).split()
    out = []
    for i in range(count):
        text, n = "", len(tok.encode("").ids)
        for w in words[(i * 97) % len(words):] + words:
            k = len(tok.encode(f"{text} {w}".strip()).ids)
            if k > tokens:
                break
            text, n = f"{text} {w}".strip(), k
        text += " ." * (tokens - n)
        if len(tok.encode(text).ids) != tokens:
            raise BenchError(f"{tokenizer_json}: could not make a text of {tokens} tokens")
        out.append(text)
    return out


def prepare(st_dir: Path, work: Path, engines: list[Engine], python: str, settings: dict,
            skipped: dict, log=print) -> dict[str, Path]:
    """The directories the engines load: ST_DIR, tinyt's artifacts (each stage from the one
    before) and Optimum's export, made once here."""
    paths = {"st": st_dir}
    need = {e.model for e in engines if e.ours}  # each stage made from the one before
    if need:
        from tinyt.export import export_onnx
        from tinyt.export.optimize import optimize
        from tinyt.export.quantize import quantize
        from tinyt.hf import import_hf

        log(f"tinyt: import, export{', optimize' if need - {'onnx'} else ''}"
            f"{', quantize' if 'int8' in need else ''}")
        import_hf(st_dir, work / "ckpt")
        paths["onnx"] = export_onnx(work / "ckpt", work / "onnx")
        if need - {"onnx"}:
            paths["opt"] = optimize(paths["onnx"], work / "opt")
        if "int8" in need:
            paths["int8"] = quantize(paths["opt"], work / "int8")
    users = [e for e in engines if e.model == "optimum"]
    if users:
        log("Optimum: export=True")
        spec = {"source": settings["transformer"], "out": str(work / "optimum"),
                "max_length": settings["max_length"] or 512}
        proc = subprocess.run([python, str(Path(__file__).resolve()), "--export-optimum",
                               json.dumps(spec)], capture_output=True, text=True,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"})
        said = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else {}
        for e in users:
            if said.get("missing"):
                skipped[e.name] = (f"not installed in {python}: {_PIP_OPTIMUM}" if e.loader ==
                                   "optimum" else f"needs Optimum's export ({_PIP_OPTIMUM})")
            elif "saved" not in said:
                skipped[e.name] = "Optimum's export failed: " + " ".join(
                    proc.stderr.strip().splitlines()[-1:])
        paths["optimum"] = work / "optimum"
    return paths


def check(w: Worker, texts: list[str], ref: np.ndarray, queries: int, tmp: Path) -> dict:
    """The worker's embeddings of `texts` against the reference's: cosine per text (min, mean),
    recall@10 of the passages' ranking for each query, and whether it matches."""
    from tinyt.export.accuracy import RECALL_K, cosines, recall_at_k, top_k

    path = tmp / f"{w.label}.npy"
    w.ask(op="embed", texts=texts, batch_size=CHECK_BATCH, path=str(path))
    got = np.load(path)
    if got.shape != ref.shape:
        return {"shape": list(got.shape), "reference_shape": list(ref.shape),
                "must_match": w.engine.exact, "matches": False}
    cos = cosines(ref, got)
    recall = recall_at_k(top_k(ref[:queries], ref[queries:], RECALL_K),
                         top_k(got[:queries], got[queries:], RECALL_K))
    return {"cosine_min": float(cos.min()), "cosine_mean": float(cos.mean()),
            f"recall_at_{RECALL_K}": int(recall.sum()) / (RECALL_K * queries),
            f"recall_at_{RECALL_K}_worst_query": int(recall.min()) / RECALL_K,
            "must_match": w.engine.exact,
            "matches": bool(cos.min() >= EXACT_COSINE) if w.engine.exact else None}


def run(st_dir: Path | None, out: Path, *, shape: str = "minilm", threads: list[int] | None = None,
        rounds: int = 8, block: int = 3, settle: int = 1,
        engines: list[str | Engine] | None = None, python: str | None = None,
        throughput: tuple[int, int] = (32, 128), latency_tokens: int = 16,
        work: Path | None = None, train_steps: int = 0, log=print) -> dict:
    """Check, then time every engine on one sentence-transformers directory (built at `shape`
    with random weights where st_dir is None; SimCSE-trained for `train_steps` steps first
    where that is above 0: benchmarks/encoder_weights.py); write results.json and results.md.
    Engines are names of ENGINES or rows; `python` runs the peers (default: peer_python())."""
    from tinyt.benchmarks.environment import environment
    from tinyt.export.retrieval_set import PASSAGES, QUERIES
    from tinyt.hardware import available_memory

    unknown = [e for e in engines or [] if isinstance(e, str) and e not in ENGINES]
    if unknown:
        raise BenchError(f"unknown engine(s) {unknown}; known: {', '.join(ENGINES)}")
    rows = [e if isinstance(e, Engine) else ENGINES[e] for e in engines or list(ENGINES)]
    threads = threads or [1, 2]
    problems = [text for ok, text in (
        (isinstance(rounds, int) and rounds >= 0, f"rounds={rounds!r}: an integer >= 0 (0: "
                                                  "the check only)"),
        (isinstance(settle, int) and settle >= 0, f"settle={settle!r}: an integer >= 0"),
        (isinstance(block, int) and block >= 1, f"block={block!r}: an integer >= 1"),
        (isinstance(train_steps, int) and train_steps >= 0,
         f"train_steps={train_steps!r}: an integer >= 0 (0: the weights as they are)"),
        (all(isinstance(n, int) and n >= 1 for n in threads), f"threads={threads}: each >= 1"),
        (shape in SHAPES, f"shape={shape!r}: one of {', '.join(SHAPES)}")) if not ok]
    if problems:
        raise BenchError("; ".join(problems))
    python = python or peer_python()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(work or tmp)
        for sub in ("logs", "check"):
            (work / sub).mkdir(parents=True, exist_ok=True)
        source = str(st_dir) if st_dir else f"random weights at the {shape} shape"
        if st_dir is None:
            log(f"building a sentence-transformers directory of {source}")
            st_dir = build_st(work / "st", shape)
        settings = st_settings(Path(st_dir))
        weights = None
        if train_steps:
            from tinyt.benchmarks.encoder_weights import train

            log(f"SimCSE: {train_steps} steps on {source}")
            weights = train(Path(st_dir), work / "st-trained", pooling=settings["pooling"],
                            transformer=str(Path(settings["transformer"]).relative_to(st_dir)),
                            steps=train_steps, log=log)
            st_dir, source = work / "st-trained", f"{source}, SimCSE-trained {train_steps} steps"
            settings = st_settings(st_dir)
        skipped: dict[str, str] = {}
        paths = prepare(Path(st_dir), work, rows, python, settings, skipped, log)
        texts = [*QUERIES, *PASSAGES]
        ref = reference(settings, texts)
        tokenizer = Path(settings["transformer"]) / "tokenizer.json"
        calls = [{"texts": texts_of(tokenizer, throughput[1], throughput[0]),
                  "batch_size": throughput[0]},
                 {"texts": texts_of(tokenizer, latency_tokens, 1), "batch_size": 1}]
        workers, accuracy, refused, loads = [], {}, {}, {}
        try:
            for e in rows:  # one worker at a time: loaded and checked before the next starts
                for n in threads:
                    if e.name in skipped:
                        break
                    free = available_memory()
                    if free is not None and free < 2 << 30:
                        skipped[f"{e.name}@{n}t"] = f"not started: {free >> 20} MiB available"
                        continue
                    w = Worker(e, paths[e.model], n, sys.executable if e.ours else python,
                               {**settings, **e.options}, work / "logs" / f"{e.name}@{n}t.log")
                    if "ready" not in w.hello:
                        skipped[e.name if w.hello.get("missing") else w.label] = (
                            f"not installed in {w.proc.args[0]} (no {w.hello['missing']}): "
                            f"{e.install}" if w.hello.get("missing") else w.hello["error"])
                        w.close()
                        continue
                    log(f"{w.label}: loaded in {w.hello['load_s']:.1f} s; checking")
                    loads[w.label] = {k: w.hello[k] for k in ("load_s", "memory", "python",
                                                              "versions")}
                    try:
                        accuracy[w.label] = check(w, texts, ref, len(QUERIES), work / "check")
                    except RuntimeError as err:  # it cannot embed these texts
                        skipped[w.label] = f"failed the check: {' '.join(str(err).split())[:300]}"
                        w.close()
                        continue
                    if accuracy[w.label]["matches"] is False:
                        refused[w.label] = accuracy[w.label]
                        w.close()
                        continue
                    workers.append(w)
            raw = _time(workers, calls, rounds, settle, block, log)
            for w in workers:
                loads[w.label]["memory_after"] = w.ask(op="memory")["memory"]
        finally:
            for w in workers:
                w.close()
    result = {
        "model": {k: v for k, v in settings.items() if k != "transformer"},
        "st_dir": source, "training": weights,
        "environment": environment(VERSIONS, peer_python=python),
        "method": {"threads": threads, "rounds": rounds, "block": block, "settle": settle,
                   "throughput": {"batch": throughput[0], "tokens": throughput[1]},
                   "latency": {"batch": 1, "tokens": latency_tokens},
                   "check_texts": len(texts), "exact_cosine": EXACT_COSINE},
        "engines": {e.name: e.about for e in rows}, "skipped": skipped, "refused": refused,
        "accuracy": accuracy, "workers": loads, "raw_s": raw,
        "rows": _rows(raw, rows, throughput[0])}
    (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "results.md").write_text(markdown(result))
    return result


def _time(workers: list[Worker], calls: list[dict], rounds: int, settle: int, block: int,
          log) -> dict[str, list[list[float]]]:
    """Seconds per call per worker, rounds interleaved (each round starting one worker on)."""
    raw: dict[str, list[list[float]]] = {w.label: [[] for _ in calls] for w in workers}
    for r in range(rounds if workers else 0):
        log(f"round {r + 1}/{rounds}")
        for w in workers[r % len(workers):] + workers[:r % len(workers)]:
            for i, ts in enumerate(w.ask(op="time", calls=calls, settle=settle,
                                         block=block)["times"]):
                raw[w.label][i] += ts
            time.sleep(REST_S)
    return {k: v for k, v in raw.items() if rounds}


def _rows(raw: dict, engines: list[Engine], batch: int) -> dict[str, dict]:
    """Per worker: texts/s at the batch, ms for one text, and both as times over the fastest
    tinyt artifact's at the same thread count (above 1: slower than tinyt)."""
    ours = {e.name for e in engines if e.ours}
    rows = {label: {"texts_per_s": batch / statistics.median(t[0]),
                    "latency_ms": 1e3 * statistics.median(t[1])} for label, t in raw.items()}
    for label, row in rows.items():
        n = label.rsplit("@", 1)[1]
        mine = {k: v for k, v in rows.items() if k.endswith(f"@{n}") and k.split("@")[0] in ours}
        if not mine:
            continue
        fast = max(mine, key=lambda k: mine[k]["texts_per_s"])
        quick = min(mine, key=lambda k: mine[k]["latency_ms"])
        row.update(batch_vs_tinyt=mine[fast]["texts_per_s"] / row["texts_per_s"],
                   batch_tinyt=fast.split("@")[0],
                   latency_vs_tinyt=row["latency_ms"] / mine[quick]["latency_ms"],
                   latency_tinyt=quick.split("@")[0])
    return rows


def markdown(result: dict) -> str:
    """results.md: the model, machine, method, times with ratios, the check, what was skipped."""
    m, env, cfg = result["method"], result["environment"], result["model"]
    tp, lat = m["throughput"], m["latency"]
    flags = [k for k, v in env["cpu"].items() if v is True]
    vers = ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v)
    lines = [f"# Encoders: tinyt vs peers on one sentence-transformers directory "
             f"({cfg['layers']} layers, width {cfg['dim']}, {cfg['heads']} heads, vocab "
             f"{cfg['vocab']}, {cfg['pooling']} pooling{', Normalize' if cfg['normalize'] else ''}"
             f", max_seq_length {cfg['max_length']})", "", f"Weights: {result['st_dir']}"
             + _training(result.get("training")), "",
             f"{env['cpu'].get('model')}; CPU flags: {', '.join(flags)}; {env['physical_cores']} "
             f"physical cores; parent: {vers}; peers' python: {env['peer_python']}; "
             f"{env['time']}", "",
             f"Each engine in its own process per thread count, texts in and embeddings out (its "
             f"own tokenization included). Median of {m['rounds']} interleaved rounds × "
             f"{m['block']} calls (after {m['settle']} untimed). × tinyt: the engine's time over "
             "the fastest tinyt artifact's at the same thread count (named in brackets); above "
             "1 is slower than tinyt.", ""]
    if not result["rows"]:
        lines[-2:] = ["Nothing timed (--rounds 0, or no engine passed the check)."]
    else:
        lines += [f"| engine | threads | texts/s ({tp['batch']} × {tp['tokens']} tokens) | "
                  f"× tinyt | ms ({lat['batch']} × {lat['tokens']} tokens) | × tinyt |",
                  "|---|---|---|---|---|---|"]
    for label, r in sorted(result["rows"].items(), key=lambda kv: (
            int(kv[0].rsplit("@", 1)[1][:-1]), -kv[1]["texts_per_s"])):
        name, n = label.rsplit("@", 1)
        lines.append(f"| {name} | {n[:-1]} | {r['texts_per_s']:.1f} | "
                     f"{_ratio(r, 'batch')} | {r['latency_ms']:.2f} | {_ratio(r, 'latency')} |")
    lines += ["", f"Same embeddings first: {m['check_texts']} texts (tinyt's retrieval set), "
              "against transformers' hidden states pooled as sentence-transformers pools them; "
              f"an fp32 engine must reach cosine {m['exact_cosine']} on every text, INT8 reports "
              "(recall@10: the reference's 10 best passages per query among the engine's 10 "
              "best).", "", "| engine | threads | cosine min | cosine mean | recall@10 | "
              "must match | verdict |", "|---|---|---|---|---|---|---|"]
    for label, a in result["accuracy"].items():
        name, n = label.rsplit("@", 1)
        fig = (f"{a['cosine_min']:.6f} | {a['cosine_mean']:.6f} | {a['recall_at_10']:.3f}"
               if "cosine_min" in a else f"shape {a['shape']} | — | —")
        verdict = {True: "matches", False: "**refused**", None: "reported"}[a["matches"]]
        lines.append(f"| {name} | {n[:-1]} | {fig} | {a['must_match']} | {verdict} |")
    lines += ["", "Each worker: its load, resident memory after it and the peak by the end (MB: "
              "10^6 bytes):", "", "| engine | threads | load s | RSS loaded MB | peak RSS MB |",
              "|---|---|---|---|---|"]
    for label, w in result["workers"].items():
        name, n = label.rsplit("@", 1)
        peak = w.get("memory_after", {}).get("peak_rss")
        lines.append(f"| {name} | {n[:-1]} | {w['load_s']:.1f} | "
                     f"{w['memory'].get('rss', 0) / 1e6:,.0f} | "
                     f"{'—' if peak is None else f'{peak / 1e6:,.0f}'} |")
    pythons = {w["python"]: w["versions"] for w in result["workers"].values()}
    lines += ["", "Engines:", ""]
    for name, about in result["engines"].items():
        ran = [w["python"] for k, w in result["workers"].items() if k.startswith(f"{name}@")]
        lines.append(f"- {name}: {about}" + (f" ({ran[0]})" if ran else ""))
    lines += ["", "Versions in each python:", ""] + [
        f"- {py}: " + ", ".join(f"{d} {v}" for d, v in vers.items())
        for py, vers in pythons.items()]
    if result["skipped"]:
        lines += ["", "Not run:", ""] + [f"- {k}: {v}" for k, v in result["skipped"].items()]
    if result["refused"]:
        lines += ["", f"Refused before timing (embeddings differ): {list(result['refused'])}"]
    return "\n".join(lines) + "\n"


def _training(t: dict | None) -> str:
    if not t:
        return "."
    loss = t["loss"]
    return (f" ({t['method']}; {t['texts']} texts: {t['text_source']}; batch {t['batch_size']}, "
            f"lr {t['lr']}, temperature {t['temperature']}, {t['max_tokens']} tokens, seed "
            f"{t['seed']}; loss {loss[0]:.3f} at the first step, {loss[-1]:.3f} at the last; "
            f"{t['seconds']:.0f} s on {t['threads']} threads, {t['cpu_seconds']:.0f} s of CPU).")


def _ratio(row: dict, measure: str) -> str:
    if f"{measure}_vs_tinyt" not in row:
        return "—"
    return f"{row[f'{measure}_vs_tinyt']:.2f} ({row[f'{measure}_tinyt']})"


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.encoders",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("st_dir", nargs="?", type=Path,
                    help="a sentence-transformers directory (default: random weights at --shape)")
    ap.add_argument("--shape", choices=list(SHAPES), default="minilm")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/encoders"))
    ap.add_argument("--rounds", type=int, default=8, help="0: the same-embeddings check only")
    ap.add_argument("--threads", type=int, action="append", help="repeat (default 1 and 2)")
    ap.add_argument("--engine", action="append", help=f"one of {', '.join(ENGINES)} (repeat)")
    ap.add_argument("--block", type=int, default=3, help="timed calls per call and round")
    ap.add_argument("--settle", type=int, default=1, help="untimed calls before them")
    ap.add_argument("--python", help="the peers' python (default: .venv-encoder-peers' if any)")
    ap.add_argument("--train", type=int, default=0, metavar="STEPS",
                    help="SimCSE-train the directory for STEPS steps first (default 0: as it is; "
                    "benchmarks/encoder_weights.py)")
    ap.add_argument("--keep", type=Path, help="make and keep the artifacts here (default: a "
                    "temporary folder)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--export-optimum", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(json.loads(args.worker))
    if args.export_optimum:
        return export_optimum(json.loads(args.export_optimum))
    try:
        run(args.st_dir, args.out, shape=args.shape, threads=args.threads, rounds=args.rounds,
            block=args.block, settle=args.settle, engines=args.engine, python=args.python,
            work=args.keep, train_steps=args.train)
    except (ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print((args.out / "results.md").read_text())


if __name__ == "__main__":
    if Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
        del sys.path[0]  # run as a worker's script: benchmarks/ must not shadow a package
    main()
