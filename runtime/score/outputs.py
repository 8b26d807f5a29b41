"""`decide score`'s output: rows, the job's work directory of atomic part files, the final file.

While a job runs, OUTPUT does not exist (or keeps its old content under --overwrite); the work
goes to OUTPUT.parts/ next to it:

    job.json                                   what the job is: input fingerprint, columns, model,
                                               variant, --min-score, output format (written once)
    part-000000000001-000000050000@1234567.csv records 1 to 50000; the input offset after them

A part is written to a .tmp file, fsynced, renamed and its directory fsynced, so a part file that
exists is complete, and its name says where the input continues: a run killed at any point (even
SIGKILL) and started again with --resume keeps the parts, drops .tmp files, and reads on from
the last part's offset. No record is lost or written twice, without a separate checkpoint that
could disagree with the parts. At the end the parts are joined into OUTPUT.parts/assembled.tmp,
fsynced and renamed to OUTPUT in one step; then OUTPUT.parts/ is removed. A flock on the work
directory keeps a second run from writing the same job.

Every format has the same columns: the input's id column, label, leaning, score, abstained,
reason, truncated, error (a bad record: all but id and error empty). Parquet needs pyarrow.
"""

from __future__ import annotations

import csv
import fcntl
import io
import json
import os
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from runtime.engine.classifier import Answer
from runtime.score.inputs import require_pyarrow
from runtime.score.records import InputError

COLUMNS = ("label", "leaning", "score", "abstained", "reason", "truncated", "error")
EXTENSIONS = {"jsonl": "jsonl", "csv": "csv", "tsv": "tsv", "parquet": "parquet"}
JOB_FILE = "job.json"
JOB_FORMAT = 1
WORK_SUFFIX = ".parts"
_PART = re.compile(r"^part-(\d{12})-(\d{12})@(\d+)\.(jsonl|csv|tsv|parquet)$")
_JSON = json.JSONEncoder(ensure_ascii=False, default=str)  # default: Parquet ids such as dates

Row = tuple[Any, str | None, str | None, float | None, bool | None, str | None, bool | None, str | None]


def answer_row(record_id: Any, result: Answer) -> Row:
    """The output row of a classified record (score rounded like the protocol's)."""
    return (record_id, result.label, result.leaning, round(result.score, 6), result.abstained, result.reason,
            result.truncated, None)


def error_row(record_id: Any, error: str) -> Row:
    """The output row of a record that could not be classified."""
    return (record_id, None, None, None, None, None, None, error)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Write `path` so that it either exists complete or not at all (tmp, fsync, rename, fsync dir).
    A write that fails (a full disk, a file system gone read-only) removes its .tmp file where it
    can: it would hold the space a --resume needs."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        _failed(exc, tmp)
        raise
    _fsync_dir(path.parent)


def _failed(exc: BaseException, tmp: Path) -> None:
    """Clean up after a write into `tmp` failed; a write error names no file: name it."""
    if isinstance(exc, OSError) and exc.filename is None:
        exc.filename = str(tmp)
    try:
        tmp.unlink(missing_ok=True)
    except OSError:  # e.g. read-only now: --resume drops it (WorkDir.parts)
        pass


@dataclass(frozen=True)
class Layout:
    """How rows are written: format, the id column's name, and its Parquet type (None: text, or
    record numbers when the input has no id column)."""

    format: str  # jsonl, csv, tsv, parquet
    id_name: str
    id_type: Any = None
    numbered: bool = False  # ids are record numbers

    @property
    def header(self) -> tuple[str, ...]:
        """Column names, id first."""
        return (self.id_name, *COLUMNS)

    def write(self, fh: IO[bytes], rows: Sequence[Row], header: bool) -> None:
        """Serialise rows (CSV: the header first when asked)."""
        if self.format == "jsonl":
            names = self.header
            fh.write("".join(_JSON.encode(dict(zip(names, row))) + "\n" for row in rows).encode("utf-8"))
        elif self.format in ("csv", "tsv"):
            text = io.StringIO()
            writer = csv.writer(text, delimiter="\t" if self.format == "tsv" else ",", lineterminator="\n")
            if header:
                writer.writerow(self.header)
            writer.writerows(tuple(_csv_value(value) for value in row) for row in rows)
            fh.write(text.getvalue().encode("utf-8"))
        else:
            require_pyarrow().write_table(self.table(rows), fh)

    def schema(self) -> Any:
        """The Parquet schema of the output."""
        import pyarrow as pa

        id_type = self.id_type or (pa.int64() if self.numbered else pa.string())
        return pa.schema([(self.id_name, id_type), ("label", pa.string()), ("leaning", pa.string()),
                          ("score", pa.float64()), ("abstained", pa.bool_()), ("reason", pa.string()),
                          ("truncated", pa.bool_()), ("error", pa.string())])

    def table(self, rows: Sequence[Row]) -> Any:
        """Rows as a pyarrow Table with the output schema."""
        import pyarrow as pa

        columns = list(zip(*rows)) if rows else [[] for _ in self.header]
        ids = list(columns[0])
        if self.id_type is None and not self.numbered:  # text ids: JSON ids of other types as JSON text
            ids = [value if value is None or isinstance(value, str) else _JSON.encode(value) for value in ids]
        schema = self.schema()
        arrays = [pa.array(ids, type=schema.field(0).type)]
        arrays += [pa.array(list(column), type=schema.field(i + 1).type) for i, column in enumerate(columns[1:])]
        return pa.Table.from_arrays(arrays, schema=schema)


def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


@dataclass(frozen=True)
class Part:
    """One finished part file: records first..last (from 1), input offset after them."""

    path: Path
    first: int
    last: int
    offset: int


class WorkDir:
    """OUTPUT.parts/: the job file and its part files (see the module docstring)."""

    def __init__(self, output: Path):
        self.output = output
        self.path = output.with_name(output.name + WORK_SUFFIX)
        self._lock_fd: int | None = None

    def exists(self) -> bool:
        """True when an unfinished job is here."""
        return self.path.is_dir()

    def lock(self) -> None:
        """Hold the job for this process (released when it exits, also on SIGKILL)."""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise InputError(f"another decide score is writing {self.output} ({self.path} is locked)") from None
        self._lock_fd = fd

    def create(self, job: dict[str, Any]) -> None:
        """Make the directory with its job.json in one rename (so that OUTPUT.parts/ never exists
        without it) and lock it."""
        staging = self.path.with_name(self.path.name + ".tmp")
        try:
            if staging.exists():
                shutil.rmtree(staging)  # left by a run killed while creating it
            staging.mkdir()
        except OSError as exc:
            raise InputError(f"cannot create {staging}: {exc.strerror or exc}") from exc
        atomic_write(staging / JOB_FILE, lambda fh: fh.write(json.dumps(job, indent=1).encode("utf-8")))
        os.replace(staging, self.path)
        _fsync_dir(self.path.parent)
        self.lock()

    def read_job(self) -> dict[str, Any]:
        """job.json of the unfinished job (InputError if it is unreadable)."""
        path = self.path / JOB_FILE
        try:
            job = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InputError(f"{self.path} holds no readable {JOB_FILE} ({exc}); start again with --overwrite") from exc
        if not isinstance(job, dict) or job.get("format") != JOB_FORMAT:
            raise InputError(f"{path} is not a decide score job of this version; start again with --overwrite")
        return job

    def parts(self) -> list[Part]:
        """The finished parts, in order; drops .tmp files and anything after a gap (cannot happen
        with one writer, but a part that does not continue the previous one is never trusted)."""
        found: list[Part] = []
        for entry in sorted(self.path.iterdir()):
            match = _PART.match(entry.name)
            if entry.name.endswith(".tmp"):
                entry.unlink()
            elif match:
                found.append(Part(entry, int(match[1]), int(match[2]), int(match[3])))
        kept: list[Part] = []
        for part in found:
            if part.first == (kept[-1].last if kept else 0) + 1 and part.last >= part.first:
                kept.append(part)
            else:
                part.path.unlink()
        return kept

    def write_part(self, layout: Layout, first: int, last: int, offset: int, rows: Sequence[Row]) -> Part:
        """Write records first..last atomically as one part file."""
        path = self.path / f"part-{first:012d}-{last:012d}@{offset}.{EXTENSIONS[layout.format]}"
        atomic_write(path, lambda fh: layout.write(fh, rows, header=False))
        return Part(path, first, last, offset)

    def assemble(self, layout: Layout) -> int:
        """Join the parts into OUTPUT in one atomic rename; returns the number of rows."""
        parts = self.parts()

        def join(out: IO[bytes]) -> None:
            if layout.format == "parquet":
                pq = require_pyarrow()
                with pq.ParquetWriter(out, layout.schema()) as writer:
                    for part in parts:
                        writer.write_table(pq.read_table(part.path))
                return
            if layout.format in ("csv", "tsv"):
                layout.write(out, [], header=True)
            for part in parts:
                with open(part.path, "rb") as source:
                    shutil.copyfileobj(source, out, 1 << 20)

        tmp = self.path / "assembled.tmp"
        try:
            with open(tmp, "wb") as out:
                join(out)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.output)
        except BaseException as exc:
            _failed(exc, tmp)  # OUTPUT is untouched; the parts stay for --resume
            raise
        _fsync_dir(self.output.parent)
        return parts[-1].last if parts else 0

    def remove(self) -> None:
        """Delete the work directory (after assembly, or for --overwrite)."""
        shutil.rmtree(self.path)
