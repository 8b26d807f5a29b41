"""`decide score`'s records too long for the csv module and json.loads, read in pieces.

A record up to MAX_RECORD_BYTES goes through Python's csv module or json.loads (C-fast, the
common case); a longer one comes here (issue 38: a legal 200 KB or 50 MB CSV field, a JSON line
with a 50 MB text). These readers keep only what an answer needs, the first `keep` characters of
the text (the caller passes more than the model's character budget, so the answer is the
protocol's for the whole text, `truncated: true`) and an id of at most MAX_ID_CHARS, skip every
other field, and find where the record ends with bytes.find / regular expressions over pieces of
at most 1 MiB, so memory stays bounded whatever the record's size.

They follow the fast path's rules exactly — csv.reader(strict=True) with the default dialect,
json.loads — so a record gives the same fields, or the same kind of error, whichever path reads
it (tests/test_score_records.py compares the two on generated records, cut into tiny pieces).
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from runtime.protocol import DEFAULT_MAX_LINE_BYTES, MAX_INT_DIGITS

PIECE_BYTES = 1 << 20  # how much of a record is looked at at once
MAX_ID_CHARS = DEFAULT_MAX_LINE_BYTES  # an id longer than any line the fast path reads is refused
MAX_DEPTH = 1000  # JSON nesting: about where json.loads's recursion gives up
MAX_NAME_CHARS = 1024  # a longer JSON field name is no column anyone names

_NONSPACE = re.compile(r"\S")  # str.isspace's notion of whitespace, as str.strip uses


class Prefix:
    """The first `limit` characters of a value that arrives in pieces, and what the rest of it
    tells the checks the protocol makes on the whole text: whether there was more (`cut`) and,
    when the kept characters are all whitespace, the first character that is not (`after`)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.parts: list[str] = []
        self.count = 0
        self.cut = False
        self.after = ""
        self._blank: bool | None = None  # whether the kept characters are all whitespace (once cut)

    def add(self, text: str) -> None:
        """Take the next piece of the value."""
        if self.count < self.limit:
            taken = text[:self.limit - self.count]
            self.parts.append(taken)
            self.count += len(taken)
            text = text[len(taken):]
        if not text:
            return
        self.cut = True
        if self._blank is None:
            self._blank = not "".join(self.parts).strip()
        if self._blank and not self.after and (found := _NONSPACE.search(text)):
            self.after = found.group()

    def value(self) -> str:
        """The kept characters (plus `after`: a text that is blank only as far as it was kept is
        not an empty text; the model never reads that far)."""
        return "".join(self.parts) + self.after


def clip(text: str, keep: int) -> str:
    """`text` as a long-record reader keeps it: what the model can read, and the checks on the
    whole text still give the same answer (see Prefix)."""
    if len(text) <= keep:
        return text
    prefix = Prefix(keep)
    prefix.add(text)
    return prefix.value()


# --- CSV ----------------------------------------------------------------------------------------

_START_RECORD, _START_FIELD, _IN_FIELD, _IN_QUOTED, _QUOTE_IN_QUOTED, _EAT_CRNL = range(6)
_NEWLINE_IN_FIELD = ("new-line character seen in unquoted field - do you need to open the file in "
                     "universal-newline mode?")  # csv's own words


@dataclass
class CsvRecord:
    """One CSV record as csv.reader(strict=True) would read it, keeping only some fields."""

    values: dict[int, Prefix]  # the kept fields (by column index) that the record has
    fields: int  # how many fields it has (up to the error, if any)
    error: str | None  # what csv.reader would raise
    size: int  # bytes read: the record with its newline (after an error: at least its first line)
    first_line: int  # bytes of its first physical line, newline included (where a broken record reads on)
    first_line_fields: int  # fields complete on its first line: those are trustworthy in a broken record


def read_csv_record(read: Callable[[], bytes], delimiter: str, keep: dict[int, int]) -> CsvRecord | None:
    """Parse one record from `read` (successive pieces of the input, each at most one physical
    line, b"" at the end: a file's readline(PIECE_BYTES)); `keep`: column index → characters to
    keep. None at the end of the input. After an error the rest of the first line is read, so
    `first_line` is always known."""
    parser = _CsvParser(ord(delimiter), keep)
    while True:
        piece = read()
        if not piece:
            return parser.end()
        if parser.feed(piece):
            return parser.record()
        if parser.error is not None:
            while parser.first_line is None:
                piece = read()
                parser.size += len(piece)
                if not piece or piece.endswith(b"\n"):
                    parser.first_line = parser.size
            return parser.record()


class _CsvParser:
    """csv's state machine (Modules/_csv.c, parse_process_char) for the default dialect in
    strict mode, stepping from delimiter to quote to newline with find/regex instead of by
    character. Works on bytes: a delimiter, quote, CR or LF byte is never part of a UTF-8
    sequence, so only the kept fields are decoded."""

    def __init__(self, delimiter: int, keep: dict[int, int]):
        self.delimiter = delimiter
        self.stops = re.compile(b"[" + re.escape(bytes([delimiter])) + b"\r\n]")
        self.keep = keep
        self.values: dict[int, Prefix] = {}
        self.state = _START_RECORD
        self.fields = 0
        self.size = 0
        self.first_line: int | None = None
        self.first_line_fields = 0
        self.error: str | None = None
        self._prefix: Prefix | None = None
        self._decoder: Any = None

    def record(self) -> CsvRecord:
        """What was parsed (a record that ends without a newline: its one line is its first)."""
        if self.first_line is None:
            self.first_line_fields = self.fields
            self.first_line = self.size
        return CsvRecord(self.values, self.fields, self.error, self.size, self.first_line, self.first_line_fields)

    def end(self) -> CsvRecord | None:
        """The input ended: csv's end-of-line step, then its end of data."""
        if self.state == _START_RECORD and self.size == 0:
            return None
        if self.state == _IN_QUOTED:
            self.error = "unexpected end of data"
        elif self.state in (_START_FIELD, _IN_FIELD, _QUOTE_IN_QUOTED):
            if self.state == _START_FIELD:  # after a delimiter: an empty last field
                self._start_field()
            self._end_field()
        return self.record()

    def _start_field(self) -> None:
        limit = self.keep.get(self.fields)
        if limit is not None:
            self._prefix = Prefix(limit)
            self._decoder = codecs.getincrementaldecoder("utf-8")()

    def _add(self, data: bytes) -> None:
        if self._prefix is not None and data:
            self._prefix.add(self._decoder.decode(data))

    def _end_field(self) -> None:
        if self._prefix is not None:
            self._prefix.add(self._decoder.decode(b"", final=True))
            self.values[self.fields] = self._prefix
            self._prefix = None
        self.fields += 1

    def feed(self, piece: bytes) -> bool:
        """Parse one piece; True when the record ended with it (it always ends at a newline,
        which ends a piece), False when it goes on or `error` is set."""
        i, n = 0, len(piece)
        self.size += n
        quote, delimiter = 0x22, self.delimiter
        while i < n:
            state = self.state
            if state == _START_RECORD:
                if piece[i] in b"\r\n":
                    self.state = _EAT_CRNL  # a blank line: a record of no fields
                    continue
                self.state = state = _START_FIELD
            if state == _START_FIELD:
                self._start_field()
                if piece[i] == quote:
                    self.state = _IN_QUOTED
                    i += 1
                    continue
                self.state = state = _IN_FIELD
            if state == _IN_FIELD:
                found = self.stops.search(piece, i)
                if found is None:
                    self._add(piece[i:])
                    break
                j = found.start()
                self._add(piece[i:j])
                self._end_field()
                i = j + 1
                self.state = _START_FIELD if piece[j] == delimiter else _EAT_CRNL
            elif state == _IN_QUOTED:
                j = piece.find(b'"', i)
                if j < 0:
                    self._add(piece[i:])
                    break
                self._add(piece[i:j])
                i = j + 1
                self.state = _QUOTE_IN_QUOTED
            elif state == _QUOTE_IN_QUOTED:
                c = piece[i]
                if c == quote:  # a doubled quote is one quote of the field
                    self._add(b'"')
                    self.state = _IN_QUOTED
                elif c == delimiter:
                    self._end_field()
                    self.state = _START_FIELD
                elif c in b"\r\n":
                    self._end_field()
                    self.state = _EAT_CRNL
                else:
                    self.error = f"'{chr(delimiter)}' expected after '\"'"  # csv's own words
                    break
                i += 1
            else:  # _EAT_CRNL: after CR or LF only more of them until the line ends
                if piece[i] not in b"\r\n":
                    self.error = _NEWLINE_IN_FIELD
                    break
                i += 1
        ended = piece.endswith(b"\n")
        if self.first_line is None and (ended or self.error is not None):
            self.first_line_fields = self.fields
            if ended:
                self.first_line = self.size
        if self.error is not None or not ended or self.state == _IN_QUOTED:
            return False
        self.state = _START_RECORD  # csv's end of line outside quotes: the record is complete
        return True


# --- JSON lines ---------------------------------------------------------------------------------

_WHITESPACE = re.compile(r"[ \t\n\r]*")  # json's whitespace
_STRING_BODY = re.compile(r'[^"\\\x00-\x1f]*(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})[^"\\\x00-\x1f]*)*')
_HIGH_SURROGATE_AT_END = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}\Z")
_SURROGATE = re.compile("[\ud800-\udfff]")  # in decoded text: pairs were joined, so any is lone
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_LITERALS = {"true": True, "false": False, "null": None}
_CONTAINER = {"{": dict, "[": list}


class JsonInvalid(ValueError):
    """The line is not valid JSON (what json.loads would refuse)."""


@dataclass
class JsonRecord:
    """The top-level fields of one JSON line that a record needs."""

    values: dict[str, Any] = field(default_factory=dict)  # id/text: a Prefix for strings, else the value
    lone_surrogate: dict[str, bool] = field(default_factory=dict)  # a string field's text is not valid Unicode
    error: str | None = None  # invalid JSON (values: what came before the error)
    is_object: bool = True  # False: valid JSON, but not an object


def read_json_record(pieces: Iterator[str], keep: dict[str, int], names: list[str] | None = None) -> JsonRecord | None:
    """Parse one JSON line given as successive pieces of text, keeping the top-level fields named
    in `keep` (name → characters to keep of a string value); other values are checked and skipped.
    None for a blank line. `names`: a list to append the top-level field names to (those of at
    most MAX_NAME_CHARS)."""
    scanner = _JsonScanner(pieces)
    record = JsonRecord()
    try:
        scanner.skip_whitespace()
        if not scanner.peek():
            return None
        if scanner.peek() != "{":
            scanner.skip_value()
            record.is_object = False
        else:
            scanner.take("{")
            _read_members(scanner, keep, record, names)
        scanner.skip_whitespace()
        if scanner.peek():
            raise JsonInvalid("Extra data")
    except JsonInvalid as exc:
        record.error = str(exc)
    return record


def _read_members(scanner: _JsonScanner, keep: dict[str, int], record: JsonRecord, names: list[str] | None) -> None:
    scanner.skip_whitespace()
    if scanner.peek() == "}":
        scanner.take("}")
        return
    longest = MAX_NAME_CHARS if names is not None else max(map(len, keep), default=0)
    while True:
        scanner.skip_whitespace()
        if scanner.peek() != '"':
            raise JsonInvalid("Expecting property name enclosed in double quotes")
        name, _ = scanner.string(longest + 1)
        scanner.skip_whitespace()
        scanner.take(":")
        scanner.skip_whitespace()
        key = name.value()
        if names is not None and not name.cut:
            names.append(key)
        if not name.cut and key in keep:  # a repeated name: the last one counts, as in json.loads
            if scanner.peek() == '"':
                record.values[key], record.lone_surrogate[key] = scanner.string(keep[key])
            else:
                record.values[key] = scanner.skip_value()
                record.lone_surrogate[key] = False
        else:
            scanner.skip_value()
        scanner.skip_whitespace()
        if scanner.peek() == "}":
            scanner.take("}")
            return
        scanner.take(",")


class _JsonScanner:
    """A JSON text read piece by piece: the buffer holds at most a piece and what is left of the one before."""

    def __init__(self, pieces: Iterator[str]):
        self._pieces = pieces
        self.buf = ""
        self.pos = 0
        self._ended = False

    def more(self) -> bool:
        """Append the next piece to what is left; False at the end of the text."""
        if self._ended:
            return False
        piece = next(self._pieces, None)
        if piece is None:
            self._ended = True
            return False
        self.buf = self.buf[self.pos:] + piece
        self.pos = 0
        return True

    def peek(self) -> str:
        """The next character ("" at the end)."""
        while self.pos >= len(self.buf):
            if not self.more():
                return ""
        return self.buf[self.pos]

    def take(self, char: str) -> None:
        """Step over `char`, which must come next."""
        if self.peek() != char:
            raise JsonInvalid(f"Expecting {char!r}" if self.peek() else "Unexpected end of the line")
        self.pos += 1

    def skip_whitespace(self) -> None:
        """Step over whitespace."""
        while True:
            self.pos = _WHITESPACE.match(self.buf, self.pos).end()
            if self.pos < len(self.buf) or not self.more():
                return

    def string(self, keep: int) -> tuple[Prefix, bool]:
        """A string (at its opening quote): its first `keep` characters, and whether it holds a
        lone surrogate (an escape json.loads decodes but that is not Unicode text)."""
        self.take('"')
        prefix, lone, carry = Prefix(keep), False, ""
        while True:
            end = _STRING_BODY.match(self.buf, self.pos).end()
            raw = carry + self.buf[self.pos:end]
            closed = end < len(self.buf) and self.buf[end] == '"'
            if not closed and end < len(self.buf) and not (self.buf[end] == "\\" and len(self.buf) - end < 6):
                bad = self.buf[end]
                raise JsonInvalid("Invalid \\escape" if bad == "\\" else "Invalid control character in a string")
            carry = ""
            if not closed and _HIGH_SURROGATE_AT_END.search(raw) and _escapes_at(raw, len(raw) - 6):
                raw, carry = raw[:-6], raw[-6:]  # its low half may start the next piece
            text = json.loads(f'"{raw}"') if "\\" in raw else raw
            lone = lone or _SURROGATE.search(text) is not None
            prefix.add(text)
            self.pos = end
            if closed:
                self.pos += 1
                return prefix, lone
            if not self.more():
                raise JsonInvalid("Unterminated string")

    def skip_value(self) -> Any:
        """Check and step over one value; returns it when it is a number or literal, an empty
        dict/list for an object/array (only its type matters to the caller), the Prefix of a string."""
        char = self.peek()
        if char == '"':
            return self.string(0)[0]
        if char in _CONTAINER:
            self._skip_container()
            return _CONTAINER[char]()
        return self._scalar()

    def _scalar(self) -> Any:
        while len(self.buf) - self.pos < 8 and self.more():  # a literal is never cut by the buffer's end
            pass
        word = next((w for w in _LITERALS if self.buf.startswith(w, self.pos)), None)
        if word is not None:
            self.pos += len(word)
            return _LITERALS[word]
        # A number may go on in the next piece: "1" "e+5" (up to two characters decide nothing yet).
        while (found := _NUMBER.match(self.buf, self.pos)) and found.end() + 2 >= len(self.buf) and self.more():
            if len(self.buf) - self.pos > PIECE_BYTES:  # digits are still bytes held: bound them too
                raise JsonInvalid("number longer than 1 MiB")
        if found is None:
            raise JsonInvalid("Expecting value")
        token = found.group()
        self.pos = found.end()
        digits = len(token.lstrip("-"))
        if found.group(1) is None and found.group(2) is None and digits > MAX_INT_DIGITS:
            raise JsonInvalid(f"integer of {digits} digits is too large")
        try:
            return json.loads(token)
        except ValueError as exc:  # a lower int conversion limit set for this interpreter
            raise JsonInvalid(str(exc)) from None

    def _skip_container(self) -> None:
        """Step over an object or array, nesting counted on a list instead of the stack."""
        closers: list[str] = []
        while True:  # at the start of a value inside the container (or of the container itself)
            char = self.peek()
            if char in _CONTAINER:
                self.pos += 1
                closers.append("}" if char == "{" else "]")
                if len(closers) > MAX_DEPTH:
                    raise JsonInvalid("nested too deeply")
                self.skip_whitespace()
                if self.peek() == closers[-1]:
                    self.pos += 1
                    closers.pop()
                elif closers[-1] == "}":
                    self._member_name()
                    continue
                else:
                    continue
            else:
                self.skip_value()
            while True:  # after a value: a comma, or the end of one or more containers
                if not closers:
                    return
                self.skip_whitespace()
                char = self.peek()
                if char == closers[-1]:
                    self.pos += 1
                    closers.pop()
                    continue
                self.take(",")
                if closers[-1] == "}":
                    self.skip_whitespace()
                    self._member_name()
                else:
                    self.skip_whitespace()
                break

    def _member_name(self) -> None:
        if self.peek() != '"':
            raise JsonInvalid("Expecting property name enclosed in double quotes")
        self.string(0)
        self.skip_whitespace()
        self.take(":")
        self.skip_whitespace()


def _escapes_at(raw: str, index: int) -> bool:
    """Whether the backslash at `index` starts an escape (it is preceded by an even run of them)."""
    run = 0
    while index - run - 1 >= 0 and raw[index - run - 1] == "\\":
        run += 1
    return run % 2 == 0
