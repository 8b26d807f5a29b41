"""decide score's readers: a record of any size is read, the same way whichever path reads it.

Records up to 1 MiB go through csv.reader / json.loads; longer ones through runtime/score/long.py,
which must read them exactly as those would (here: generated records, the long path fed pieces
of a few bytes so that every boundary falls everywhere). In-process and fast: no model needed."""

from __future__ import annotations

import csv
import io
import json
import random

import pytest

from runtime.score.long import Prefix, clip, read_csv_record, read_json_record
from runtime.score.records import csv_records, jsonl_records, read_csv_header

CSV_TOKENS = ["a", "b", "é", "雨", "😀", ",", '"', '""', "\n", "\r\n", "\r", " ", "\t", "x y"]


def csv_reference(data: bytes, delimiter: str) -> list:
    """What csv.reader(strict=True) reads record by record: (fields, bytes) or (error, bytes), up
    to its first error."""
    lines = io.BytesIO(data).readlines()
    used = 0

    def feed():
        nonlocal used
        for line in lines:
            used += len(line)
            yield line.decode("utf-8")

    reader = csv.reader(feed(), delimiter=delimiter, strict=True)
    out = []
    while True:
        before = used
        try:
            row = next(reader)
        except StopIteration:
            return out
        except csv.Error as exc:
            out.append((str(exc), None))
            return out
        out.append((row, used - before))


def long_path(data: bytes, delimiter: str, piece: int, keep: int = 1 << 20) -> list:
    fh = io.BytesIO(data)
    out = []
    while True:
        start = fh.tell()
        parsed = read_csv_record(lambda: fh.readline(piece), delimiter, {i: keep for i in range(64)})
        if parsed is None:
            return out
        if parsed.error is not None:
            out.append((parsed.error, None))
            return out
        out.append(([parsed.values[i].value() for i in range(parsed.fields)], parsed.size))
        fh.seek(start + parsed.size)


@pytest.mark.parametrize("delimiter", [",", "\t"])
def test_the_long_csv_path_reads_what_csv_reads(delimiter):
    rng = random.Random(38)
    for _ in range(3000):
        text = "".join(rng.choice(CSV_TOKENS) for _ in range(rng.randint(1, 30)))
        data = text.encode("utf-8")
        expected = csv_reference(data, delimiter)
        for piece in (1, 3, 1 << 20):
            assert long_path(data, delimiter, piece) == expected, (text, piece)


def pieces_of(data: bytes, size: int):
    fh = io.BytesIO(data)
    return lambda: fh.readline(size)


def test_a_long_csv_field_keeps_its_first_characters_and_says_it_was_cut():
    data = ('r1,"' + "Öl " * 1000 + '",tail\n').encode()
    parsed = read_csv_record(pieces_of(data, 7), ",", {1: 10})
    assert parsed.fields == 3 and parsed.error is None and parsed.size == len(data)
    assert parsed.values[1].value() == "Öl Öl Öl Ö" and parsed.values[1].cut and 0 not in parsed.values
    spaces = read_csv_record(pieces_of(b"r1," + b" " * 50 + b"x \n", 4), ",", {1: 10})
    assert spaces.values[1].value() == " " * 10 + "x"  # blank only as far as kept: not an empty text


def test_clip_keeps_what_the_checks_on_the_whole_text_need():
    assert clip("abc", 3) == "abc" and clip("abcd", 3) == "abc"
    assert clip("     x", 3) == "   x" and clip("      ", 3) == "   "
    prefix = Prefix(2)
    for piece in ("a", "bc", "d"):
        prefix.add(piece)
    assert prefix.value() == "ab" and prefix.cut


def json_values(maximum_depth: int, rng: random.Random):
    choice = rng.randrange(9 if maximum_depth else 6)
    if choice == 0:
        return rng.choice(["", "rain", "Öl\n\"q\"\\", "\ud83d\ude00 ok", "lone \ud800", "\udc00", "tab\tx", "\u2028"])
    if choice == 1:
        return rng.choice([0, -1, 10**30, 1.5, -2.5e-8, 1e300])
    if choice in (2, 3):
        return rng.choice([True, False, None])
    if choice in (4, 5):
        return " " * rng.randint(0, 3) + rng.choice(["x", "\u3000y", ""])
    if choice == 6:
        return [json_values(maximum_depth - 1, rng) for _ in range(rng.randint(0, 3))]
    return {rng.choice(["id", "text", "other", "t\u00e9xt"]): json_values(maximum_depth - 1, rng)
            for _ in range(rng.randint(0, 3))}


def json_lines(rng: random.Random) -> list[str]:
    lines = []
    for _ in range(2000):
        value = ({rng.choice(["id", "text", "other", "x"]): json_values(2, rng) for _ in range(rng.randint(0, 4))}
                 if rng.random() < 0.85 else json_values(2, rng))
        line = json.dumps(value, ensure_ascii=rng.random() < 0.5)
        if rng.random() < 0.3 and line:  # break it: a character dropped, doubled or replaced
            at = rng.randrange(len(line))
            line = line[:at] + rng.choice(["", line[at] * 2, "\\", '"', "{", "]", ",", "\x01", "\\u12", "1e"]) + line[at + 1:]
        lines.append(line)
    return lines


def test_the_long_json_path_reads_what_json_loads_reads():
    rng = random.Random(38)
    for line in json_lines(rng):
        try:
            data = json.loads(line, parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))
            error = None
        except ValueError as exc:
            data, error = None, exc
        for piece in (1, 5, 1 << 20):
            pieces = iter([line[i:i + piece] for i in range(0, len(line), piece)])
            parsed = read_json_record(pieces, {"id": 100, "text": 100})
            if not line.strip(" \t\n\r"):
                assert parsed is None
                continue
            assert (parsed.error is None) == (error is None), (line, piece, parsed.error, error)
            if error is not None:
                continue
            assert parsed.is_object == isinstance(data, dict), line
            if not parsed.is_object:
                continue
            for name in ("id", "text"):
                assert (name in parsed.values) == (name in data), line
                if name not in data:
                    continue
                got, want = parsed.values[name], data[name]
                if isinstance(want, str):
                    assert isinstance(got, Prefix) and got.value() == clip(want, 100), line
                    lone = any(0xD800 <= ord(c) <= 0xDFFF for c in want)
                    assert parsed.lone_surrogate[name] == lone, line
                elif isinstance(want, (dict, list)):
                    assert type(got) is type(want), line
                else:
                    assert got == want and type(got) is type(want), line


def test_json_numbers_nesting_and_strings_across_piece_boundaries():
    def read(line: str, piece: int = 2):
        return read_json_record(iter([line[i:i + piece] for i in range(0, len(line), piece)]), {"id": 50, "text": 50})

    assert read('{"id": ' + "1" * 4301 + ', "text": "x"}').error.startswith("integer of 4301 digits")
    assert read('{"id": ' + "1" * 4300 + ', "text": "x"}').values["id"] == int("1" * 4300)
    assert read('{"x": ' + "[" * 1001 + "]" * 1001 + "}").error == "nested too deeply"
    assert read('{"x": ' + "[" * 900 + "]" * 900 + ', "id": true}').values["id"] is True
    assert read(r'{"text": "\ud83d\ude00\ud83d"}', 1).values["text"].value() == "😀\ud83d"
    assert read(r'{"text": "a\\ud800"}', 1).lone_surrogate["text"] is False  # an escaped backslash, then text
    assert read('{"te\\u0078t": "named by an escape"}').values["text"].value() == "named by an escape"
    assert read('{"text": "a"} x').error == "Extra data" and read("[1, 2]").is_object is False
    assert read('{"text": 1, "text": "last one counts"}').values["text"].value() == "last one counts"


def records(reader) -> list[tuple]:
    return [(r.number, r.id, r.text, (r.error or "").split(":")[0], offset) for r, offset in reader]


def read_csv(data: bytes, record_bytes: int, keep: int = 40, delimiter: str = ",") -> list[tuple]:
    fh = io.BufferedReader(io.BytesIO(data))
    header, body = read_csv_header(fh, delimiter)
    fh.seek(body)
    return records(csv_records(fh, delimiter, header, "text", "id", keep, 0, body, record_bytes=record_bytes))


def test_a_csv_gives_the_same_records_through_either_path():
    rng = random.Random(7)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["id", "text", "n"])
    for i in range(400):
        text = " ".join(rng.choice(["rain", "Öl", '"quoted"', "a,b", "line\nbreak", "x" * rng.randint(0, 300)])
                        for _ in range(rng.randint(1, 6)))
        writer.writerow([f"r{i}", text, i] if i % 37 else [f"r{i}", text])  # some rows short of a field
    data = out.getvalue().encode()
    fast = read_csv(data, 1 << 20)
    assert read_csv(data, 64) == fast  # most records now take the long path
    assert [r[1] for r in fast] == [f"r{i}" for i in range(400)]
    assert {r[3] for r in fast} == {"", "invalid_request"} and all(len(r[2] or "") <= 41 for r in fast)


@pytest.mark.parametrize("record_bytes", [1 << 20, 16])
def test_broken_csv_quoting_is_one_error_row_with_its_id_and_reading_goes_on(record_bytes):
    data = (b'id,text\nr1,rain\nr2,"never closed\nr3,snow\nr4,"the ""end""" now\nr5,wind\nr6,"closed"\n'
            b'r7,"open to the end\nr8,sun\n')
    rows = read_csv(data, record_bytes)
    assert [(r[0], r[1], r[3]) for r in rows] == [
        (1, "r1", ""), (2, "r2", "invalid_request"), (3, "r3", ""), (4, "r4", "invalid_request"), (5, "r5", ""),
        (6, "r6", ""), (7, "r7", "invalid_request"), (8, "r8", "")]
    assert rows[-1][4] == len(data) and [r[2] for r in rows if r[2]] == ["rain", "snow", "wind", "closed", "sun"]


@pytest.mark.parametrize("record_bytes", [1 << 20, 8])
def test_a_csv_row_of_the_wrong_width_or_with_an_empty_id_keeps_what_id_it_has(record_bytes):
    data = b"id,text,n\nr1,rain\nr2,rain,1,2\n,rain,3\nr4,rain,4\n"
    rows = read_csv(data, record_bytes)
    assert [(r[1], r[3]) for r in rows] == [("r1", "invalid_request"), ("r2", "invalid_request"),
                                             ("", "missing_id"), ("r4", "")]


def read_jsonl(data: bytes, record_bytes: int, keep: int = 40) -> list[tuple]:
    return records(jsonl_records(io.BufferedReader(io.BytesIO(data)), "text", "id", keep, record_bytes=record_bytes))


def test_json_lines_give_the_same_records_through_either_path():
    lines = json_lines(random.Random(11))
    data = ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass")
    data = b"\n".join(line for line in data.split(b"\n") if _is_utf8(line)) + b"\n"
    fast = read_jsonl(data, 1 << 20)
    assert read_jsonl(data, 8) == fast
    assert {r[3] for r in fast} >= {"", "invalid_json", "invalid_request", "missing_id", "missing_text", "empty_text"}


def test_a_broken_json_line_keeps_its_id_when_the_id_came_first():
    data = (b'{"id": "r1", "text": "rain\n{"text": "x", "id": "r2"]\n{"text": "x" "id": "r3"}\n'
            b'{"id": "", "text": "x"}\n{"id": null, "text": "x"}\n')
    for record_bytes in (1 << 20, 8):
        assert [(r[1], r[3]) for r in read_jsonl(data, record_bytes)] == [
            ("r1", "invalid_json"), ("r2", "invalid_json"), (None, "invalid_json"), ("", "missing_id"),
            (None, "missing_id")]


def _is_utf8(line: bytes) -> bool:
    try:
        line.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
