"""`tinyt batch`: a task over a corpus, written in parts keyed by input row, restartable.

    INPUT (.jsonl: one object a line | .parquet) ── rows 0..n-1, the text in --text-field
      └─ parts of `part_rows` rows: part k = rows [k*P, (k+1)*P)
           each part not yet in DIR: read its rows ─▶ Runner (the artifact loaded once)
             ─▶ DIR/part-00000k.jsonl|.parquet, written to a temporary name and renamed
    DIR/batch.json: the job (artifact manifest sha256, input, task, options, part size); a
    restart with another job in DIR is refused, one with the same skips the finished parts.

Every output row is {"row": input row, "id": the input's --id-field where it has one, the
task's answer}: embed "embedding" [dim floats]; classify "label", "probabilities";
generate / translate "text", "finish_reason". A crash leaves whole parts and at most a
temporary file (removed on restart); a part is rewritten whole, so no row is lost or
duplicated. Locally the parts run in this process; `--ray` runs them on a Ray Data pool of
actors (batch_ray.py) with the same parts and the same output.
"""
from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tinyt.errors import ConfigError
from tinyt.fsutil import sha256_file

TASKS = ("embed", "classify", "generate", "translate")
FORMATS = ("jsonl", "parquet")
JOB = "batch.json"
PART_ROWS = 256  # rows per part: the unit of work, of output and of a restart


@dataclass(frozen=True)
class Job:
    """What a batch does; stored as DIR/batch.json and compared on a restart."""
    artifact: str
    manifest_sha256: str
    input: str
    rows: int
    task: str
    text_field: str = "text"
    id_field: str = "id"
    part_rows: int = PART_ROWS
    format: str = "jsonl"
    options: dict[str, Any] = field(default_factory=dict)  # the task's: max_tokens, tgt_lang

    @property
    def parts(self) -> int:
        return -(-self.rows // self.part_rows)

    def span(self, k: int) -> tuple[int, int]:
        """Input rows [start, stop) of part k."""
        return k * self.part_rows, min((k + 1) * self.part_rows, self.rows)


def part_path(out: Path, job: Job, k: int) -> Path:
    return out / f"part-{k:06d}.{job.format}"


def read_rows(path: Path, text_field: str, id_field: str, start: int = 0,
              stop: int | None = None) -> list[dict[str, Any]]:
    """Rows [start, stop) of a .jsonl or .parquet input as {"row", "text", "id"?}; an error
    names the row without a string text."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        names = pq.read_schema(path).names
        cols = [c for c in (text_field, id_field) if c in names]
        table = pq.read_table(path, columns=cols)
        table = table.slice(start, (table.num_rows if stop is None else stop) - start)
        raw: Iterator[dict] = iter(table.to_pylist())
    elif path.suffix == ".jsonl":
        raw = _jsonl(path, start, stop)
    else:
        raise ConfigError(f"--input {path}: give a .jsonl or .parquet file")
    rows = []
    for i, obj in enumerate(raw, start):
        text = obj.get(text_field) if isinstance(obj, dict) else None
        if not isinstance(text, str):
            raise ConfigError(f"{path} row {i}: no string field {text_field!r} "
                              "(--text-field names it)")
        row = {"row": i, "text": text}
        if obj.get(id_field) is not None:
            row["id"] = obj[id_field]
        rows.append(row)
    return rows


def _jsonl(path: Path, start: int, stop: int | None) -> Iterator[dict]:
    with open(path, encoding="utf-8") as f:
        i = 0
        for line in f:
            if not line.strip():
                continue  # blank lines are not rows
            if stop is not None and i >= stop:
                return
            if i >= start:
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as e:
                    raise ConfigError(f"{path} row {i}: not JSON ({e.msg})") from None
            i += 1


def count_rows(path: Path) -> int:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    if path.suffix != ".jsonl":
        raise ConfigError(f"--input {path}: give a .jsonl or .parquet file")
    with open(path, encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


class Runner:
    """The artifact loaded once and the task run on a list of rows: what each local run and
    each Ray actor holds."""

    def __init__(self, job: Job, *, threads: int | None = 1):
        import tinyt.runtime as rt

        want = {"embed": rt.Encoder, "classify": rt.Classifier, "generate": rt.LanguageModel,
                "translate": rt.Seq2SeqModel}[job.task]
        self.job, self.model = job, rt.load(job.artifact, threads=threads)
        if not isinstance(self.model, want):
            raise ConfigError(f"--task {job.task} needs an artifact that loads as "
                              f"{want.__name__}; {job.artifact} loads as "
                              f"{type(self.model).__name__}")

    def answers(self, texts: list[str]) -> list[dict[str, Any]]:
        """The task's answer for each text, as output fields."""
        task, opts = self.job.task, self.job.options
        if task == "embed":
            return [{"embedding": v.tolist()} for v in self.model.embed(texts)]
        if task == "classify":
            return [{"label": p.label, "probabilities": p.probabilities}
                    for p in self.model.classify(texts)]
        kw: dict[str, Any] = {"max_new_tokens": opts.get("max_tokens", 32), "temperature": 0.0}
        if task == "translate" and opts.get("tgt_lang"):
            kw["tgt_lang"] = opts["tgt_lang"]
        return [{"text": r.text, "finish_reason": r.finish_reason}
                for r in self.model.generate_details(texts, **kw)]

    def run_part(self, out: Path, k: int) -> int:
        """Part k computed and written (atomically); the rows it holds."""
        job = self.job
        rows = read_rows(Path(job.input), job.text_field, job.id_field, *job.span(k))
        answers = self.answers([r["text"] for r in rows])
        records = [{**{key: r[key] for key in ("row", "id") if key in r}, **a}
                   for r, a in zip(rows, answers)]
        write_part(part_path(out, job, k), records, job.format)
        return len(records)


class PartActor:
    """One actor of `tinyt batch --ray`'s pool (batch_ray.py): the artifact loaded once, then
    the parts of each Ray Data batch ({"part": [k, ...]}) run and written."""

    def __init__(self, job: dict[str, Any], out: str, threads: int | None):
        self.runner, self.out = Runner(Job(**job), threads=threads), Path(out)

    def __call__(self, batch: dict[str, Any]) -> dict[str, list]:
        parts = [int(k) for k in batch["part"]]
        rows = [self.runner.run_part(self.out, k) for k in parts]
        return {"part": parts, "rows": rows}


def write_part(path: Path, records: list[dict[str, Any]], fmt: str) -> None:
    """`records` to `path` through a temporary name in the same folder and a rename: a
    reader, or a restart, sees the whole part or none of it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(records), tmp)
    else:
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


def plan(artifact: Path, input_path: Path, out: Path, *, task: str, text_field: str = "text",
         id_field: str = "id", part_rows: int = PART_ROWS, fmt: str = "jsonl",
         options: dict[str, Any] | None = None) -> tuple[Job, list[int]]:
    """The job, written to (or checked against) OUT/batch.json, and the parts still to run;
    temporary files a crash left are removed."""
    if task not in TASKS:
        raise ConfigError(f"--task {task!r}: choose one of {', '.join(TASKS)}")
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if not (isinstance(part_rows, int) and part_rows >= 1):
        raise ConfigError(f"--part-rows {part_rows!r} must be an integer >= 1")
    if not (artifact / "manifest.json").is_file():
        raise ConfigError(f"{artifact} is not an artifact directory (no manifest.json)")
    if not input_path.is_file():
        raise ConfigError(f"--input {input_path} does not exist")
    job = Job(str(artifact.resolve()), sha256_file(artifact / "manifest.json"),
              str(input_path.resolve()), count_rows(input_path), task, text_field, id_field,
              part_rows, fmt, dict(options or {}))
    out.mkdir(parents=True, exist_ok=True)
    stored = out / JOB
    if stored.exists():
        before = json.loads(stored.read_text())
        if before != asdict(job):
            diff = sorted(k for k in before.keys() | asdict(job).keys()
                          if before.get(k) != asdict(job).get(k))
            raise ConfigError(f"{out} holds another batch (its {JOB} differs in "
                              f"{', '.join(diff)}): give a new --output, or remove {out}")
    else:
        tmp = stored.with_name(f".{JOB}.tmp")
        tmp.write_text(json.dumps(asdict(job), indent=1) + "\n")
        os.replace(tmp, stored)
    for leftover in out.glob(".part-*.tmp"):
        leftover.unlink()
    todo = [k for k in range(job.parts) if not part_path(out, job, k).exists()]
    return job, todo


def progress(job: Job, done: int, rows: int, t0: float, log: Callable[[str], None]) -> None:
    rate = rows / max(time.perf_counter() - t0, 1e-9)
    log(f"tinyt batch: {done}/{job.parts} parts ({rows} rows this run, {rate:.1f} rows/s)")


def run_local(job: Job, out: Path, todo: list[int], *, threads: int | None = 1,
              log: Callable[[str], None] = print) -> int:
    """The parts in `todo` run in this process, one after another; rows written."""
    runner = Runner(job, threads=threads)
    done, rows, t0 = job.parts - len(todo), 0, time.perf_counter()
    for k in todo:
        rows += runner.run_part(out, k)
        done += 1
        progress(job, done, rows, t0, log)
    return rows


def batch(artifact, input_path, out, *, task: str, ray_address: str | None = None,
          actors: int = 1, threads: int | None = 1, log: Callable[[str], None] | None = None,
          **how: Any) -> dict[str, Any]:
    """Run `task` over INPUT into OUT (see the module); `ray_address` runs the parts on Ray
    Data ('local': a new local cluster), `actors` of them at once. Returns a summary."""
    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    out = Path(out)
    job, todo = plan(Path(artifact), Path(input_path), out, task=task, **how)
    log(f"tinyt batch: {job.rows} rows in {job.parts} parts, {len(todo)} to run "
        f"({job.parts - len(todo)} done before)")
    t0 = time.perf_counter()
    if ray_address is None:
        rows = run_local(job, out, todo, threads=threads, log=log)
    else:
        from .batch_ray import run_ray

        done, t0 = [job.parts - len(todo), 0], time.perf_counter()

        def landed(n: int) -> None:
            done[0], done[1] = done[0] + 1, done[1] + n
            progress(job, done[0], done[1], t0, log)
        rows = run_ray(PartActor, asdict(job), out, todo, address=ray_address, actors=actors,
                       threads=threads, on_part=landed)
    missing = [k for k in range(job.parts) if not part_path(out, job, k).exists()]
    if missing:
        raise ConfigError(f"parts {missing[:5]} of {out} were not written; run again to "
                          "finish them")
    return {"rows": job.rows, "parts": job.parts, "ran": len(todo), "rows_run": rows,
            "seconds": time.perf_counter() - t0, "output": str(out)}


def read_output(out: Path) -> list[dict[str, Any]]:
    """Every output row of a finished batch, in input order (the tests' and users' reader)."""
    job = Job(**json.loads((Path(out) / JOB).read_text()))
    records: list[dict[str, Any]] = []
    for k in range(job.parts):
        path = part_path(Path(out), job, k)
        if job.format == "parquet":
            import pyarrow.parquet as pq

            records += pq.read_table(path).to_pylist()
        else:
            records += [json.loads(line) for line in path.read_text().splitlines()]
    return records
