"""`decide score`'s input: CSV/TSV, JSON lines or Parquet (by extension), streamed one record at a time.

`open_source` checks everything that makes a whole file unusable before any work starts (it does
not exist or cannot be read, an unknown extension, a text or id column it does not have, a file
that is not UTF-8 or mixes encodings, Parquet without pyarrow) and raises InputError with one
line saying what and where. After that a bad record never stops the run: it comes back as a
Record with `error` set ("code: message", the protocol's codes) and becomes one error row.

Records are numbered from 1 (non-blank lines of JSON lines, data rows of CSV, rows of Parquet);
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
import csv
import hashlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from runtime.engine.classifier import text_problem
from runtime.protocol import DEFAULT_MAX_LINE_BYTES, INVALID_JSON, INVALID_REQUEST, MISSING_TEXT
from runtime.score.long import (
    MAX_ID_CHARS,
    PIECE_BYTES,
    CsvRecord,
    JsonRecord,
    Prefix,
    clip,
    read_csv_record,
    read_json_record,
)

FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl",
           ".parquet": "parquet", ".pq": "parquet"}
MAX_RECORD_BYTES = DEFAULT_MAX_LINE_BYTES  # the protocol's longest line: 1 MiB
SNIFF_RECORDS = 1000  # JSON lines has no header: the first records show which fields exist
PARQUET_BATCH = 1024
MISSING_ID = "missing_id"
_CHUNK = 1 << 20
_JSON_WHITESPACE = b" \t\n\r"  # a line of only these is blank (what the protocol skips)
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


def _error(number: int, record_id: Any, code: str, message: str) -> Record:
    return Record(number, record_id, None, f"{code}: record {number}: {message}")


def checked_record(number: int, record_id: Any, text: Any, text_column: str, keep: int | None = None,
                   id_column: str | None = None, lone_surrogate: bool = False) -> Record:
    """The record, or an error record when its id is empty (`id_column`: the input has ids) or its
    text is not something the protocol classifies. `keep`: characters of the text to keep (see
    long.clip); `lone_surrogate`: the text had one beyond what was kept."""
    if id_column is not None and (record_id is None or record_id == ""):
        return _error(number, record_id, MISSING_ID, f"{id_column!r} is {'empty' if record_id == '' else 'null'}")
    if text is None:
        return _error(number, record_id, MISSING_TEXT, f"no {text_column!r} value")
    problem = text_problem(text)
    if problem is None and lone_surrogate:
        problem = (INVALID_REQUEST, "text is not valid Unicode (lone surrogates)")
    if problem is not None:
        return _error(number, record_id, problem[0], f"{text_column!r}: {problem[1]}")
    return Record(number, record_id, text if keep is None else clip(text, keep))


def arrow_texts(column: Any, keep: int) -> list[Any]:
    """A pyarrow text column as Python values, strings cut to keep + 1 characters in arrow (a 50 MB
    value never becomes a Python string); a value blank that far is taken whole (long.clip
    then decides, as for the other formats)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        return column.to_pylist()  # dictionary or other types: as they are (checked_record judges them)
    heads = pc.utf8_slice_codeunits(column, 0, keep + 1).to_pylist()
    for index, head in enumerate(heads):
        if head is not None and len(head) > keep and not head[:keep].strip():
            heads[index] = column[index].as_py()
    return heads


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _jsonl_record(line: bytes, number: int, text_column: str, id_column: str | None, keep: int) -> Record:
    """One JSON line → Record (ids: the id field, or the record number when id_column is None)."""
    try:
        data = json.loads(line, parse_constant=_reject_constant)
    except RecursionError:
        return _error(number, _salvaged_id(line, id_column), INVALID_JSON, "JSON nested too deeply")
    except ValueError as exc:
        return _error(number, _salvaged_id(line, id_column), INVALID_JSON, f"invalid JSON: {exc}")
    if not isinstance(data, dict):
        return _error(number, None, INVALID_REQUEST, "a record must be a JSON object")
    return _json_object_record(data, number, text_column, id_column, keep)


def _json_object_record(data: dict[str, Any], number: int, text_column: str, id_column: str | None, keep: int,
                        lone_surrogate: bool = False) -> Record:
    record_id: Any = number
    if id_column is not None:
        if id_column not in data:
            return _error(number, None, MISSING_ID, f"no {id_column!r} field")
        record_id = data[id_column]
        if isinstance(record_id, (dict, list)):
            return _error(number, None, INVALID_REQUEST, f"{id_column!r} must be a JSON scalar")
        if isinstance(record_id, Prefix):  # read by the long-line reader
            if record_id.cut:
                return _error(number, None, INVALID_REQUEST, f"{id_column!r} is longer than {MAX_ID_CHARS:,} characters")
            record_id = record_id.value()
    if text_column not in data:
        return _error(number, record_id, MISSING_TEXT, f"no {text_column!r} field")
    text = data[text_column]
    return checked_record(number, record_id, text.value() if isinstance(text, Prefix) else text, text_column, keep,
                          id_column, lone_surrogate)


def _json_fields(text_column: str, id_column: str | None, keep: int) -> dict[str, int]:
    """What the long-line reader keeps of a JSON record: name → characters."""
    fields = {text_column: keep}
    if id_column is not None:
        fields[id_column] = max(fields.get(id_column, 0), MAX_ID_CHARS)
    return fields


def _salvaged_id(line: bytes, id_column: str | None) -> Any:
    """The id of a line that is not valid JSON, when its field came complete before the error."""
    if id_column is None:
        return None
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return None
    parsed = read_json_record(iter([text.removeprefix("\ufeff")]), {id_column: MAX_ID_CHARS})
    return _read_id(parsed, id_column) if parsed is not None else None


def _read_id(parsed: JsonRecord, id_column: str | None) -> Any:
    """The id the long-line reader found before an error, if it is one an answer can carry."""
    value = parsed.values.get(id_column) if id_column is not None else None
    if isinstance(value, Prefix):
        return None if value.cut else value.value()
    return None if isinstance(value, (dict, list)) else value


class _LinePieces:
    """The rest of a physical line in pieces of at most PIECE_BYTES (after `first`), counting its bytes."""

    def __init__(self, fh: IO[bytes], first: bytes):
        self._fh = fh
        self._first: bytes | None = first
        self._ended = False
        self.used = 0

    def __iter__(self) -> _LinePieces:
        return self

    def __next__(self) -> bytes:
        if self._ended:
            raise StopIteration
        piece, self._first = self._first or self._fh.readline(PIECE_BYTES), None
        self._ended = not piece or piece.endswith(b"\n")
        if not piece:
            raise StopIteration
        self.used += len(piece)
        return piece


def _decoded(pieces: Iterator[bytes], bom: bool) -> Iterator[str]:
    decoder = codecs.getincrementaldecoder("utf-8")()
    for piece in pieces:
        if bom:
            piece, bom = piece.removeprefix(codecs.BOM_UTF8), False
        yield decoder.decode(piece)
    yield decoder.decode(b"", final=True)


def jsonl_records(fh: IO[bytes], text_column: str, id_column: str | None, keep: int, number: int = 0,
                  offset: int = 0, record_bytes: int = MAX_RECORD_BYTES) -> Iterator[tuple[Record, int]]:
    """(record, offset after it) for each JSON line of `fh` from `offset` (where fh stands): lines up
    to `record_bytes` through json.loads, longer ones through score_long's reader."""
    fields = _json_fields(text_column, id_column, keep)
    while True:
        line = fh.readline(record_bytes + 1)
        if not line:
            return
        bom = offset == 0 and line.startswith(codecs.BOM_UTF8)
        if len(line) <= record_bytes or line.endswith(b"\n"):
            offset += len(line)
            if not line.strip(_JSON_WHITESPACE):
                continue  # a blank line is not a record (as in the protocol)
            number += 1
            yield _jsonl_record(line.removeprefix(codecs.BOM_UTF8) if bom else line, number, text_column,
                                id_column, keep), offset
            continue
        pieces = _LinePieces(fh, line)
        parsed = read_json_record(_decoded(pieces, bom), fields)
        for _ in pieces:  # what follows an error
            pass
        offset += pieces.used
        if parsed is None:
            continue
        number += 1
        yield _long_json_record(parsed, number, text_column, id_column, keep), offset


def _long_json_record(parsed: JsonRecord, number: int, text_column: str, id_column: str | None,
                      keep: int) -> Record:
    if parsed.error is not None:
        return _error(number, _read_id(parsed, id_column), INVALID_JSON, f"invalid JSON: {parsed.error}")
    if not parsed.is_object:
        return _error(number, None, INVALID_REQUEST, "a record must be a JSON object")
    return _json_object_record(parsed.values, number, text_column, id_column, keep,
                               parsed.lone_surrogate.get(text_column, False))


class _LongRecord(Exception):
    """The record goes beyond the fast path's bound: read it again with score_long."""


class _CsvLines:
    """Decoded physical lines for csv.reader, counting the bytes consumed (the resume offset);
    raises _LongRecord once the record being read goes beyond `record_bytes`."""

    def __init__(self, fh: IO[bytes], offset: int, record_bytes: int):
        self.fh = fh
        self.offset = offset
        self.record_bytes = record_bytes
        self._used = 0

    def begin(self) -> int:
        """A record starts here: its offset."""
        self._used = 0
        return self.offset

    def __iter__(self) -> _CsvLines:
        return self

    def __next__(self) -> str:
        line = self.fh.readline(self.record_bytes - self._used + 1)
        if not line:
            raise StopIteration
        at_start = self.offset == 0
        self._used += len(line)
        self.offset += len(line)
        if self._used > self.record_bytes:
            raise _LongRecord
        if at_start and line.startswith(codecs.BOM_UTF8):
            line = line[len(codecs.BOM_UTF8):]
        return line.decode("utf-8")


def read_csv_header(fh: IO[bytes], delimiter: str) -> tuple[list[str], int]:
    """The header row of a CSV/TSV file (fh at its start) and the offset after it; ValueError
    when it is not CSV or longer than MAX_RECORD_BYTES."""
    lines = _CsvLines(fh, 0, MAX_RECORD_BYTES)
    try:
        header = next(csv.reader(lines, delimiter=delimiter, strict=True), None)
    except csv.Error as exc:
        raise ValueError(f"the header row is not CSV: {exc}") from None
    except _LongRecord:
        raise ValueError(f"the header row is longer than {MAX_RECORD_BYTES:,} bytes") from None
    return header or [], lines.offset


def csv_records(fh: IO[bytes], delimiter: str, header: list[str], text_column: str, id_column: str | None,
                keep: int, number: int = 0, offset: int = 0,
                record_bytes: int = MAX_RECORD_BYTES) -> Iterator[tuple[Record, int]]:
    """(record, offset after it) for each record of a CSV/TSV body from `offset` (where fh stands,
    after the header): records up to `record_bytes` through csv.reader(strict=True), longer ones
    and broken ones through score_long's reader. A broken record (csv would raise) becomes an
    error row, and reading goes on from the line after its first: an unclosed quote swallows no
    records that follow."""
    columns = _CsvColumns(header, text_column, id_column, keep)
    if csv.field_size_limit() < record_bytes:  # process-wide; a field of a record that fits is fine
        csv.field_size_limit(record_bytes)
    lines = _CsvLines(fh, offset, record_bytes)
    reader = csv.reader(lines, delimiter=delimiter, strict=True)
    while True:
        start = lines.begin()
        try:
            row = next(reader)
        except StopIteration:
            return
        except (csv.Error, _LongRecord):
            fh.seek(start)
            parsed = read_csv_record(lambda: fh.readline(PIECE_BYTES), delimiter, columns.keep)
            if parsed is None:
                return
            lines.offset = start + (parsed.first_line if parsed.error is not None else parsed.size)
            fh.seek(lines.offset)
            if parsed.error is None and parsed.fields == 0:
                continue  # a blank line
            number += 1
            yield columns.long_record(parsed, number), lines.offset
            continue
        if row:  # [] is a blank line
            number += 1
            yield columns.record(row, number), lines.offset


@dataclass
class _CsvColumns:
    """Where the text and id are in a CSV record, and how a row becomes a Record."""

    header: list[str]
    text_column: str
    id_column: str | None
    keep_chars: int

    def __post_init__(self) -> None:
        self.text_at = self.header.index(self.text_column)
        self.id_at = self.header.index(self.id_column) if self.id_column is not None else None
        self.keep = {self.text_at: self.keep_chars}
        if self.id_at is not None:
            self.keep[self.id_at] = max(self.keep.get(self.id_at, 0), MAX_ID_CHARS)

    def record(self, row: list[str], number: int) -> Record:
        """A row csv.reader read."""
        record_id = number if self.id_at is None else (row[self.id_at] if self.id_at < len(row) else None)
        if len(row) != len(self.header):
            return _error(number, record_id, INVALID_REQUEST, f"{len(row)} fields, the header has {len(self.header)}")
        return checked_record(number, record_id, row[self.text_at], self.text_column, self.keep_chars, self.id_column)

    def long_record(self, parsed: CsvRecord, number: int) -> Record:
        """A record score_long read: too long for the fast path, or broken."""
        record_id: Any = number
        if self.id_at is not None:
            prefix = parsed.values.get(self.id_at)
            if parsed.error is not None and self.id_at >= parsed.first_line_fields:
                prefix = None  # past a quote that broke: not to be trusted
            record_id = None if prefix is None or prefix.cut else prefix.value()
            if parsed.error is None and prefix is not None and prefix.cut:
                return _error(number, None, INVALID_REQUEST,
                              f"{self.id_column!r} is longer than {MAX_ID_CHARS:,} characters")
        if parsed.error is not None:
            note = " (read on from the line after its first)" if parsed.size > parsed.first_line else ""
            return _error(number, record_id, INVALID_REQUEST, f"not CSV: {parsed.error}{note}")
        if parsed.fields != len(self.header):
            return _error(number, record_id, INVALID_REQUEST, f"{parsed.fields} fields, the header has {len(self.header)}")
        return checked_record(number, record_id, parsed.values[self.text_at].value(), self.text_column,
                              self.keep_chars, self.id_column)


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
                if not line.strip(_JSON_WHITESPACE):
                    continue
                try:
                    data = json.loads(line.removeprefix(codecs.BOM_UTF8))
                except (ValueError, RecursionError):
                    data = None
                names = list(data) if isinstance(data, dict) else []
            else:  # a long line: its names, without holding it
                names = []
                pieces = _LinePieces(fh, line)
                parsed = read_json_record(_decoded(pieces, bom), {}, names)
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
