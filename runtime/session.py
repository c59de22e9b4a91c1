"""ONNX Runtime sessions: provider choice with no silent fallback, deliberate session options,
and integrity checks of the artifact directory before anything runs (torch-free)."""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

import numpy as np
import onnxruntime as ort

from tinyt import contract, int8
from tinyt.contract import DECODER_WITH_PAST, SEQ2SEQ, SEQ2SEQ_FILES, SHARED_CACHE_KIND
from tinyt.errors import ConfigError, NonFiniteError, ProviderError, SaturationError
from tinyt.graphio import GraphError
from tinyt.hardware import int8_preset, physical_cores, saturates_here
from tinyt.manifest import Artifact, Manifest, ManifestError, open_artifact_dir, read_manifest

from .feeds import check_tokens

KINDS = (*contract.KINDS, SEQ2SEQ)  # what the runtime runs: the single graphs, an
# encoder-decoder's three (runtime/encoder_decoder.py)
PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider",
             "tensorrt": "TensorrtExecutionProvider"}
AUTO_ORDER = ("cuda", "cpu")  # TensorRT builds engines per shape: only when asked for by name
# Fusions ONNX Runtime must not redo at load: SkipLayerNormalization's CPU kernel is 4-5x
# slower than Add + LayerNormalization over a prompt's rows (export/gqa_graph.py unfuses it).
UNFUSED = ["SkipLayerNormFusion"]
LEVELS = {"disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
          "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
          "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
          "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}


def installation_problems() -> list[str]:
    """Known broken setups, each with its fix."""
    problems = []
    installed = {d for d in ("onnxruntime", "onnxruntime-gpu") if _installed(d)}
    if len(installed) == 2:
        problems.append("both onnxruntime and onnxruntime-gpu are installed; they ship the same "
                        "module and break each other: pip uninstall -y onnxruntime "
                        "onnxruntime-gpu, then install one (extra 'cpu' or 'gpu')")
    return problems


def _installed(dist: str) -> bool:
    import importlib.metadata as md  # here: with email and zipfile, 2 MB of a process's RSS

    try:
        md.version(dist)
        return True
    except md.PackageNotFoundError:
        return False


def open_artifact(directory: str | os.PathLike) -> Artifact:
    """Check the directory against its manifest (hashes) and the I/O contract it declares."""
    return runnable(open_artifact_dir(directory))


def runnable(artifact: Artifact) -> Artifact:
    """The artifact, refused by name where tinyt.runtime cannot run what it holds."""
    if artifact.kind not in KINDS:
        raise ManifestError(f"{artifact.path}/manifest.json names graph "
                            f"{artifact.manifest.graph!r}; tinyt.runtime runs "
                            f"{', '.join(KINDS)} graphs")
    return artifact


def int8_refusal(manifest: Manifest | dict, graph: str,
                 features: dict | None = None) -> str | None:
    """None if `graph` (a file of the artifact whose manifest this is) computes exactly on
    this CPU (or the CPU `features` describe), else why not: its u8 x s8 GEMMs use 8-bit
    weights (or its manifest does not say) and this CPU adds their products in 16 bits."""
    entry = int8.entry_for(manifest.data if isinstance(manifest, Manifest) else manifest, graph)
    if int8.exact_everywhere(entry) or not saturates_here(features):
        return None
    what = "its manifest does not say where it is exact" if entry is None else \
        f"its u8 x s8 int8 GEMMs have {entry.get('weight_bits')}-bit weights"
    return (f"{graph}: {what}, and this CPU ({int8_preset(features)['preset']}: no VNNI / AMX "
            "/ ARM dot product) adds u8 x s8 products in 16 bits that saturate, so it would "
            "compute wrong outputs here. Run it on a CPU with VNNI, AMX or ARM dot products, "
            "or quantize again on this CPU (7-bit weights, the default here: exact on every "
            "CPU), or use --kernel nbits")


def check_int8(manifest: Manifest | dict, graph: str) -> None:
    """Refuse a graph that would compute saturated int8 products on this CPU."""
    why = int8_refusal(manifest, graph)
    if why:
        raise SaturationError(why)


def check_graphs_here(manifest: Manifest | dict, graphs: list[str], what: str) -> None:
    """Refuse to make `what` from graphs its checks cannot run exactly on this CPU."""
    for graph in graphs:
        why = int8_refusal(manifest, graph)
        if why:
            raise SaturationError(f"{what} is checked by running every graph it holds on this "
                                  f"CPU, and {why}")


def graph_session(path: str | os.PathLike, *, level: str = "disabled",
                  threads: int | None = None) -> ort.InferenceSession:
    """A CPU session on one graph file for a check or a measurement (not an artifact's
    serving session: see create_session). level: the graph optimizations ONNX Runtime may
    still apply ('disabled' runs the graph as written); spinning off, so that sessions taking
    turns do not steal each other's cores. A graph of an artifact (a manifest beside it) that
    would saturate on this CPU is refused (int8_refusal)."""
    path = Path(path)
    manifest = path.parent / "manifest.json"
    if manifest.is_file():
        listed = read_manifest(path.parent)
        if path.name in listed["files"]:
            check_int8(listed, path.name)
    return ort.InferenceSession(str(path), ort_options(level=level, threads=threads),
                                providers=["CPUExecutionProvider"])


def ort_options(*, level: str, threads: int | None = None, spinning: bool = False,
                optimized_model: str | os.PathLike | None = None) -> ort.SessionOptions:
    """The options every ONNX Runtime session of tinyt's starts from: graph optimizations up
    to `level` (LEVELS), `threads` intra-op threads (None: ONNX Runtime's default), worker
    threads spinning between runs or not, nothing below errors logged; optimized_model: where
    ONNX Runtime saves the graph it optimized (an offline optimization)."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = LEVELS[level]
    if threads:
        opts.intra_op_num_threads = threads
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    if optimized_model is not None:
        opts.optimized_model_filepath = str(optimized_model)
    opts.log_severity_level = 3
    return opts


def check_source(source: str | os.PathLike | Artifact) -> Artifact:
    """A stage's source artifact, checked as the runtime would (manifest, contract, the config
    against the graph, one probe step) so that a mismatch is refused by name before the stage
    runs it in its own checks. An Artifact already opened is not hashed again."""
    artifact = runnable(source if isinstance(source, Artifact) else open_artifact_dir(source))
    if artifact.kind == SEQ2SEQ:
        raise ManifestError(f"{artifact.path} is an encoder-decoder (seq2seq) artifact: "
                            "this stage takes single-graph artifacts (optimize, quantize and "
                            "verify take its three graphs); run it with tinyt.runtime "
                            "(rt.load, tinyt translate)")
    create_session(artifact, threads=1, spinning=False, level="disabled")
    return artifact


def check_contract(artifact: Artifact, session: ort.InferenceSession,
                   graph: str | None = None) -> None:
    """The session's inputs and outputs are the contract's, by name and rank, in order.
    graph: the file the session runs, if not the artifact's model (an encoder-decoder's)."""
    cfg, kind = artifact.config, artifact.kind
    graph = graph or artifact.model_file
    model = f"{artifact.path}/{graph}"
    if kind == SEQ2SEQ:
        want = _seq2seq_contract(cfg, graph, model)
    else:
        # a shared-cache graph made before windowed layers had buffers of their own still
        # runs, and one made before its hidden states were an output (no prompt scoring) too
        compact = any(t.name == contract.WINDOW_INPUTS[0] for t in session.get_inputs())
        hidden = any(t.name == contract.HIDDEN_OUTPUT for t in session.get_outputs())
        want = contract.contract_for(cfg, kind, compact=compact, hidden=hidden)
    layers = sum(t.name.startswith("past_key_values.") for t in session.get_inputs()) // 2
    if kind in (DECODER_WITH_PAST, SHARED_CACHE_KIND) and layers != cfg.n_layer:
        raise ManifestError(f"config.json says n_layer={cfg.n_layer} but {model} has a KV cache "
                            f"for {layers} layers: the config does not belong to this graph")
    for got, specs, side in ((session.get_inputs(), want[0], "inputs"),
                             (session.get_outputs(), want[1], "outputs")):
        have = [(t.name, len(t.shape)) for t in got]
        expected = [(t.name, len(t.shape)) for t in specs]
        if have != expected:
            raise ManifestError(f"{model} {side} {have} do not follow the {kind} contract "
                                f"{expected}")
        for t, spec in zip(got, specs):  # the config's sizes against the graph's static axes
            for axis, (dim, want_dim) in enumerate(zip(t.shape, spec.shape)):
                if isinstance(dim, int) and isinstance(want_dim, int) and dim != want_dim:
                    field = _CONFIG_AXES.get((spec.name.split(".")[0], axis), "its shape")
                    raise ManifestError(
                        f"config.json says {field}={getattr(cfg, field, want_dim)} but {model}'s "
                        f"{t.name} has {dim} on axis {axis}: the config does not belong to this "
                        "graph")
    _probe(artifact, session, model)


def _seq2seq_contract(cfg, graph: str, model: str):
    """(inputs, outputs) of one of an encoder-decoder's graphs, by its file name."""
    roles = {file: role for files in (SEQ2SEQ_FILES, contract.SEQ2SEQ_ORT_FILES)
             for role, file in files.items()}
    if graph not in roles:
        raise ManifestError(f"{model} is not one of an encoder-decoder's graphs "
                            f"({', '.join(SEQ2SEQ_FILES.values())})")
    return contract.seq2seq_contract(cfg)[roles[graph]]


# Which config field a static axis of the contract comes from (logits' last axis, the cache's
# heads and head size).
_CONFIG_AXES = {("logits", 2): "vocab_size", ("logits", 1): "num_labels",
                ("last_hidden_state", 2): "n_embd", ("sentence_embedding", 1): "n_embd",
                ("hidden_states", 2): "n_embd", ("encoder_hidden_states", 2): "n_embd",
                ("past_key_values", 1): "kv_heads", ("present", 1): "kv_heads",
                ("past_key_values", 3): "head_dim", ("present", 3): "head_dim"}
_DTYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(float)": np.float32,
           "tensor(float16)": np.float16, "tensor(int8)": np.int8}


def _probe(artifact: Artifact, session: ort.InferenceSession, model: str) -> None:
    """One run at the last position the config allows (block_size - 1): a position table with
    fewer rows than config.json's block_size fails here, at load, not in the middle of a
    generation; and logits that are not finite on it mean broken weights."""
    cfg = artifact.config
    inputs = session.get_inputs()
    last = cfg.block_size - 1
    # With position_ids as an input one token reaches the last position; without (classifier,
    # no-cache decoder) the sequence itself must reach it: a learned table's block (up to
    # LEARNED_CHECK_TOKENS), computed positions CHECK_TOKENS (the probe costs what a check
    # does, never a full 131,072-token prefill).
    S = 1 if any(i.name == "position_ids" for i in inputs) else check_tokens(cfg)
    last = last if S == 1 else S - 1
    sizes = {contract.BATCH: 1, contract.SEQ: S, contract.PAST: 0, contract.TOTAL: S,
             contract.CAPACITY: S, contract.WINDOW_CAPACITY: S}
    values = {"attention_mask": 1, "position_ids": last, "seqlens_k": S - 1,
              "total_sequence_length": S, "query_seqlens": S,
              contract.WINDOW_INPUTS[0]: S - 1, contract.WINDOW_INPUTS[1]: S}
    feeds = {}
    for i in inputs:
        shape = [d if isinstance(d, int) else sizes.get(d, 1) for d in i.shape]
        feeds[i.name] = np.full(shape, values.get(i.name, 0), dtype=_DTYPES.get(i.type, np.float32))
    first = session.get_outputs()[0].name  # logits, or an encoder's last_hidden_state
    try:
        logits = session.run([first], feeds)[0]
    except Exception as e:  # ONNX Runtime's own error types
        raise ManifestError(
            f"config.json says block_size={cfg.block_size}, but a run of {model} at position "
            f"{last} fails ({str(e).splitlines()[0][:300]}): the config does not belong to this "
            "graph") from None
    if not np.isfinite(logits).all():
        raise NonFiniteError(f"{model} computes non-finite logits on a probe input: its weights "
                             "hold NaN or inf (re-export it from a good checkpoint)")


def resolve_threads(threads: int | None) -> int:
    """The intra-op threads of an artifact's sessions: `threads` if it is a positive integer,
    None for the physical cores. The one place a caller's threads is checked and defaulted
    (rt.load calls it; create_session, session_options and plan_sessions take its answer)."""
    if threads is not None and not (isinstance(threads, int) and not isinstance(threads, bool)
                                    and threads >= 1):
        raise ConfigError(f"threads={threads!r} is invalid: a positive integer, or None for "
                          f"the physical cores ({physical_cores()} here)")
    return physical_cores() if threads is None else threads


SPINNING_ENV = "TINYT_SPINNING"


def default_spinning(threads: int) -> bool:
    """Whether sessions of `threads` threads spin when the caller does not say: on with more
    than one thread (session_options says why), unless $TINYT_SPINNING says "0" (off) or "1"
    (on) for every session of the process: a machine shared with other work (a CI runner, a
    container with a CPU quota, a test suite) wants its cores back between ops."""
    value = os.environ.get(SPINNING_ENV, "").strip()
    if value not in ("", "0", "1"):
        raise ConfigError(f"${SPINNING_ENV}={value!r} is invalid: 0 (threads sleep between "
                          "ops), 1 (they spin), or unset (spin with more than one thread)")
    return threads > 1 if value == "" else value == "1"


PHASES = ("any", "step", "prompt")  # what a session runs: both, decode steps only, prompts only


def session_options(artifact: Artifact, *, threads: int, spinning: bool | None,
                    level: str | None, phase: str = "any") -> ort.SessionOptions:
    """ONNX Runtime's options for one of the artifact's sessions; threads as resolve_threads
    gives it."""
    # Spinning keeps worker threads busy-waiting between runs. A decode step is a few dozen
    # small ops, each too short to pay for waking a sleeping thread: measured on the demo INT8
    # graph, 2 threads decoded at 0.136 ms/token without spinning and 0.104 with it (1 thread:
    # 0.103), and prefilled 127 tokens in 2.62 vs 2.11 ms. The cost is bounded: after a call
    # the workers spin ~40 ms of CPU, then sleep. So spinning is on (None = auto) whenever
    # there is more than one thread; pass spinning=False to give the cores back at once.
    spin = default_spinning(threads) if spinning is None else spinning
    recorded = artifact.manifest.options.get("level")
    # An optimized artifact was optimized offline at `recorded`; a portable one must not gain
    # contrib ops at load. Others get ONNX Runtime's extended level.
    opts = ort_options(level=level or recorded or "extended", threads=threads, spinning=spin)
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if phase == "prompt":  # spin inside a run, sleep as soon as it ends: the steps run next,
        # on another session
        opts.add_session_config_entry("session.force_spinning_stop", "1")
    # A contract graph's shapes change every step (the KV cache grows): memory patterns planned
    # for one shape would be thrown away at the next, so none are planned. A shared-cache
    # graph's step has the same shapes every time ([B, 1] in, the cache bound in place): there
    # a planned pattern, and plain malloc instead of ONNX Runtime's arena for what the pattern
    # leaves, made a step 5.7% faster on the demo and 7% at the GPT-2 shape (1 thread, bare
    # steps, 60 rounds in random order; each alone: 2.3% and 3.9% on the demo); a 127-token
    # prompt pass did not change (0.998x).
    shared = artifact.kind == contract.SHARED_CACHE_KIND
    opts.enable_mem_pattern = shared and phase != "prompt"
    opts.enable_cpu_mem_arena = not shared
    return opts


def create_session(artifact: Artifact, *, provider: str = "cpu", threads: int,
                   spinning: bool | None = None, level: str | None = None,
                   graph: str | None = None, phase: str = "any") -> ort.InferenceSession:
    """A session on exactly the requested provider ('auto': the best that really works).
    threads: intra-op threads, checked and defaulted by resolve_threads (rt.load does);
    graph: a file of the artifact other than its model (a shared-cache pair's prompt graph);
    phase: 'prompt' for a session that runs only prompts, taking turns with a step session
    (its threads sleep as soon as a run ends), 'step' for one that runs only decode steps,
    'any' for both (session_options)."""
    if provider not in (*PROVIDERS, "auto"):
        raise ProviderError(f"provider={provider!r} is not one of {', '.join(PROVIDERS)}, auto")
    if level is not None and level not in LEVELS:
        raise ProviderError(f"level={level!r} is not one of {', '.join(LEVELS)}")
    if phase not in PHASES:
        raise ConfigError(f"phase={phase!r} is not one of {', '.join(PHASES)}")
    check_int8(artifact.manifest, graph or artifact.model_file)
    opts = session_options(artifact, threads=threads, spinning=spinning, level=level,
                           phase=phase)
    model = str(artifact.path / (graph or artifact.model_file))
    if provider != "auto":
        session = _on(provider, model, opts)
    else:
        failures = []
        for name in AUTO_ORDER:
            try:
                session = _on(name, model, opts)
                break
            except ProviderError as e:
                failures.append(str(e))
        else:
            raise ProviderError("no provider works: " + "; ".join(failures))
    check_contract(artifact, session, graph)
    return session


def _on(provider: str, model: str, opts: ort.SessionOptions) -> ort.InferenceSession:
    wanted = PROVIDERS[provider]
    available = ort.get_available_providers()
    hints = installation_problems()
    if wanted not in available:
        raise ProviderError(
            f"provider {provider!r} ({wanted}) is not in this onnxruntime "
            f"{ort.__version__}; available: {', '.join(available)}"
            + ("" if provider == "cpu" else "; for CUDA install the 'gpu' extra "
               "(onnxruntime-gpu) instead of 'cpu'") + "".join(f"; {h}" for h in hints))
    if provider != "cpu" and hasattr(ort, "preload_dlls"):
        try:
            ort.preload_dlls()  # CUDA / cuDNN from pip wheels, where they are installed
        except Exception:  # preloading is a help, not a requirement
            pass
    try:
        # CPU stays listed after an accelerator: ONNX Runtime places ops that provider lacks
        # there. A fallback of the whole session is caught below.
        chain = [wanted] if provider == "cpu" else [wanted, "CPUExecutionProvider"]
        sess = ort.InferenceSession(model, opts, providers=chain, disabled_optimizers=UNFUSED)
    except Exception as e:  # ORT raises its own Fail / RuntimeException types
        if "INVALID_PROTOBUF" in str(e) or "Protobuf parsing failed" in str(e):
            raise GraphError(f"{model} is not a valid ONNX model ({str(e).splitlines()[0]})") \
                from None
        raise ProviderError(f"provider {provider!r} failed to initialise: {e}") from None
    got = sess.get_providers()
    if got[0] != wanted:  # ONNX Runtime fell back (for example, CUDA libraries missing)
        raise ProviderError(
            f"provider {provider!r} did not initialise (the session got {got}); its libraries "
            "are likely missing: check CUDA / cuDNN versions against onnxruntime-gpu's, or "
            "install the nvidia-*-cu12 wheels" + "".join(f"; {h}" for h in hints))
    return sess


def return_freed_memory() -> bool:
    """Hand back to the system the pages that freed allocations leave inside the C heap
    (glibc's malloc_trim); whether this process's C library could. A session's load parses
    its model and pre-packs its weights in many allocations below malloc's mmap threshold:
    once freed (a model's protobuf after the load, the sessions the tuner opened and did not
    keep) they stay resident, since glibc returns only the heap's free top by itself. Measured
    on Qwen3-0.6B's INT8 pair (docs/peers.md): see `loaded` there."""
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the process's own C library (not glibc: absent)
    except (OSError, AttributeError, TypeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True
