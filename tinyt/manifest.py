"""manifest.json: what an artifact directory holds and where it came from (torch-free).

    {"format": "tinyt-artifact", "stage": "export", "files": {"model.onnx": {"sha256", "bytes"}},
     "opset": 18, "io": {"inputs": [...], "outputs": [...]}, "options": {...},
     "versions": {...}, "source": {"path", "kind", "sha256" | "manifest"},
     "toolkit": sha256 of tinyt's source that made it,
     "int8": {graph file: where it is exact (tinyt.int8)}}

Every file of the directory is listed with its sha256; `check_manifest` refuses a directory
whose files do not match, naming the file.
"""
from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tinyt import int8
from tinyt.errors import ManifestError
from tinyt.fsutil import sha256_file, write_json

MANIFEST = "manifest.json"
FORMAT = "tinyt-artifact"


@dataclass(frozen=True)
class FileEntry:
    sha256: str
    bytes: int


# manifest.json's keys besides the ones every manifest has, each a stage's own record: the
# graph kind and files (export, package), the quantization and its reports (quantize), the
# pair's prompt graph (optimize --target gqa), the package's format and pinned shapes
RECORDS = ("graph", "model_file", "prefill_model_file", "opset", "io", "versions", "int8",
           "quantization", "prefill_quantization", "accuracy", "source_accuracy",
           "prefill_accuracy", "prefill_source", "prefill_equivalence", "equivalence",
           "long_context", "search", "fixed_shape", "capacity_tokens", "package_format", "ort",
           "web", "transformers_js", "pair", "prefill_chunk", "layers")


@dataclass(frozen=True)
class Manifest:
    """manifest.json, read once into what its readers ask of it. The stage, the files and
    their hashes, the lineage (`source`) and the stage's options are every manifest's; a
    stage's own records are typed properties below (None where that stage wrote none), the
    JSON itself kept whole (`data`) for what is written back (lineage, `fresh`)."""
    stage: str
    files: Mapping[str, FileEntry]
    source: Mapping[str, Any]
    options: Mapping[str, Any]
    toolkit: str | None
    data: dict[str, Any] = field(repr=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "manifest.json") -> Manifest:
        if data.get("format") != FORMAT or not isinstance(data.get("files"), dict):
            raise ManifestError(f"{where} is not a tinyt artifact manifest")
        try:
            files = {name: FileEntry(e["sha256"], e["bytes"]) for name, e in data["files"].items()}
        except (KeyError, TypeError) as e:
            raise ManifestError(f"{where}: a file entry lacks its sha256 or bytes ({e})") from None
        return cls(stage=data.get("stage", ""), files=files, source=data.get("source") or {},
                   options=data.get("options") or {}, toolkit=data.get("toolkit"), data=data)

    def record(self, key: str) -> Any:
        """One of a stage's records (RECORDS), None where the stage wrote none."""
        if key not in RECORDS:
            raise KeyError(f"{key!r} is not a manifest record; records: {', '.join(RECORDS)}")
        return self.data.get(key)

    def records(self, *keys: str) -> dict[str, Any]:
        """The stage records among `keys` this manifest holds: what a derived artifact carries
        forward from its source."""
        return {k: self.record(k) for k in keys if self.record(k) is not None}

    @property
    def graph(self) -> str | None:
        """The graph kind (tinyt.contract.KINDS); None for a directory that holds no graph."""
        return self.data.get("graph")

    @property
    def model_file(self) -> str:
        return self.data.get("model_file", "model.onnx")

    @property
    def prefill_model_file(self) -> str | None:
        return self.data.get("prefill_model_file")

    @property
    def fixed_shape(self) -> dict[str, int] | None:
        return self.data.get("fixed_shape")

    @property
    def package_format(self) -> str | None:
        return self.data.get("package_format")

    @property
    def versions(self) -> dict[str, str]:
        return self.data.get("versions") or {}

    @property
    def quantization(self) -> dict[str, Any] | None:
        return self.data.get("quantization")

    @property
    def recipe(self):
        """The quantization recipe of the graph (tinyt.recipe.QuantRecipe), None for fp32:
        recorded whole by newer stages, read back from the options by older ones'."""
        from tinyt.recipe import QuantRecipe, recorded

        return recorded(self.quantization) or (
            QuantRecipe.from_manifest(self.options) if self.stage == "quantize" else None)

    @property
    def prefill_quantization(self) -> dict[str, Any] | None:
        """A shared-cache pair's prompt graph's quantization record."""
        return self.data.get("prefill_quantization")

    @property
    def accuracy(self) -> dict[str, Any] | None:
        """The graph's own accuracy report (a shared-cache pair's: measured through it)."""
        return self.data.get("accuracy")

    @property
    def source_accuracy(self) -> dict[str, Any] | None:
        """A shared-cache artifact's step graph's quantization report, kept from its source."""
        return self.data.get("source_accuracy")

    @property
    def prefill_accuracy(self) -> dict[str, Any] | None:
        """The pair's prompt graph's accuracy report."""
        prefill = self.data.get("prefill_accuracy")
        if prefill is None:  # older pairs: in the prompt graph's source manifest
            prefill = ((self.data.get("prefill_source") or {}).get("manifest") or {}).get(
                "accuracy")
        return prefill


def io_spec(inputs: Iterable, outputs: Iterable) -> dict[str, list[dict[str, Any]]]:
    """The I/O contract (TensorSpecs from tinyt.contract) as JSON-ready data."""
    return {"inputs": [asdict(t) for t in inputs], "outputs": [asdict(t) for t in outputs]}


OTHER_FLOORS = ("export", "runtime", "benchmarks", "server", "app")  # tinyt.<name>, installed


def toolkit_digest() -> str:
    """sha256 over the source of the floors that make artifacts (tinyt with tinyt.hf,
    tinyt.export with tinyt.export.web, tinyt.runtime), the same in a checkout and an install:
    a stage's output depends on the code that made it, so the pipeline re-runs a stage after an
    upgrade."""
    import hashlib
    import importlib.util

    h = hashlib.sha256()
    for pkg in ("tinyt", "tinyt.export", "tinyt.runtime"):
        spec = importlib.util.find_spec(pkg)  # locates without importing (tinyt.export needs torch)
        for root in (spec.submodule_search_locations if spec else None) or []:
            for path in sorted(Path(root).rglob("*.py")):
                rel = path.relative_to(root)
                # an installed tinyt/ holds the other floors' folders: each counts once, under
                # its own package, or not at all (benchmarks, server, app make no artifact)
                if pkg == "tinyt" and len(rel.parts) > 1 and rel.parts[0] in OTHER_FLOORS:
                    continue
                h.update(f"{pkg}/{rel.as_posix()}\0".encode())
                h.update(path.read_bytes())
    return h.hexdigest()


CKPT_FILES = ("model.safetensors", "config.json")


def manifest_of(path: Path) -> dict | None:
    """The manifest of an artifact directory, or None where it has none (or an unreadable one)."""
    try:
        return json.loads((path / "manifest.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None


def fresh(out: Path, src: Path) -> bool:
    """Whether `out` was made from `src` as it is now."""
    made = manifest_of(out)
    if made is None or made.get("toolkit") != toolkit_digest():
        return False  # missing, or made by other tinyt code
    source = made.get("source", {})
    if source.get("kind") == "checkpoint":
        try:
            return source.get("sha256") == {f: sha256_file(src / f) for f in CKPT_FILES}
        except OSError:  # the input is gone: nothing to be fresh against
            return False
    current = manifest_of(src)
    return current is not None and source.get("manifest", {}).get("files") == current["files"]


def same_prefill(target: Path, prefill: Path | None) -> bool:
    """Whether the shared-cache pair at `target` was made with the prompt graph of `prefill`
    as it is now (or, both None, with none): a prompt graph set aside or remade remakes it."""
    made = manifest_of(target) or {}
    had = made.get("prefill_source")
    if prefill is None or had is None:
        return prefill is None and had is None
    now = manifest_of(prefill)
    return now is not None and had.get("manifest", {}).get("files") == now["files"]


def artifact_source(path: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """The `source` record of an artifact made from the artifact at `path` (its lineage)."""
    return {"kind": "artifact", "path": str(Path(path).resolve()), "manifest": manifest}


def checkpoint_source(path: Path) -> dict[str, Any]:
    """The `source` record of an artifact exported from the checkpoint at `path`: its files'
    sha256, what `fresh` and the lineage checks compare."""
    return {"kind": "checkpoint", "path": str(Path(path).resolve()),
            "sha256": {f: sha256_file(Path(path) / f) for f in CKPT_FILES}}


def write_manifest(directory: Path, *, stage: str, source: dict[str, Any],
                   options: dict[str, Any], extra: dict[str, Any] | None = None) -> dict:
    """Hash every file already in `directory` (and below it) and write manifest.json."""
    files = {  # nested files (a Triton repository) by their relative POSIX path
        p.relative_to(directory).as_posix(): {"sha256": sha256_file(p), "bytes": p.stat().st_size}
        for p in sorted(directory.rglob("*")) if p.is_file() and p.name != MANIFEST
    }
    manifest = {"format": FORMAT, "stage": stage, "files": files, "source": source,
                "options": options, "toolkit": toolkit_digest(), **(extra or {})}
    if "int8" not in manifest:  # where each graph is exact, from the stage or its lineage
        manifest["int8"] = int8.records(manifest)
    write_json(directory / MANIFEST, manifest)
    return manifest


def read_manifest(directory: str | Path) -> dict[str, Any]:
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise ManifestError(f"{directory} has no {MANIFEST}: it is not a tinyt artifact directory "
                            "(made by 'tinyt export' or a later stage)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ManifestError(f"{path} is not valid JSON: {e}") from None
    if manifest.get("format") != FORMAT or not isinstance(manifest.get("files"), dict):
        raise ManifestError(f"{path} is not a tinyt artifact manifest")
    return manifest


def load_manifest(directory: str | os.PathLike, *, check: bool = True) -> Manifest:
    """The directory's manifest, typed; with `check`, every listed file is first found with its
    recorded size and sha256 (each file hashed once: a stage opens its source with this and
    hands the Manifest on, never reading it again)."""
    directory = Path(directory)
    manifest = Manifest.from_dict(read_manifest(directory), str(directory / MANIFEST))
    if check:
        for name, entry in manifest.files.items():
            path = directory / name
            if not path.is_file():
                raise ManifestError(f"{path} is listed in {MANIFEST} but missing")
            if path.stat().st_size != entry.bytes or sha256_file(path) != entry.sha256:
                raise ManifestError(
                    f"{path} does not match its sha256 in {MANIFEST}: the file was changed or "
                    "truncated after the stage wrote it; re-run the stage that made it")
    return manifest


def check_manifest(directory: str | Path) -> dict[str, Any]:
    """The manifest's JSON, after checking every listed file exists with its recorded sha256."""
    return dict(load_manifest(directory).data)


def check_output_dir(source: Path, out: Path) -> None:
    """Refuse an output directory that a stage must not replace: its own input, a directory
    holding the input, or an existing directory that is not a tinyt artifact (a stage replaces
    its output directory whole, so `tinyt export ck artifacts` must not wipe artifacts/)."""
    src, dst = Path(source).resolve(), Path(out).resolve()
    if src == dst or src.is_relative_to(dst):
        raise ManifestError(f"the output directory {out} is or holds the input {source}; choose "
                            "another: a stage never writes over its input")
    if dst.exists() and (not dst.is_dir()
                         or (any(dst.iterdir()) and not (dst / MANIFEST).is_file())):
        raise ManifestError(f"{out} exists and is not a tinyt artifact directory; choose a new "
                            "or empty directory (a stage replaces its output directory whole)")


def read_model_config(directory: str | Path):
    """The ModelConfig of an artifact directory, from the `tinyt` block of its config.json."""
    from tinyt.config import ModelConfig

    path = Path(directory) / "config.json"
    try:
        block = json.loads(path.read_text(encoding="utf-8"))["tinyt"]
        return ModelConfig.from_dict(block["model"]), block
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise ManifestError(f"{path} has no readable 'tinyt' block ({e}); it was not written "
                            "by a tinyt stage") from None


@dataclass(frozen=True)
class Artifact:
    """An artifact directory opened once: the runtime's and every stage's handle on it. Its
    manifest typed (the files hashed when it was opened, never again by the same caller), its
    ModelConfig and config.json's `tinyt` block (labels, ...)."""
    path: Path
    config: Any  # tinyt.config.ModelConfig
    manifest: Manifest
    block: Mapping[str, Any]

    @property
    def kind(self) -> str:
        """The graph kind (tinyt.contract.KINDS)."""
        return self.manifest.graph or ""

    @property
    def labels(self) -> list[str] | None:
        return self.block.get("labels")

    @property
    def model_file(self) -> str:
        return self.manifest.model_file  # model.ort for an ORT-format package

    @property
    def model_path(self) -> Path:
        return self.path / self.model_file

    @property
    def prefill_file(self) -> str | None:
        """A shared-cache pair's prompt graph (runtime/cache.py), else None."""
        return self.manifest.prefill_model_file

    @property
    def fixed(self) -> dict[str, int] | None:
        """Pinned axes (tinyt package --fixed), else None."""
        return self.manifest.fixed_shape

    def with_manifest(self, data: dict[str, Any]) -> Artifact:
        """This artifact as if its manifest read `data` (the runtime's checks of a converted
        graph, and tests, ask what a record changes)."""
        return dataclasses.replace(self, manifest=Manifest.from_dict(data))

    def record(self) -> dict[str, Any]:
        """The `source` record of an artifact made from this one (its lineage)."""
        return artifact_source(self.path, dict(self.manifest.data))


def open_artifact_dir(directory: str | os.PathLike, *, check: bool = True) -> Artifact:
    """The artifact at `directory`: its manifest (every file hashed once, with `check`) and its
    config; what it holds (which graph kind, a package's format) is its reader's to refuse."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ManifestError(f"artifact directory {directory} does not exist")
    manifest = load_manifest(directory, check=check)
    if manifest.package_format == "triton":  # its config.json is Triton's, one folder down
        raise ManifestError(f"{directory} is a Triton model repository (tinyt package --format "
                            "triton): serve it with Triton Inference Server; tinyt loads the "
                            "artifact it was made from")
    cfg, block = read_model_config(directory)
    return Artifact(directory, cfg, manifest, block)
