"""`decide score`'s input: CSV/TSV, JSON lines or Parquet (by extension), streamed one record at a time.

`open_source` checks everything that makes a whole file unusable before any work starts (it does
not exist or cannot be read, an unknown extension, a text or id column it does not have, a file
that is not UTF-8 or mixes encodings, Parquet without pyarrow) and raises InputError with one
line saying what and where. After that a bad record never stops the run: it comes back as a
Record with `error` set ("code: message", the protocol's codes) and becomes one error row.

Reading the records, one format at a time, is runtime/score/records.py. Records are numbered from 1 (non-blank lines of JSON lines, data rows of CSV, rows of Parquet);
`Source.records` yields each with the input offset just after it (bytes, or rows for Parquet),
which is what a resumed run seeks to. Every record is read whatever its size, and memory stays
bounded whatever the file holds: a record up to MAX_RECORD_BYTES goes through csv.reader or
json.loads, a longer one through runtime/score/long.py, which keeps only the first `keep`
characters of its text (more than the model reads, so the answer is the protocol's, truncated)
and its id. Every error record carries its id when the reader could read one (a CSV record whose
quoting breaks: from its first line; a JSON line that breaks: when the id came before the break),
and its record number in the message. Stdlib only, except Parquet, which needs pyarrow
(optional: `pip install 'decide-classifier[parquet]'`).
"""

from __future__ import annotations

import codecs
import hashlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from runtime.score.long import (
    PIECE_BYTES,
    read_json_record,
)
from runtime.score.records import (
    JSON_WHITESPACE_BYTES,
    MAX_RECORD_BYTES,
    InputError,
    LinePieces,
    Record,
    arrow_texts,
    checked_record,
    csv_records,
    decoded,
    jsonl_records,
    read_csv_header,
)

FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl",
           ".parquet": "parquet", ".pq": "parquet"}
SNIFF_RECORDS = 1000  # JSON lines has no header: the first records show which fields exist
PARQUET_BATCH = 1024
_CHUNK = 1 << 20
_FINGERPRINT_BYTES = 1 << 20


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


@dataclass
class Source:
    """An input file checked by `open_source`; `records` streams it."""

    path: Path
    format: str
    text_column: str
    id_column: str | None  # None: ids are record numbers
    total: int  # bytes (CSV, JSON lines) or rows (Parquet): what offsets count
    id_type: Any = None  # Parquet: the id column's arrow type (kept in Parquet output)

    def records(self, start_number: int = 0, start_offset: int = 0, *, keep: int) -> Iterator[tuple[Record, int]]:
        """(record, offset after it) from record start_number + 1 on, which starts at start_offset;
        `keep`: characters of each text kept (more than the model reads: long.clip)."""
        if self.format == "parquet":
            records = self._parquet(start_number, keep)
        else:
            records = self._lines(start_number, start_offset, keep)
        if self.id_column is None:  # ids are record numbers: error records have theirs too
            return ((record if record.id is not None else replace(record, id=record.number), offset)
                    for record, offset in records)
        return records

    def _open(self) -> IO[bytes]:
        try:
            return open(self.path, "rb", buffering=PIECE_BYTES)
        except OSError as exc:
            raise InputError(f"cannot read INPUT {self.path}: {exc.strerror or exc}") from exc

    def _lines(self, number: int, offset: int, keep: int) -> Iterator[tuple[Record, int]]:
        with self._open() as fh:
            if self.format == "jsonl":
                fh.seek(offset)
                records = jsonl_records(fh, self.text_column, self.id_column, keep, number, offset)
            else:
                delimiter = "\t" if self.format == "tsv" else ","
                try:
                    header, body = read_csv_header(fh, delimiter)
                except ValueError as exc:
                    raise InputError(f"INPUT {self.path}: {exc}") from None
                fh.seek(offset or body)
                records = csv_records(fh, delimiter, header, self.text_column, self.id_column, keep, number,
                                      offset or body)
            try:
                yield from records
            except UnicodeDecodeError as exc:  # checked when the job started: the file changed since
                raise InputError(f"INPUT {self.path} is no longer UTF-8 ({exc.reason}): it changed while "
                                 "being read") from None

    def _parquet(self, start: int, keep: int) -> Iterator[tuple[Record, int]]:
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
            texts = arrow_texts(batch.column(self.text_column), keep)
            ids = batch.column(self.id_column).to_pylist() if self.id_column is not None else None
            for index, text in enumerate(texts):
                row += 1
                if row <= start:
                    continue
                record_id = row if ids is None else ids[index]
                yield checked_record(row, record_id, text, self.text_column, keep, self.id_column), row


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
        while count < SNIFF_RECORDS and (line := fh.readline(MAX_RECORD_BYTES + 1)):
            bom = fh.tell() == len(line) and line.startswith(codecs.BOM_UTF8)
            if len(line) <= MAX_RECORD_BYTES or line.endswith(b"\n"):
                if not line.strip(JSON_WHITESPACE_BYTES):
                    continue
                try:
                    data = json.loads(line.removeprefix(codecs.BOM_UTF8))
                except (ValueError, RecursionError):
                    data = None
                names = list(data) if isinstance(data, dict) else []
            else:  # a long line: its names, without holding it
                names = []
                pieces = LinePieces(fh, line)
                parsed = read_json_record(decoded(pieces, bom), {}, names)
                for _ in pieces:
                    pass
                if parsed is None:
                    continue
            count += 1
            seen.update(dict.fromkeys(names))
    return list(seen)


def _csv_header(path: Path, fmt: str) -> list[str]:
    with open(path, "rb") as fh:
        try:
            header, _ = read_csv_header(fh, "\t" if fmt == "tsv" else ",")
        except ValueError as exc:
            raise InputError(f"INPUT {path}: {exc}") from None
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
