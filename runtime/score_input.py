"""`decide score`'s input: CSV/TSV, JSON lines or Parquet (by extension), streamed one record at a time.

`open_source` checks everything that makes a whole file unusable before any work starts (it does
not exist or cannot be read, an unknown extension, a text or id column it does not have, a file
that is not UTF-8 or mixes encodings, Parquet without pyarrow) and raises InputError with one
line saying what and where. After that a bad record never stops the run: it comes back as a
Record with `error` set ("code: message", the protocol's codes) and becomes one error row.

Records are numbered from 1 (non-blank lines of JSON lines, data rows of CSV, rows of Parquet);
`Source.records` yields each with the input offset just after it (bytes, or rows for Parquet),
which is what a resumed run seeks to. Memory stays bounded whatever the file holds: a line or
field longer than MAX_RECORD_BYTES is skipped in 1 MiB steps and reported as line_too_long.
Stdlib only, except Parquet, which needs pyarrow (optional: `pip install 'decide-classifier[parquet]'`).
"""

from __future__ import annotations

import codecs
import csv
import hashlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from runtime.classifier import text_problem
from runtime.protocol import (
    DEFAULT_MAX_LINE_BYTES,
    INVALID_JSON,
    INVALID_REQUEST,
    LINE_TOO_LONG,
    MISSING_TEXT,
)

FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl",
           ".parquet": "parquet", ".pq": "parquet"}
MAX_RECORD_BYTES = DEFAULT_MAX_LINE_BYTES  # the protocol's longest line: 1 MiB
SNIFF_RECORDS = 1000  # JSON lines has no header: the first records show which fields exist
PARQUET_BATCH = 1024
MISSING_ID = "missing_id"
_CHUNK = 1 << 20
_FINGERPRINT_BYTES = 1 << 20


class InputError(Exception):
    """The input cannot be used as asked (exit 2): one line naming the file and the problem."""


@dataclass(frozen=True)
class Record:
    """One input record: its number (from 1), id, text, or why it cannot be classified."""

    number: int
    id: Any
    text: str | None
    error: str | None = None  # "code: message"


def input_format(path: Path, role: str = "INPUT") -> str:
    """csv, tsv, jsonl or parquet, from the file name's extension."""
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise InputError(f"{role} {path}: unknown extension {path.suffix or '(none)'!r}; use one of "
                         + ", ".join(sorted(FORMATS)))
    return fmt


def require_pyarrow() -> Any:
    """pyarrow.parquet, or InputError saying how to get it (it is not a runtime dependency)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        if getattr(sys, "frozen", False):
            raise InputError("Parquet is not available in the decide binary (pyarrow is not bundled): "
                             "convert the file to CSV or JSON lines, or run decide from source with pyarrow") from None
        raise InputError("Parquet needs pyarrow, which is not installed: pip install 'decide-classifier[parquet]' "
                         "(or pip install pyarrow), or use CSV or JSON lines") from None
    return pq


def fingerprint(path: Path) -> dict[str, Any]:
    """Size, modification time and a hash of the first and last MiB: a resumed run refuses a file
    that changed since the job started."""
    digest = hashlib.sha256()
    try:
        stat = path.stat()
        with open(path, "rb") as fh:
            digest.update(fh.read(_FINGERPRINT_BYTES))
            if stat.st_size > _FINGERPRINT_BYTES:
                fh.seek(max(_FINGERPRINT_BYTES, stat.st_size - _FINGERPRINT_BYTES))
                digest.update(fh.read())
    except OSError as exc:
        raise InputError(f"cannot read INPUT {path}: {exc.strerror or exc}") from exc
    return {"path": str(path.resolve()), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns,
            "sha256_ends": digest.hexdigest()}


def check_utf8(path: Path) -> None:
    """Read the whole file once (1 MiB at a time) and refuse it if it is not UTF-8: UTF-16/32, or
    a byte that is not UTF-8 anywhere (mixed encodings), with the line and byte offset. Cheap next
    to scoring (~1 s per GB) and it makes the answer the same wherever the bad byte is."""
    with open(path, "rb") as fh:
        head = fh.read(4)
        for bom, name in ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"),
                          (codecs.BOM_UTF16_LE, "UTF-16"), (codecs.BOM_UTF16_BE, "UTF-16")):
            if head.startswith(bom):
                raise InputError(f"INPUT {path} is {name} (byte order mark); decide score reads UTF-8: "
                                 f"convert it, e.g. iconv -f {name} -t UTF-8")
        fh.seek(0)
        decoder = codecs.getincrementaldecoder("utf-8")()
        offset = lines = 0
        utf8_line = None  # first line with non-ASCII UTF-8 text
        while True:
            chunk = fh.read(_CHUNK)
            pending = len(decoder.getstate()[0])
            if offset == 0 and b"\0" in chunk:
                raise InputError(f"INPUT {path} holds NUL bytes: it looks like UTF-16 or a binary file; "
                                 "decide score reads UTF-8 text")
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as exc:
                bad = max(0, exc.start - pending)
                line = lines + chunk[:bad].count(b"\n") + 1
                where = f"line {line} (byte {offset + bad})"
                if utf8_line is None and not chunk[:bad].isascii():
                    utf8_line = lines + 1 + chunk[:next(i for i, b in enumerate(chunk) if b >= 0x80)].count(b"\n")
                if utf8_line is not None and utf8_line < line:
                    raise InputError(f"INPUT {path} mixes encodings: UTF-8 text on line {utf8_line}, a byte that is "
                                     f"not UTF-8 on {where}; convert the file to UTF-8 first") from None
                raise InputError(f"INPUT {path} is not UTF-8: {where} ({exc.reason}); decide score reads UTF-8: "
                                 "convert it, e.g. iconv -f latin1 -t UTF-8") from None
            if not chunk:
                return
            if utf8_line is None and not chunk.isascii():
                first = next(i for i, byte in enumerate(chunk) if byte >= 0x80)
                utf8_line = lines + chunk[:first].count(b"\n") + 1
            lines += chunk.count(b"\n")
            offset += len(chunk)


def _bounded_lines(fh: IO[bytes]) -> Iterator[tuple[bytes | None, int]]:
    """(line, bytes it took) for each physical line; None for a line over MAX_RECORD_BYTES, whose
    rest is skipped 1 MiB at a time so that memory stays bounded."""
    while True:
        line = fh.readline(MAX_RECORD_BYTES + 1)
        if not line:
            return
        if len(line) <= MAX_RECORD_BYTES or line.endswith(b"\n"):
            yield line, len(line)
            continue
        used = len(line)
        while line and not line.endswith(b"\n"):
            line = fh.readline(_CHUNK)
            used += len(line)
        yield None, used


def _error(number: int, record_id: Any, code: str, message: str) -> Record:
    return Record(number, record_id, None, f"{code}: record {number}: {message}")


def checked_record(number: int, record_id: Any, text: Any, text_column: str) -> Record:
    """The record, or an error record when its text is not something the protocol classifies."""
    if text is None:
        return _error(number, record_id, MISSING_TEXT, f"no {text_column!r} value")
    problem = text_problem(text)
    if problem is not None:
        return _error(number, record_id, problem[0], f"{text_column!r}: {problem[1]}")
    return Record(number, record_id, text)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _jsonl_record(line: bytes, number: int, text_column: str, id_column: str | None) -> Record:
    """One JSON line → Record (ids: the id field, or the record number when id_column is None)."""
    try:
        data = json.loads(line, parse_constant=_reject_constant)
    except RecursionError:
        return _error(number, None, INVALID_JSON, "JSON nested too deeply")
    except ValueError as exc:
        return _error(number, None, INVALID_JSON, f"invalid JSON: {exc}")
    if not isinstance(data, dict):
        return _error(number, None, INVALID_REQUEST, "a record must be a JSON object")
    record_id: Any = number
    if id_column is not None:
        if id_column not in data:
            return _error(number, None, MISSING_ID, f"no {id_column!r} field")
        record_id = data[id_column]
        if isinstance(record_id, (dict, list)):
            return _error(number, None, INVALID_REQUEST, f"{id_column!r} must be a JSON scalar")
    if text_column not in data:
        return _error(number, record_id, MISSING_TEXT, f"no {text_column!r} field")
    return checked_record(number, record_id, data[text_column], text_column)


class _CsvLines:
    """Decoded physical lines for csv.reader, counting the bytes consumed (the resume offset) and
    flagging a line too long to keep, whose record then becomes line_too_long."""

    def __init__(self, fh: IO[bytes], offset: int):
        self.offset = offset
        self.overlong = False
        self._lines = _bounded_lines(fh)

    def __iter__(self) -> _CsvLines:
        return self

    def __next__(self) -> str:
        line, used = next(self._lines)
        at_start = self.offset == 0
        self.offset += used
        if line is None:
            self.overlong = True
            return "\n"
        if at_start and line.startswith(codecs.BOM_UTF8):
            line = line[len(codecs.BOM_UTF8):]
        return line.decode("utf-8")


@dataclass
class Source:
    """An input file checked by `open_source`; `records` streams it."""

    path: Path
    format: str
    text_column: str
    id_column: str | None  # None: ids are record numbers
    total: int  # bytes (CSV, JSON lines) or rows (Parquet): what offsets count
    id_type: Any = None  # Parquet: the id column's arrow type (kept in Parquet output)

    def records(self, start_number: int = 0, start_offset: int = 0) -> Iterator[tuple[Record, int]]:
        """(record, offset after it) from record start_number + 1 on, which starts at start_offset."""
        if self.format == "parquet":
            return self._parquet(start_number)
        if self.format == "jsonl":
            return self._jsonl(start_number, start_offset)
        return self._csv(start_number, start_offset)

    def _open(self) -> IO[bytes]:
        try:
            return open(self.path, "rb")
        except OSError as exc:
            raise InputError(f"cannot read INPUT {self.path}: {exc.strerror or exc}") from exc

    def _jsonl(self, number: int, offset: int) -> Iterator[tuple[Record, int]]:
        with self._open() as fh:
            fh.seek(offset)
            for line, used in _bounded_lines(fh):
                if line is not None and offset == 0 and line.startswith(codecs.BOM_UTF8):
                    line = line[len(codecs.BOM_UTF8):]
                offset += used
                if line is not None and not line.strip():
                    continue  # a blank line is not a record (as in the protocol)
                number += 1
                if line is None:
                    yield _error(number, None, LINE_TOO_LONG, f"longer than {MAX_RECORD_BYTES} bytes"), offset
                else:
                    yield _jsonl_record(line, number, self.text_column, self.id_column), offset

    def _csv(self, number: int, offset: int) -> Iterator[tuple[Record, int]]:
        with self._open() as fh:
            lines = _CsvLines(fh, 0)
            reader = csv.reader(lines, delimiter="\t" if self.format == "tsv" else ",")
            header = next(reader, None) or []
            if offset:
                fh.seek(offset)
                lines.offset = offset
            text_at = header.index(self.text_column)
            id_at = header.index(self.id_column) if self.id_column is not None else None
            while True:
                try:
                    row = next(reader)
                except StopIteration:
                    return
                except csv.Error as exc:
                    number += 1
                    lines.overlong = False
                    yield _error(number, None, INVALID_REQUEST, f"not CSV: {exc}"), lines.offset
                    continue
                if lines.overlong:
                    lines.overlong = False
                    number += 1
                    yield _error(number, None, LINE_TOO_LONG, f"longer than {MAX_RECORD_BYTES} bytes"), lines.offset
                    continue
                if not row:
                    continue  # a blank line
                number += 1
                record_id = number if id_at is None else (row[id_at] if id_at < len(row) else None)
                if len(row) != len(header):
                    yield _error(number, record_id, INVALID_REQUEST,
                                 f"{len(row)} fields, the header has {len(header)}"), lines.offset
                    continue
                yield checked_record(number, record_id, row[text_at], self.text_column), lines.offset

    def _parquet(self, start: int) -> Iterator[tuple[Record, int]]:
        parquet = _parquet_file(self.path)
        groups, row = [], 0
        for group in range(parquet.num_row_groups):
            rows = parquet.metadata.row_group(group).num_rows
            if row + rows <= start and not groups:
                row += rows  # a whole row group before the resume point: not read at all
                continue
            groups.append(group)
        columns = [self.text_column] + ([self.id_column] if self.id_column not in (None, self.text_column) else [])
        for batch in parquet.iter_batches(batch_size=PARQUET_BATCH, row_groups=groups, columns=columns):
            texts = batch.column(self.text_column).to_pylist()
            ids = batch.column(self.id_column).to_pylist() if self.id_column is not None else None
            for index, text in enumerate(texts):
                row += 1
                if row <= start:
                    continue
                record_id = row if ids is None else ids[index]
                if ids is not None and record_id is None:
                    yield _error(row, None, MISSING_ID, f"{self.id_column!r} is null"), row
                    continue
                yield checked_record(row, record_id, text, self.text_column), row


def _parquet_file(path: Path) -> Any:
    pq = require_pyarrow()
    try:
        return pq.ParquetFile(path)
    except OSError as exc:
        raise InputError(f"cannot read INPUT {path}: {exc.strerror or exc}") from exc
    except Exception as exc:  # pyarrow's own ArrowInvalid etc.: not a Parquet file
        raise InputError(f"cannot read INPUT {path} as Parquet: {exc}") from exc


def _choose_columns(path: Path, columns: list[str], text_column: str, id_column: str | None,
                    what: str) -> str | None:
    """Check the text column and pick the id column (None: record numbers) among `columns`."""
    shown = ", ".join(columns[:20]) + (", …" if len(columns) > 20 else "")
    if what == "field":
        shown += f" in the first {SNIFF_RECORDS} records"
    if text_column not in columns:
        raise InputError(f"INPUT {path} has no {what} {text_column!r} ({what}s: {shown or 'none'}); "
                         "choose one with --text-column")
    for name in (text_column, id_column):
        if name is not None and columns.count(name) > 1:
            raise InputError(f"INPUT {path} has {columns.count(name)} {what}s named {name!r}")
    if id_column is not None and id_column not in columns:
        raise InputError(f"INPUT {path} has no {what} {id_column!r} ({what}s: {shown}); choose one with "
                         "--id-column, or leave it out to number the records")
    if id_column is None and "id" in columns:
        return "id"
    return id_column


def _jsonl_fields(path: Path) -> list[str]:
    """Field names seen in the first SNIFF_RECORDS records (in first-seen order)."""
    seen: dict[str, None] = {}
    with open(path, "rb") as fh:
        count = 0
        for line, _ in _bounded_lines(fh):
            if line is None or not line.strip():
                continue
            count += 1
            try:
                data = json.loads(line.removeprefix(codecs.BOM_UTF8))
            except (ValueError, RecursionError):
                data = None
            if isinstance(data, dict):
                seen.update(dict.fromkeys(data))
            if count >= SNIFF_RECORDS:
                break
    return list(seen)


def _csv_header(path: Path, fmt: str) -> list[str]:
    with open(path, "rb") as fh:
        try:
            header = next(csv.reader(_CsvLines(fh, 0), delimiter="\t" if fmt == "tsv" else ","), None)
        except csv.Error as exc:
            raise InputError(f"INPUT {path}: the header row is not CSV: {exc}") from exc
    if not header:
        raise InputError(f"INPUT {path} is empty: a CSV file needs a header row naming its columns")
    return header


def open_source(path: Path, text_column: str = "text", id_column: str | None = None,
                check_encoding: bool = True) -> Source:
    """Check INPUT as a whole and return its Source. `id_column` None: the `id` column if there is
    one, else record numbers. check_encoding=False skips the UTF-8 pass (a resumed job whose input
    fingerprint matches was checked when it started)."""
    fmt = input_format(path)
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise InputError(f"cannot read INPUT {path}: {exc.strerror or exc}") from exc
    if fmt == "parquet":
        parquet = _parquet_file(path)
        schema = parquet.schema_arrow
        chosen = _choose_columns(path, list(schema.names), text_column, id_column, "column")
        _check_text_type(path, text_column, schema.field(text_column).type)
        id_type = schema.field(chosen).type if chosen is not None else None
        return Source(path, fmt, text_column, chosen, parquet.metadata.num_rows, id_type)
    if check_encoding:
        check_utf8(path)
    columns = _jsonl_fields(path) if fmt == "jsonl" else _csv_header(path, fmt)
    if fmt == "jsonl" and not columns and path.stat().st_size > 0:
        raise InputError(f"INPUT {path}: none of the first {SNIFF_RECORDS} lines is a JSON object; "
                         "decide score reads JSON lines (one object a line)")
    chosen = (_choose_columns(path, columns, text_column, id_column, "field" if fmt == "jsonl" else "column")
              if columns else id_column)
    return Source(path, fmt, text_column, chosen, path.stat().st_size)


def _check_text_type(path: Path, column: str, arrow_type: Any) -> None:
    import pyarrow as pa

    value_type = arrow_type.value_type if pa.types.is_dictionary(arrow_type) else arrow_type
    if not (pa.types.is_string(value_type) or pa.types.is_large_string(value_type)
            or getattr(pa.types, "is_string_view", lambda _: False)(value_type)):
        raise InputError(f"INPUT {path}: column {column!r} holds {arrow_type}, not text; choose the text "
                         "column with --text-column")
