"""The `tinyt` command line. Thin: parse, call one library function, print.

Torch and the other heavy modules are imported inside the verb that needs them, so
`tinyt --help` is instant and works on a torch-free install. The verbs live by what they work
on (cli_checkpoints.py, cli_stages.py, cli_runtime.py; the main job, bench and info here) and
are registered on the one `app` below, in the order `tinyt --help` lists them.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from tinyt.errors import TinytError, memory_failure

from .cli_batch import batch_cmd
from .cli_checkpoints import export_hf, import_hf, import_nanogpt, sample, train
from .cli_runtime import classify_cmd, embed_cmd, generate_cmd, serve_cmd, translate_cmd
from .cli_speech import transcribe_cmd
from .cli_stages import export_cmd, optimize, package, quantize, verify

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="tinyt: train a small Transformer, export it to ONNX, run it fast.")

def presets() -> None:
    """List the model presets and their shapes."""
    from tinyt.config import DEFAULT_PRESET, PRESETS

    for name, kw in PRESETS.items():
        mark = " (default)" if name == DEFAULT_PRESET else ""
        typer.echo(f"{name}{mark}: model {kw['model']}  train {kw['train']}")


def pipeline(
    out: Annotated[Path, typer.Option(help="Output directory for every stage.")]
        = Path("artifacts"),
    preset: Annotated[Optional[str], typer.Option(
        help="Model preset: test, demo, llama-demo, seq2seq-test, seq2seq-demo, article, "
             "gpt2-small. Default: demo; seq2seq-demo with --task seq2seq.")] = None,
    task: Annotated[Optional[str], typer.Option(
        help="causal_lm or seq2seq (an encoder-decoder, trained on the built-in code "
             "summarization). Default: the preset's.")] = None,
    data: Annotated[Optional[Path], typer.Option(
        help="Your text corpus (default: the Python standard library's source); seq2seq: a "
             ".tsv / .jsonl of pairs or a directory of .py files.")] = None,
    skip_train: Annotated[Optional[Path], typer.Option(
        help="Use this checkpoint instead of training (a Hugging Face model directory: "
             "imported to OUT/checkpoint first).")] = None,
    no_bench: Annotated[bool, typer.Option("--no-bench", help="Skip the quick benchmark.")]
        = False,
) -> None:
    """The main job: train, export, optimize, quantize, verify, benchmark, report. Re-runs
    skip stages whose inputs have not changed and resume an interrupted training."""
    from tinyt.app.pipeline import pipeline as run_pipeline

    report = run_pipeline(out, preset=preset, task=task,
                          data=None if data is None else str(data), skip_train=skip_train,
                          bench=not no_bench, log=lambda s: typer.echo(s, err=True))
    typer.echo(report.read_text())
    typer.echo(f"report: {report}")


def bench(
    artifacts: Annotated[Path, typer.Argument(help="Directory holding checkpoint/, onnx/ and the "
                                                   "other stages' outputs.")] = Path("artifacts"),
    out: Annotated[Optional[Path], typer.Option(
        help="Where the results go (default benchmarks/results/cpu, or .../peers with "
             "--peers).")] = None,
    mode: Annotated[str, typer.Option(help="quick (< 1 min) or full.")] = "quick",
    rounds: Annotated[Optional[int], typer.Option(
        min=0, help="Interleaved rounds: per shape, each round 3 untimed + 5 timed calls per "
             "variant (default quick 6, full 20); with --peers, each round 1 untimed + 3 "
             "timed calls per engine and shape (default 8; 0: greedy agreement only); with "
             "--serving, requests per client and level (default 4).")] = None,
    peers: Annotated[bool, typer.Option(
        "--peers", help="tinyt against CTranslate2, ONNX Runtime GenAI and PyTorch on the same "
                        "weights, each engine in its own process (extra 'peers').")] = False,
    serving: Annotated[bool, typer.Option(
        "--serving", help="tinyt serve against a naive thread-per-request server on "
                          "ARTIFACTS/onnx-int8-rows-gqa, closed-loop clients at concurrency 1-16 "
                          "(extra 'serve').")] = False,
) -> None:
    """Latency and throughput of PyTorch and every ONNX Runtime variant, side by side; with
    --peers, tinyt against the engines a user would pick instead; with --serving, the server
    under load."""
    if serving:
        from tinyt.benchmarks.serving import markdown
        from tinyt.benchmarks.serving import run as run_serving

        target = artifacts / "onnx-int8-rows-gqa"  # the graph the engine batches prompts with
        if not (target / "manifest.json").is_file():
            raise TinytError(f"{target} is missing: run `tinyt pipeline --out {artifacts}`")
        result = run_serving(target, out or Path("benchmarks/results/serving"),
                             requests=4 if rounds is None else rounds)
        typer.echo(markdown(result))
        return
    out = out or Path("benchmarks/results") / ("peers" if peers else "cpu")
    if peers:
        from tinyt.benchmarks.peers import run as run_peers

        run_peers(artifacts, out, rounds=8 if rounds is None else rounds)
        typer.echo((out / "peers.md").read_text())
        return
    from tinyt.benchmarks.harness import MODES, run

    if mode not in MODES:
        raise TinytError(f"--mode {mode} is not one of {', '.join(MODES)}")
    if rounds == 0:
        raise TinytError("--rounds 0 times nothing; give at least 1 (0 is for --peers: "
                         "greedy agreement only)")
    result = run(artifacts, out, mode=mode, rounds=rounds)
    for name, t in result["targets"].items():
        if name != "shape":
            measured = "n/a" if t["measured"] is None else f"{t['measured']:.2f}"
            typer.echo(f"{name:32s} {measured:>6s}  target {t['target']}  met {t['met']}")
    typer.echo(f"results: {out / 'results.json'}, {out / 'results.md'}")


def info() -> None:
    """Versions, ONNX Runtime providers, and the CPU features that decide INT8 settings."""
    import importlib.metadata as md
    import platform

    from tinyt import __version__
    from tinyt.hardware import cpu_features, int8_preset

    typer.echo(f"tinyt {__version__}, Python {platform.python_version()}")
    for dist in ("torch", "onnx", "onnxscript", "onnxruntime", "onnxruntime-gpu", "tokenizers"):
        try:
            typer.echo(f"  {dist:16s} {md.version(dist)}")
        except md.PackageNotFoundError:
            typer.echo(f"  {dist:16s} not installed")
    try:
        import onnxruntime as ort

        from tinyt.runtime import installation_problems

        typer.echo(f"onnxruntime providers: {', '.join(ort.get_available_providers())}")
        for problem in installation_problems():
            typer.echo(f"problem: {problem}")
    except ImportError:
        typer.echo("onnxruntime providers: onnxruntime is not installed (extra 'cpu' or 'gpu')")
    features = cpu_features()
    exact = features.pop("u8s8_exact")
    typer.echo(f"cpu: {features.pop('model') or 'unknown'} ({features.pop('machine')})")
    typer.echo("  " + "  ".join(f"{k}={'yes' if v else 'no'}" for k, v in features.items()))
    typer.echo("int8 u8 x s8 products (measured): " + {
        True: "exact", None: "unknown (no onnxruntime)",
        False: "saturate (16-bit pair sums): 8-bit int8-GEMM graphs are refused here"}[exact])
    typer.echo(f"int8 preset: {int8_preset()}")


VERBS = {"presets": presets, "train": train, "sample": sample, "import-nanogpt": import_nanogpt,
         "import-hf": import_hf, "export-hf": export_hf, "export": export_cmd, "verify": verify,
         "optimize": optimize, "package": package, "quantize": quantize, "serve": serve_cmd,
         "generate": generate_cmd, "translate": translate_cmd, "transcribe": transcribe_cmd,
         "classify": classify_cmd, "embed": embed_cmd, "batch": batch_cmd, "pipeline": pipeline,
         "bench": bench, "info": info}
for _name, _verb in VERBS.items():
    app.command(_name)(_verb)


def run(interrupted: list[bool]) -> None:
    """Run the CLI: tinyt's errors, and an allocation a library could not make, exit 2 with
    one line; Ctrl-C (`interrupted` is appended to
    by the SIGINT handler) exits 130 with one line, whatever the library was doing when it came
    (torch's exporter, for one, turns a KeyboardInterrupt inside it into errors of its own),
    and earlier outputs stay intact."""
    try:
        app()
    except SystemExit as e:
        if interrupted and e.code != 0:
            _exit_interrupted(e)
        raise
    except TinytError as e:
        if interrupted:
            _exit_interrupted(e)
        typer.echo(f"error: {e}", err=True)
        sys.exit(2)
    except BaseException as e:
        if interrupted:
            _exit_interrupted(e)
        failed = memory_failure(e) if isinstance(e, Exception) else None
        if failed is not None:  # ONNX Runtime / numpy / torch could not allocate: one line
            typer.echo(f"error: {failed}", err=True)
            sys.exit(2)
        raise


def _exit_interrupted(e: BaseException) -> None:
    """One line, the notes of the interrupted work (train says which step it kept), exit 130."""
    notes, seen = [], set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        notes += getattr(e, "__notes__", [])
        e = e.__cause__ or e.__context__
    typer.echo("interrupted: " + ("; ".join(notes) or "the output being written was "
                                  "discarded; outputs already written are intact"), err=True)
    sys.exit(130)

