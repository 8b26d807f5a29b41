"""`decide score`'s records, one format at a time: JSON lines, CSV/TSV and Parquet columns → Record,
streamed whatever a record's size (a record longer than MAX_RECORD_BYTES goes through
runtime/score/long.py). A bad record is a Record with `error` set, never an exception; the file as a
whole is checked before by runtime/score/inputs.py. Stdlib only.
"""

from __future__ import annotations

import codecs
import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass
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

MAX_RECORD_BYTES = DEFAULT_MAX_LINE_BYTES  # the protocol's longest line: 1 MiB


MISSING_ID = "missing_id"




JSON_WHITESPACE_BYTES = b" \t\n\r"  # a line of only these is blank (what the protocol skips)


class InputError(Exception):
    """The input cannot be used as asked (exit 2): one line naming the file and the problem."""


@dataclass(frozen=True)
class Record:
    """One input record: its number (from 1), id, text, or why it cannot be classified."""

    number: int
    id: Any
    text: str | None
    error: str | None = None  # "code: message"


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


class LinePieces:
    """The rest of a physical line in pieces of at most PIECE_BYTES (after `first`), counting its bytes."""

    def __init__(self, fh: IO[bytes], first: bytes):
        self._fh = fh
        self._first: bytes | None = first
        self._ended = False
        self.used = 0

    def __iter__(self) -> LinePieces:
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


def decoded(pieces: Iterator[bytes], bom: bool) -> Iterator[str]:
    decoder = codecs.getincrementaldecoder("utf-8")()
    for piece in pieces:
        if bom:
            piece, bom = piece.removeprefix(codecs.BOM_UTF8), False
        yield decoder.decode(piece)
    yield decoder.decode(b"", final=True)


def jsonl_records(fh: IO[bytes], text_column: str, id_column: str | None, keep: int, number: int = 0,
                  offset: int = 0, record_bytes: int = MAX_RECORD_BYTES) -> Iterator[tuple[Record, int]]:
    """(record, offset after it) for each JSON line of `fh` from `offset` (where fh stands): lines up
    to `record_bytes` through json.loads, longer ones through long.py's reader."""
    fields = _json_fields(text_column, id_column, keep)
    while True:
        line = fh.readline(record_bytes + 1)
        if not line:
            return
        bom = offset == 0 and line.startswith(codecs.BOM_UTF8)
        if len(line) <= record_bytes or line.endswith(b"\n"):
            offset += len(line)
            if not line.strip(JSON_WHITESPACE_BYTES):
                continue  # a blank line is not a record (as in the protocol)
            number += 1
            yield _jsonl_record(line.removeprefix(codecs.BOM_UTF8) if bom else line, number, text_column,
                                id_column, keep), offset
            continue
        pieces = LinePieces(fh, line)
        parsed = read_json_record(decoded(pieces, bom), fields)
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
    """The record goes beyond the fast path's bound: read it again with long.py."""


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
    and broken ones through long.py's reader. A broken record (csv would raise) becomes an
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
        """A record long.py read: too long for the fast path, or broken."""
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


