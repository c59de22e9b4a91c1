"""The opening and the tail every stage that derives an artifact from another shares
(torch-free). The stages themselves stay plain functions:

    src = open_source(src_dir, out_dir)     # manifest checked, output dir allowed, config read
    ...the stage's own checks of its request...
    proto = source_graph(src)               # the graph, finite weights, config vs graph
    ...the stage's own work, written to a temporary `path` and checked...
    write_artifact(out_dir, src, [path], stage="optimize", options={...}, extra={...})
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import onnxruntime as ort

from tinyt.contract import SPEECH_FILE
from tinyt.export.genai_config import write_genai_config
from tinyt.fsutil import atomic_dir
from tinyt.graphio import copy_graph, load_graph
from tinyt.manifest import Artifact, check_output_dir, open_artifact_dir, write_manifest
from tinyt.runtime.session import check_source

COPIED_FILES = ("config.json", "tokenizer.json", "generation_config.json")
# an imported tokenizer's eos, bos, template; a Whisper's special tokens and generation
# settings (contract.SPEECH_FILE)
CARRIED_IF_PRESENT = ("tokenizer_config.json", SPEECH_FILE)


def copy_artifact_files(src_dir: Path, out: Path) -> None:
    """The files every artifact carries from its source, beside the graph."""
    for name in COPIED_FILES:
        shutil.copy(src_dir / name, out / name)
    for name in CARRIED_IF_PRESENT:
        if (src_dir / name).is_file():
            shutil.copy(src_dir / name, out / name)


class Built(type(Path())):
    """The path of a directory a stage wrote, carrying what the stage did: its manifest (the
    summary a caller prints, without reading the file back)."""

    manifest: dict[str, Any]


def built(path: str | os.PathLike, manifest: dict[str, Any]) -> Built:
    out = Built(path)
    out.manifest = manifest
    return out





def source_graph(src: Artifact):
    """The source's ModelProto: weights checked finite, config checked against the graph the
    way the runtime checks it (one probe step), its files not hashed again."""
    proto = load_graph(src.model_path)
    check_source(src)
    return proto


def source_versions(src: Artifact, **more: str) -> dict[str, str]:
    """The versions a derived artifact records: its source's, ONNX Runtime's, and `more`."""
    return {**src.manifest.versions, "onnxruntime": ort.__version__, **more}


def open_source(src_dir: str | os.PathLike | Artifact,
                out_dir: str | os.PathLike | None = None) -> Artifact:
    """The source artifact, its files checked against its manifest (hashed once, here; an
    Artifact a caller opened already, as the quantization search does for each variant it
    tries, is taken as it is); `out_dir` (if given) may be replaced by a stage's output (not
    the source, not a directory holding it, not a directory that is not an artifact)."""
    src = src_dir if isinstance(src_dir, Artifact) else open_artifact_dir(src_dir)
    if out_dir is not None:
        check_output_dir(src.path, Path(out_dir))
    return src


def write_artifact(out_dir: str | os.PathLike, src: Artifact, graphs: list[Path], *, stage: str,
                   options: dict[str, Any], extra: dict[str, Any],
                   genai: bool = True) -> Built:
    """The output directory, whole or not at all: the graphs (with external data), the
    source's config and tokenizer files, genai_config.json, the manifest with its lineage."""
    with atomic_dir(out_dir) as out:
        for graph in graphs:
            copy_graph(graph, out)
        copy_artifact_files(src.path, out)
        if genai:
            write_genai_config(out, src.config, kind=src.kind)
        manifest = write_manifest(out, stage=stage, source=src.record(), options=options,
                                  extra=extra)
    return built(out_dir, manifest)
