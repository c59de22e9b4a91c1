"""The encoder peers' worker side (the decoders' is adapters.py and worker.py): a loader per
engine, each importing its engine's package when called and returning
embed(texts, batch_size) -> [n, dim] float32, and the worker that serves it (protocol.py).

    python benchmarks/peers/encoder_adapters.py --worker SPEC           (encoders.py starts it)
    python benchmarks/peers/encoder_adapters.py --export-optimum SPEC   (Optimum's own export)

A peer's worker runs this file as a script with the peers' python (.venv-encoder-peers, where
tinyt is not installed), so at module level it imports only the standard library, numpy and
protocol.py beside it.
"""
from __future__ import annotations

import importlib.metadata as md
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

if __package__:
    from .protocol import memory, missing_package, serve, timed
else:  # a worker's script: protocol.py is beside this file (sys.path[0])
    from protocol import memory, missing_package, serve, timed  # type: ignore[no-redef]

VERSIONS = ("tinyt", "onnxruntime", "torch", "transformers", "tokenizers",
            "sentence-transformers", "optimum", "optimum-onnx", "fastembed", "numpy")


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


def worker(spec: dict) -> None:
    """Load one engine, then answer JSON lines on stdin until it closes:
    {"op": "embed", "texts", "batch_size", "path"} -> the embeddings saved to path (.npy);
    {"op": "time", "calls": [{"texts", "batch_size"}], "settle", "block"} -> seconds per call;
    {"op": "memory"}. The hello says ready, a missing package, or the load's error."""
    def load():
        missing = missing_package(spec["packages"])
        if missing:
            return {"missing": missing}, None
        t = time.perf_counter()
        embed = LOADERS[spec["loader"]](Path(spec["path"]), spec["threads"], **spec["options"])
        hello = {"ready": True, "load_s": time.perf_counter() - t, "memory": memory(),
                 "python": sys.executable,
                 "versions": {d: v for d in VERSIONS if (v := _version(d))}}
        return hello, lambda req: _answer(req, embed)
    serve(load)


def _answer(req: dict, embed: Callable) -> dict:
    if req["op"] == "embed":
        np.save(req["path"], np.asarray(embed(req["texts"], req["batch_size"]),
                                        dtype=np.float32))
        return {"saved": req["path"]}
    if req["op"] == "time":
        return {"times": [timed(lambda c=c: embed(c["texts"], c["batch_size"]), req["settle"],
                                req["block"]) for c in req["calls"]]}
    if req["op"] == "memory":
        return {"memory": memory()}
    return {"error": f"unknown op {req['op']!r}"}


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def export_optimum(spec: dict) -> None:
    """Optimum's own export of ST_DIR's Transformer (export=True, then save_pretrained), with
    its tokenizer cut at max_seq_length as sentence-transformers cuts (fastembed reads the cut
    from tokenizer_config.json). Prints {"missing": package} where Optimum is absent."""
    missing = missing_package(("optimum.onnxruntime", "transformers"))
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


def main() -> None:
    if len(sys.argv) != 3 or sys.argv[1] not in ("--worker", "--export-optimum"):
        raise SystemExit(f"usage: {sys.argv[0]} --worker SPEC | --export-optimum SPEC "
                         "(benchmarks/peers/encoders.py starts it)")
    spec = json.loads(sys.argv[2])
    worker(spec) if sys.argv[1] == "--worker" else export_optimum(spec)


if __name__ == "__main__":
    if Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
        del sys.path[0]  # protocol.py is loaded; the peers' folder must not shadow a package
    main()
