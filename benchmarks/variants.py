"""The things a benchmark compares: PyTorch eager (with and without a KV cache, and PyTorch's own
dynamic INT8) and ONNX Runtime sessions on artifact directories, behind one interface:

    variant.decode(batch, past)   -> a no-argument callable running one decode step
    variant.prefill(batch, tokens) -> a no-argument callable running one prompt pass
    variant.classify(batch, tokens) -> one classifier pass (classifier variants)

Inputs are built once per shape, so a timed call is the model and nothing else.
"""
from __future__ import annotations

import logging
import shutil
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from tinyt.checkpoint import load_checkpoint
from tinyt.config import ModelConfig
from tinyt.contract import CLASSIFIER, DECODER_WITH_PAST, kv_shape
from tinyt.export.compare import random_feeds
from tinyt.runtime.session import PROVIDERS, create_session, open_artifact


@dataclass
class TorchVariant:
    name: str
    model: torch.nn.Module
    cfg: ModelConfig
    threads: int
    use_cache: bool = True
    device: str = "cpu"

    def _ids(self, b: int, n: int) -> torch.Tensor:
        return torch.randint(0, self.cfg.vocab_size, (b, n), generator=torch.Generator()
                             .manual_seed(0)).to(self.device)

    def decode(self, b: int, past: int) -> Callable[[], None]:
        cfg = self.cfg
        if not self.use_cache:  # nanoGPT-style generation: the whole context again per token
            ids = self._ids(b, past + 1)
            return self._call(lambda: self.model(ids))
        g = torch.Generator().manual_seed(0)
        shape = kv_shape(cfg, b, past)
        cache = tuple((torch.randn(shape, generator=g).to(self.device),
                       torch.randn(shape, generator=g).to(self.device))
                      for _ in range(cfg.n_layer))
        ids = self._ids(b, 1)
        return self._call(lambda: self.model(ids, past_key_values=cache))

    def prefill(self, b: int, n: int) -> Callable[[], None]:
        ids = self._ids(b, n)
        return self._call(lambda: self.model(ids))

    def classify(self, b: int, n: int) -> Callable[[], None]:
        ids = self._ids(b, n)
        mask = torch.ones_like(ids)
        return self._call(lambda: self.model(ids, mask))

    def _call(self, fn):
        sync = torch.cuda.synchronize if self.device == "cuda" else (lambda: None)

        def run():
            torch.set_num_threads(self.threads)  # variants interleave: set it every call
            with torch.inference_mode():
                fn()
            sync()  # a CUDA call returns before the GPU is done: time the work, not the launch
        return run


@dataclass
class OrtVariant:
    name: str
    path: Path  # an artifact directory with model.onnx
    cfg: ModelConfig
    threads: int
    session: ort.InferenceSession | None = None
    provider: str = "CPUExecutionProvider"

    def open(self) -> OrtVariant:
        """A tinyt artifact gets exactly the session an application gets from tinyt.runtime
        (its options, its provider checks); the plain baseline, which has no manifest, gets
        ONNX Runtime's defaults with the same threads and spinning."""
        if (self.path / "manifest.json").is_file():
            artifact = open_artifact(self.path)
            provider = {v: k for k, v in PROVIDERS.items()}[self.provider]
            # Spinning off: variants share this process, and one's spinning workers would
            # slow the next (benchmarks/peers/ measures tinyt's defaults, each engine alone).
            self.session = create_session(artifact, provider=provider, threads=self.threads,
                                          spinning=False)
            return self
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.threads
        opts.inter_op_num_threads = 1
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.log_severity_level = 3
        self.session = ort.InferenceSession(str(self.path / "model.onnx"), opts,
                                            providers=[self.provider])
        if self.session.get_providers()[0] != self.provider:
            raise RuntimeError(f"{self.name}: {self.provider} did not initialise "
                               f"(got {self.session.get_providers()})")
        return self

    def decode(self, b: int, past: int) -> Callable[[], None]:
        feeds = random_feeds(self.cfg, DECODER_WITH_PAST, b, 1, past, 0,
                             np.random.default_rng(0))
        return lambda: self.session.run(None, feeds)

    def prefill(self, b: int, n: int) -> Callable[[], None]:
        feeds = random_feeds(self.cfg, DECODER_WITH_PAST, b, n, 0, 0, np.random.default_rng(0))
        return lambda: self.session.run(None, feeds)

    def classify(self, b: int, n: int) -> Callable[[], None]:
        feeds = random_feeds(self.cfg, CLASSIFIER, b, n, 0, 0, np.random.default_rng(0))
        return lambda: self.session.run(None, feeds)


def torch_variants(checkpoint: Path, threads: int, device: str = "cpu") -> list[TorchVariant]:
    ck = load_checkpoint(checkpoint)
    if device != "cpu":  # PyTorch's dynamic INT8 is a CPU feature; on a GPU: fp32 eager only
        model = ck.model.to(device)
        return [TorchVariant(f"torch-fp32-kv-{device}@{threads}t", model, ck.config, threads,
                             device=device),
                TorchVariant(f"torch-fp32-nocache-{device}@{threads}t", model, ck.config,
                             threads, False, device=device)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch deprecates its quantized tensors; still measured
        int8 = torch.ao.quantization.quantize_dynamic(ck.model, {torch.nn.Linear},
                                                      dtype=torch.qint8)
    return [TorchVariant(f"torch-fp32-kv@{threads}t", ck.model, ck.config, threads),
            TorchVariant(f"torch-fp32-nocache@{threads}t", ck.model, ck.config, threads, False),
            TorchVariant(f"torch-int8-dynamic-kv@{threads}t", int8, ck.config, threads)]


def torch_classifier(checkpoint: Path, threads: int, device: str = "cpu") -> TorchVariant:
    ck = load_checkpoint(checkpoint)
    suffix = "" if device == "cpu" else f"-{device}"
    return TorchVariant(f"torch-clf-fp32{suffix}@{threads}t", ck.model.to(device), ck.config,
                        threads, device=device)


def plain_int8_baseline(checkpoint: Path, out: Path) -> Path:
    """What a user gets without tinyt's optimizations: torch.onnx.export of the KV-cache
    decoder, then onnxruntime's quantize_dynamic, no fusion and no shared table. Kept in `out`
    and reused while the checkpoint, tinyt's code and the torch / onnxruntime versions are the
    same (out/key.json records them): the export alone takes 10-15 s."""
    import json

    from onnxruntime.quantization import quantize_dynamic

    from tinyt.export import export_onnx
    from tinyt.fsutil import atomic_dir, sha256_file
    from tinyt.manifest import toolkit_digest

    key = {"checkpoint": {f: sha256_file(checkpoint / f)
                          for f in ("model.safetensors", "config.json")},
           "toolkit": toolkit_digest(), "torch": torch.__version__,
           "onnxruntime": ort.__version__}
    try:
        if json.loads((out / "key.json").read_text()) == key and (out / "model.onnx").is_file():
            return out
    except (OSError, ValueError):
        pass
    with tempfile.TemporaryDirectory() as tmp, atomic_dir(out) as dst:
        fp32 = export_onnx(checkpoint, Path(tmp) / "onnx")
        root = logging.getLogger()
        level, root.level = root.level, logging.ERROR  # its advice to pre-process the graph
        try:
            quantize_dynamic(str(fp32 / "model.onnx"), str(dst / "model.onnx"))
        finally:
            root.setLevel(level)
        shutil.copy(fp32 / "config.json", dst / "config.json")  # the model's shape, for readers
        (dst / "key.json").write_text(json.dumps(key, indent=1))
    return out
