"""`tinyt batch`: a task over a corpus, locally or on Ray Data (app/batch.py)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from tinyt.errors import TinytError


def batch_cmd(
    artifact: Annotated[Path, typer.Argument(help="An encoder (embed), classifier (classify), "
                                                  "language model (generate) or "
                                                  "encoder-decoder (translate) artifact.")],
    input: Annotated[Path, typer.Option("--input", help="A .jsonl (one object a line) or "
                                                        ".parquet file of rows.")],
    output: Annotated[Path, typer.Option("--output", help="Folder of the output parts and "
                                                          "batch.json; run again to resume.")],
    task: Annotated[str, typer.Option(help="embed, classify, generate or translate.")],
    text_field: Annotated[str, typer.Option(help="The rows' text field.")] = "text",
    id_field: Annotated[str, typer.Option(help="A field copied to each output row as 'id' "
                                               "where present.")] = "id",
    part_rows: Annotated[int, typer.Option(min=1, help="Rows per output part (the unit of "
                                                       "work and of a restart).")] = 256,
    format: Annotated[str, typer.Option("--format", help="jsonl or parquet parts.")] = "jsonl",
    max_tokens: Annotated[int, typer.Option(min=1, help="generate / translate: greedy tokens "
                                                        "per row.")] = 32,
    tgt_lang: Annotated[Optional[str], typer.Option(help="translate: a multilingual model's "
                                                         "target language.")] = None,
    ray: Annotated[Optional[str], typer.Option(
        "--ray", help="Run on Ray Data: the cluster's address, or 'local' (the ray extra).")]
        = None,
    actors: Annotated[int, typer.Option(min=1, help="--ray: actors, each loading the artifact "
                                                    "once.")] = 1,
    threads: Annotated[int, typer.Option(min=1, help="Threads per model (per actor).")] = 1,
) -> None:
    """Run a task over every row of --input into --output, in parts keyed by input row;
    restartable (finished parts are kept); locally, or with --ray on a Ray Data actor pool."""
    from tinyt.app.batch import batch

    options = {"max_tokens": max_tokens} if task in ("generate", "translate") else {}
    if tgt_lang is not None:
        if task != "translate":
            raise TinytError("--tgt-lang applies to --task translate only")
        options["tgt_lang"] = tgt_lang
    if ray is not None:
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise TinytError("tinyt batch --ray needs the ray extra (ray is missing): pip "
                             "install 'tinyt[cpu,ray]'")
    summary = batch(artifact, input, output, task=task, ray_address=ray, actors=actors,
                    threads=threads, text_field=text_field, id_field=id_field,
                    part_rows=part_rows, fmt=format, options=options)
    print(json.dumps(summary))
