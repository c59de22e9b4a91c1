"""`tinyt transcribe`: speech to text with a Whisper artifact, on ONNX Runtime (no torch)
(registered on the one app in app/cli.py)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from tinyt.errors import TinytError

FORMATS = ("text", "json", "srt", "vtt")


def transcribe_cmd(
    artifact: Annotated[Path, typer.Argument(help="Whisper artifact directory (tinyt "
                                                  "import-hf, then tinyt export).")],
    files: Annotated[list[Path], typer.Argument(help="Audio files: WAV, FLAC, OGG, MP3 (what "
                                                     "libsndfile reads here), any rate.")],
    language: Annotated[Optional[str], typer.Option(
        help="Language code of the speech (en, de, ...); default: detected.")] = None,
    translate: Annotated[bool, typer.Option("--translate", help="Translate into English.")]
        = False,
    timestamps: Annotated[bool, typer.Option(
        "--timestamps", help="Predict timestamps (text: one line per segment with its "
                             "times; srt and vtt always do).")] = False,
    beams: Annotated[int, typer.Option(min=1, help="Beam search width (1: greedy).")] = 1,
    form: Annotated[str, typer.Option("--format", help="text, json, srt or vtt.")] = "text",
    prompt: Annotated[Optional[str], typer.Option(
        help="Text that came before (names, spelling) to condition on.")] = None,
    output_dir: Annotated[Optional[Path], typer.Option(
        help="Write each FILE's result to DIR/<name>.<format> instead of stdout (needed for "
             "srt and vtt of several files).")] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option(
        min=0, help="Tokens per 30-s window (default: as many as the decoder holds).")] = None,
    temperature: Annotated[str, typer.Option(
        help="0: greedy; above, sampling; several, comma-separated (0,0.2,0.4,0.6,0.8,1): "
             "tried in turn where a window fails a threshold below.")] = "0",
    seed: Annotated[Optional[int], typer.Option(help="Sampling's seed.")] = None,
    compression_ratio_threshold: Annotated[Optional[float], typer.Option(
        help="Decode a window again at the next temperature where its tokens' zlib "
             "compression ratio is above this (e.g. 1.35).")] = None,
    logprob_threshold: Annotated[Optional[float], typer.Option(
        help="... or its tokens' mean log-probability below this (e.g. -1.0).")] = None,
    no_speech_threshold: Annotated[Optional[float], typer.Option(
        help="Skip a window as silence where <|nospeech|>'s probability is above this and "
             "the mean log-probability below --logprob-threshold (e.g. 0.6).")] = None,
    condition_on_prev_tokens: Annotated[bool, typer.Option(
        "--condition-on-prev-tokens", help="Prompt each window with the text before it.")]
        = False,
    provider: Annotated[str, typer.Option(help="cpu, cuda, tensorrt or auto.")] = "cpu",
    threads: Annotated[Optional[int], typer.Option(min=1, help="Default: physical cores.")]
        = None,
) -> None:
    """Transcribe (or translate) each FILE. Audio over 30 s goes window by window, each from
    the last timestamp; its progress goes to stderr."""
    import tinyt.runtime as rt

    temperatures = _temperatures(temperature)
    if form not in FORMATS:
        raise TinytError(f"--format {form!r} is invalid: one of {', '.join(FORMATS)}")
    if form in ("srt", "vtt") and len(files) > 1 and output_dir is None:
        raise TinytError(f"--format {form} of {len(files)} files: give --output-dir (one "
                         "subtitle file each)")
    model = rt.load(artifact, provider=provider, threads=threads)
    if not isinstance(model, rt.SpeechModel):
        raise TinytError(f"{artifact} is not a speech (Whisper) artifact; tinyt transcribe "
                         "takes one (tinyt translate, generate, classify or embed the others)")
    for path in files:
        def progress(done: float, total: float, name=path.name) -> None:
            if total > 30:  # a window at a time: say where it is
                typer.echo(f"{name}: {done:.1f} / {total:.1f} s", err=True)

        result = model.transcribe(path, language=language, num_beams=beams, prompt=prompt,
                                  task="translate" if translate else "transcribe",
                                  timestamps=timestamps or form in ("srt", "vtt"),
                                  max_new_tokens=max_new_tokens, progress=progress,
                                  temperature=temperatures, seed=seed,
                                  compression_ratio_threshold=compression_ratio_threshold,
                                  logprob_threshold=logprob_threshold,
                                  no_speech_threshold=no_speech_threshold,
                                  condition_on_prev_tokens=condition_on_prev_tokens)
        _emit(result, path, form, timestamps, len(files) > 1, output_dir)


def _temperatures(text: str) -> float | tuple[float, ...]:
    """--temperature's value: a number, or several comma-separated."""
    try:
        many = tuple(float(t) for t in text.split(","))
    except ValueError:
        raise TinytError(f"--temperature {text!r} is invalid: a number, or comma-separated "
                         "numbers (0,0.2,0.4,0.6,0.8,1)") from None
    return many[0] if len(many) == 1 else many


def _emit(result, path: Path, form: str, timestamps: bool, several: bool,
          output_dir: Path | None) -> None:
    """One file's result in its format, to stdout or DIR/<name>.<format>."""
    from tinyt.runtime.subtitles import render

    text = render(result, form)
    if form == "text" and timestamps:
        text = "".join(f"[{s.start:.2f} -> {s.end:.2f}] {s.text}\n"
                       for s in result.segments if s.text)
    if form == "json" and several:  # a line each, saying which file
        text = json.dumps({"file": str(path), **result.to_dict()}, ensure_ascii=False) + "\n"
    if output_dir is not None:
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / f"{path.stem}.{'txt' if form == 'text' else form}").write_text(
            text, encoding="utf-8")
    else:
        typer.echo(text, nl=False)

