"""The engines, as data: one row each, naming how it loads (adapters.py), where its model lives
under ARTIFACTS, how that is made from the checkpoint (formats.py) and what its tokens must
equal. tinyt's own engines each run a row of the artifact catalogue (tinyt.artifacts), named
in TINYT_ROWS. Adding an engine is a row here, and an adapter or converter if its family is
new. The encoder peers' engines are rows of the same kind (encoders.py).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import MappingProxyType

from tinyt.artifacts import variant
from tinyt.errors import BenchError

from . import adapters, formats


@dataclass(frozen=True)
class PeerEngine:
    """One engine of a peer benchmark, a decoder's or an encoder's: what it runs, what it
    needs, how its worker loads it, where its model lives and what its output must equal.
    (tinyt.runtime.engine.Engine is the runtime's batching engine, another thing.)"""
    name: str
    about: str  # what it runs (the results' "engines")
    package: str  # the distribution it needs
    install: str  # how that gets here
    # decoders: an adapter (model path, artifacts, threads, context) -> adapters.Generator;
    # encoders: the name of a loader in encoder_adapters.py (its worker may run another python)
    load: Callable[..., adapters.Generator] | str
    artifact: str  # its model: under ARTIFACTS a variant's dir, the checkpoint, peers/<name>;
    #                an encoder's "st" (the sentence-transformers directory) or a stage's dir
    convert: Callable[[Path, Path, str], None] | None = None  # peers/hf -> artifact (its tool)
    option: str = ""  # the converter's precision or quantization
    ours: bool = False  # tinyt's own
    exact: bool = False  # fp32: its tokens (embeddings) must equal the reference's
    same_as: str | None = None  # runs that engine's graph: its tokens must equal that one's
    # a peer's quantization, by its own tool, of that engine's (fp32) model: where that one's
    # tokens differ from tinyt fp32's in a run, this quantizes another model and is not timed
    quantizes: str | None = None
    missing: Callable[[bool], str | None] | None = None  # (Llama family?) -> why not here
    pipeline: bool = False  # in the main job's peer run
    modules: tuple[str, ...] = ()  # what its worker imports; one absent: "not installed"
    options: Mapping[str, object] = field(default_factory=dict)  # for its loader

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))


REFERENCE = "tinyt-fp32"  # greedy agreement and KL are measured against its tokens and logits
_EXTRAS = "extra peers"


# tinyt's own engines: the catalogue's row each runs (the peer benchmark makes the rows the
# pipeline does not, when asked: prepare.py)
TINYT_ROWS: Mapping[str, str] = MappingProxyType({
    "tinyt-fp32": "onnx-opt", "tinyt-int8": "onnx-int8", "tinyt-int8-gqa": "onnx-int8-gqa",
    "tinyt-int4": "onnx-int4", "tinyt-int4-gqa": "onnx-int4-gqa",
    "tinyt-int4-head8": "onnx-int4-head8", "tinyt-int4-head8-gqa": "onnx-int4-head8-gqa",
    "tinyt-int4-k128-head8": "onnx-int4-k128-head8",
    "tinyt-int4-k128-head8-gqa": "onnx-int4-k128-head8-gqa"})


def _ours(name: str, *, exact: bool = False, pipeline: bool = False) -> PeerEngine:
    v = variant(TINYT_ROWS[name])
    about = f"tinyt.runtime generate on ARTIFACTS/{v.dir}" + (f" ({v.note})" if v.note else "")
    return PeerEngine(name, about, "onnxruntime", "extra cpu", adapters.tinyt, v.dir, ours=True,
                      exact=exact, pipeline=pipeline)


def _converted(name: str, about: str, package: str, install: str, load, converter,
               option: str, **kw) -> PeerEngine:
    return PeerEngine(name, about, package, install, load, f"peers/{name}", converter, option,
                      **kw)


_LLAMA_CPP = ("opt-in: bash scripts/setup-llama-cpp.sh, which compiles it (~20 min here) once "
              "into a cache; kept out of the extras and CI")
_ROWS = (
    _ours("tinyt-int8", pipeline=True),
    _ours(REFERENCE, exact=True, pipeline=True),
    _ours("tinyt-int8-gqa", pipeline=True),
    PeerEngine("genai-int8", f"ONNX Runtime GenAI on ARTIFACTS/{variant('onnx-int8').dir}, "
               "unchanged", "onnxruntime-genai", _EXTRAS, adapters.genai,
               variant("onnx-int8").dir, same_as="tinyt-int8", pipeline=True),
    _converted("ct2-int8", "CTranslate2 int8 (converted from the GPT-2 directory)",
               "ctranslate2", _EXTRAS, adapters.ctranslate2, formats.ctranslate2, "int8",
               quantizes="ct2-float32", pipeline=True),
    _converted("ct2-float32", "CTranslate2 float32", "ctranslate2", _EXTRAS,
               adapters.ctranslate2, formats.ctranslate2, "float32", exact=True, pipeline=True),
    *(_converted(f"llama.cpp-{q}", f"llama.cpp {q} (llama-cpp-python; GGUF from llama.cpp's own "
                 "convert_hf_to_gguf.py)", "llama-cpp-python", _LLAMA_CPP, adapters.llama_cpp,
                 formats.gguf, q, missing=formats.llama_cpp_missing, pipeline=q == "q8_0")
      for q in ("q8_0", "q4_0")),
    # llama.cpp with its q8_0 KV cache (the rows above keep its default, f16): against tinyt's
    # 8-bit cache (optimize --kv-cache int8) in the decode after a long context
    *(_converted(f"llama.cpp-{q}-kvq8", f"llama.cpp {q}, q8_0 KV cache and flash attention",
                 "llama-cpp-python", _LLAMA_CPP, partial(adapters.llama_cpp, kv="q8_0"),
                 formats.gguf, q, missing=formats.llama_cpp_missing)
      for q in ("q8_0", "q4_0")),
    PeerEngine("torch-eager", "PyTorch eager, tinyt's model with its KV cache", "torch",
               "extra torch", adapters.torch_eager, "checkpoint", exact=True, pipeline=True),
    # The Llama family's peers and tinyt's INT4 (made when asked: prepare.py)
    _ours("tinyt-int4"),
    _ours("tinyt-int4-gqa"),
    _ours("tinyt-int4-head8"),
    _ours("tinyt-int4-head8-gqa"),
    _ours("tinyt-int4-k128-head8"),
    _ours("tinyt-int4-k128-head8-gqa"),
    *(_converted(f"genai-builder-{p}", f"ONNX Runtime GenAI on its own model builder's {p} "
                 "artifact of the same Hugging Face directory", "onnxruntime-genai",
                 "bash scripts/setup-genai-builder.sh", adapters.genai, formats.genai_builder,
                 p, exact=p == "fp32", missing=formats.builder_missing,
                 quantizes=None if p == "fp32" else "genai-builder-fp32")
      for p in ("int4", "int8", "fp32")),
    _converted("optimum-fp32", "Optimum's own ONNX export (text-generation-with-past) run by "
               "ORTModelForCausalLM.generate", "optimum-onnx", "extra optimum", adapters.optimum,
               formats.optimum, "", exact=True),
)
ENGINES: dict[str, PeerEngine] = {e.name: e for e in _ROWS}
# The main job's peer run: the engines of the GPT-2-form demo (its time stays as it was)
PIPELINE_ENGINES = tuple(e.name for e in _ROWS if e.pipeline)
TINYT = tuple(e.name for e in _ROWS if e.ours)  # tinyt's own engines


def engine(name: str) -> PeerEngine:
    """The row of engine `name`."""
    if name not in ENGINES:
        raise BenchError(f"unknown engine {name!r}; known: {', '.join(ENGINES)}")
    return ENGINES[name]
