"""The peers' own artifacts of tinyt's weights, each made by the peer's own tool:

    ARTIFACTS/checkpoint ──tinyt.hf.to_hf──▶ peers/hf (a Hugging Face directory, logits checked)
        ──CTranslate2's TransformersConverter──▶ peers/ct2-int8, peers/ct2-float32
        ──GenAI's model builder (its own venv)──▶ peers/genai-builder-{int4,int8,fp32}
        ──llama.cpp's convert_hf_to_gguf.py (+ its quantizer)──▶ peers/llama.cpp-{q8_0,q4_0}
        ──Optimum's main_export──▶ peers/optimum-fp32
    an encoder-decoder's ARTIFACTS/hf (seq2seq_peers.py) ──CTranslate2──▶ peers/ct2-int8, ...
        ──Optimum's ORTModelForSeq2SeqLM(export=True)──▶ peers/optimum-fp32
    a Whisper's ARTIFACTS/hf (whisper_peers.py) ──CTranslate2──▶ peers/ct2-int8, ...
        ──Optimum's ORTModelForSpeechSeq2Seq(export=True)──▶ peers/optimum-fp32

Every converter is `convert(hf, out, option)`; prepare.py calls the one an engine names and
stamps `out` with the checkpoint's hash. Where the opt-in tools live is found here too.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from tinyt.errors import BenchError

GGUF = "model.gguf"
EXTRA_BUFTS = "extra_bufts.txt"  # "on", or "off: why" (see gguf)
BUILDER_VENV = Path(".venv-genai-builder")  # scripts/setup-genai-builder.sh
STAMP = "tinyt-source.sha256"  # in each converted directory: the checkpoint it came from
#                                  (and the shim its tool ran under: recipe)


def builder_python() -> Path | None:
    """The GenAI model builder's python: $TINYT_GENAI_BUILDER (a venv), else
    .venv-genai-builder here or beside the checkout this module runs from."""
    env = os.environ.get("TINYT_GENAI_BUILDER")
    for venv in ([Path(env)] if env else []) + [BUILDER_VENV,
                                                Path(__file__).resolve().parents[2] / BUILDER_VENV]:
        if (venv / "bin" / "python").is_file():
            return venv / "bin" / "python"
    return None


def llama_cpp_converter() -> Path | None:
    """llama.cpp's convert_hf_to_gguf.py as scripts/setup-llama-cpp.sh leaves it."""
    base = os.environ.get("TINYT_LLAMA_CPP_CONVERTER") or Path(
        os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tinyt/llama-cpp/converter"
    script = Path(base) / "convert_hf_to_gguf.py"
    return script if script.is_file() else None


def builder_missing(llama: bool) -> str | None:
    """Why the GenAI model builder cannot run here, or None."""
    if not llama:
        return "the GenAI model builder builds Llama-family models; this one is GPT-2's form"
    if builder_python() is None:
        return f"no {BUILDER_VENV} (bash scripts/setup-genai-builder.sh)"
    return None


def llama_cpp_missing(llama: bool) -> str | None:
    """Why llama.cpp's converter cannot run here, or None."""
    if llama_cpp_converter() is None:
        return "llama.cpp's converter is not in the cache (bash scripts/setup-llama-cpp.sh)"
    return None


def stamp(path: Path) -> str | None:
    """The checkpoint hash `path` was converted from, or None."""
    f = path / STAMP
    return f.read_text() if f.is_file() else None


def recipe(convert) -> str:
    """What a conversion by `convert` depends on beside the checkpoint and the peer's tool: the
    shim this module runs the tool under, so that a fix there remakes the conversions made
    before it (they are kept while their stamp matches); "" where there is none."""
    shim = {genai_builder: _BUILDER, gguf: _CONVERT}.get(convert)
    return "" if shim is None else f" shim {hashlib.sha256(shim.encode()).hexdigest()[:16]}"


def ctranslate2(hf: Path, out: Path, option: str) -> None:
    """CTranslate2's converter at quantization `option` (int8, float32)."""
    from ctranslate2.converters import TransformersConverter

    TransformersConverter(str(hf)).convert(str(out), quantization=option, force=True)
    # Its Gemma 3 loader copies the tokenizer's unk_token into config.json, and the library
    # reads that field as a string: tinyt's byte-level BPE has no unknown token (every byte is
    # one), so it is null and the model does not load ("type must be string, but is null").
    # The benchmark feeds tokens from the converted vocabulary, never unknown ones: name the
    # end-of-text token there.
    config = out / "config.json"
    data = json.loads(config.read_text())
    if "unk_token" in data and data["unk_token"] is None:
        data["unk_token"] = data.get("eos_token")
        config.write_text(json.dumps(data))


# Two things GenAI 0.18's builder gets wrong on directories transformers loads correctly, handed
# to it here (the builder is otherwise run as shipped):
# 1. It takes every nn.Linear whose out_features equal the vocabulary for the LM head
#    (Model.has_lm_head) while it walks the model's modules, and the first one it meets wins (a
#    node's name is made once). Where a projection is as wide as the vocabulary, that is a layer-0
#    projection: Qwen3's test shape (4 heads x head_dim 128 = 512 = its vocabulary: q_proj) and
#    Phi-4-mini's (2 + 2 x 1 heads of 128 = 512: qkv_proj) got logits from layer 0's
#    post-attention norm, skipping the rest of the model (25.8% / 50% greedy agreement, KL
#    5.7e-3 / 7.8e-2; Llama-3.2's and Gemma 3's test shapes and hf_shape's real ones have no such
#    projection; docs/peers.md). The LM head is the module the model names as its output
#    embeddings.
# 2. It reads Gemma 3's rope settings in transformers 4's form (one `rope_parameters` dict,
#    `rope_theta`, `rope_local_base_freq`), while transformers 5 keys them by layer type
#    ({"full_attention": {...}, "sliding_attention": {...}}): it stops with KeyError 'rope_type'
#    on any Gemma 3 text config, google/gemma-3-270m's included (its Gemma 4 path reads the new
#    form; Gemma 3's does not). This hands it the same values in both forms: the global layers'
#    settings at the top of the dict beside the per-type entries transformers' model reads when
#    the builder loads the weights.
_BUILDER = """import runpy, sys
import transformers
load = transformers.AutoConfig.from_pretrained
def flat(*args, **kwargs):
    loaded = load(*args, **kwargs)
    config = loaded[0] if isinstance(loaded, tuple) else loaded  # return_unused_kwargs
    rope = getattr(config, "rope_parameters", None)
    if config.model_type == "gemma3_text" and isinstance(rope, dict) and "full_attention" in rope:
        config.rope_theta = rope["full_attention"]["rope_theta"]
        config.rope_local_base_freq = rope["sliding_attention"]["rope_theta"]
        config.rope_parameters = {**rope["full_attention"], **rope}  # both forms
    return loaded
transformers.AutoConfig.from_pretrained = flat
import onnxruntime_genai.models  # puts its folder on sys.path: builder.py imports `builders`
from builders import base
any_wide = base.Model.has_lm_head
def the_head(self, module):
    named = getattr(self.weights, "get_output_embeddings", lambda: None)()
    return module is named if named is not None else any_wide(self, module)
base.Model.has_lm_head = the_head
import json, traceback
for args in json.loads(sys.argv[1]):  # one build each, in this one process
    sys.argv = ["builder", *args]
    error = None
    try:
        runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__")
    except SystemExit as e:
        error = None if e.code in (None, 0) else f"exit status {e.code}"
    except BaseException as e:  # noqa: BLE001 - this build's result, the next one still runs
        error = traceback.format_exception_only(type(e), e)[-1].strip()
    print("tinyt-build " + json.dumps(error), flush=True)
"""


def genai_builder(hf: Path, out: Path, option: str) -> None:
    """GenAI's model builder at precision `option` (int4, int8, fp32), for the CPU, in its own
    virtual environment (it needs another transformers); its error's last line on failure."""
    error = genai_builds(hf, [(out, option)])[0]
    if error is not None:
        raise BenchError(error)


def genai_builds(hf: Path, builds: list[tuple[Path, str]]) -> list[str | None]:
    """GenAI's model builder's builds of `hf` (each (out, precision)) in one process of its
    venv: the imports (transformers 5 and torch, ~3.5 CPU-s) once, not once a precision. Each
    build's error (its last line), or None."""
    args = [["-i", str(hf), "-o", str(out), "-p", option, "-e", "cpu",
             "-c", str(hf.parent / "builder-cache")] for out, option in builds]
    run = subprocess.run([str(builder_python()), "-c", _BUILDER, json.dumps(args)],
                         capture_output=True, text=True)
    done = [json.loads(line.split(" ", 1)[1]) for line in run.stdout.splitlines()
            if line.startswith("tinyt-build ")]
    if len(done) == len(builds):
        return [None if e is None else f"GenAI's builder: {e}" for e in done]
    last = (run.stderr.strip().splitlines() or [f"exit status {run.returncode}"])[-1]
    return done + [f"GenAI's builder exited {run.returncode}: {last}"] * (len(builds) - len(done))


def optimum(hf: Path, out: Path, option: str) -> None:
    """Optimum's own ONNX export, with its past-key-values graph."""
    from optimum.exporters.onnx import main_export

    main_export(str(hf), output=str(out), task="text-generation-with-past",
                no_post_process=False)


def optimum_seq2seq(hf: Path, out: Path, option: str) -> None:
    """Optimum's own export of an encoder-decoder (ORTModelForSeq2SeqLM with export=True:
    encoder_model.onnx, decoder_model.onnx, decoder_with_past_model.onnx), saved."""
    from optimum.onnxruntime import ORTModelForSeq2SeqLM

    ORTModelForSeq2SeqLM.from_pretrained(hf, export=True).save_pretrained(out)


def optimum_speech(hf: Path, out: Path, option: str) -> None:
    """Optimum's own export of a Whisper (ORTModelForSpeechSeq2Seq with export=True: the same
    three files as its text encoder-decoders'), saved."""
    from optimum.onnxruntime import ORTModelForSpeechSeq2Seq

    ORTModelForSpeechSeq2Seq.from_pretrained(hf, export=True).save_pretrained(out)


# convert_hf_to_gguf.py names a BPE vocabulary's pre-tokenizer by hashing what it makes of a
# test text, and knows only the published models' hashes. tinyt's BPE is GPT-2's byte-level
# scheme (tinyt/tokenizer.py), so its pre-tokenizer is "gpt-2"; the benchmark feeds token ids.
_CONVERT = """import sys
conv = sys.argv.pop(1)
sys.path[:0] = [conv, conv + "/gguf-py"]
import convert_hf_to_gguf as c
from conversion import base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
c.main()
"""


_PROBE = """import sys
from tinyt.benchmarks.peers import llama_cpp_model
llama_cpp_model(sys.argv[1], 64, 1, True).eval([1, 2, 3])
"""


def gguf(hf: Path, out: Path, option: str) -> None:
    """out/model.gguf at quantization `option`: q8_0 straight from llama.cpp's converter; q4_0
    through f32 and llama.cpp's own quantizer (llama_model_quantize, in the library the wheel
    ships)."""
    import ctypes

    out.mkdir(parents=True)
    model = out / GGUF
    conv = llama_cpp_converter()
    if conv is None:
        raise BenchError(llama_cpp_missing(True))
    first = model if option == "q8_0" else model.with_suffix(".f32.gguf")
    run = subprocess.run([sys.executable, "-c", _CONVERT, str(conv.parent), str(hf),
                          "--outfile", str(first), "--outtype",
                          "q8_0" if option == "q8_0" else "f32"], capture_output=True, text=True)
    if run.returncode != 0:  # the converter's own last words name what it refused
        said = [line for line in run.stderr.splitlines() if line.strip()]
        raise BenchError(f"llama.cpp's convert_hf_to_gguf.py exited {run.returncode}: "
                         + (said[-1] if said else "(nothing on stderr)"))
    if option == "q4_0":
        import llama_cpp

        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
        if llama_cpp.llama_model_quantize(str(first).encode(), str(model).encode(),
                                          ctypes.byref(params)) != 0:
            raise BenchError(f"llama_model_quantize failed on {first}")
        first.unlink()
    # llama.cpp's extra buffer types (AMX tiles, repacked weights) are its fastest CPU kernels,
    # and on some shapes and CPUs they crash (a 128-wide model on a Xeon with AMX: SIGSEGV
    # in llama_decode). Probe one evaluation in a child process; without them if it dies.
    probe = subprocess.run([sys.executable, "-c", _PROBE, str(model)], capture_output=True,
                           text=True, timeout=300)
    (out / EXTRA_BUFTS).write_text(
        "on" if probe.returncode == 0 else
        f"off: with llama.cpp's extra buffer types one evaluation exited {probe.returncode}")
