"""A user's labelled file (CSV or JSONL) → validated examples, and the split every recipe uses.

Every problem with the file is a `DataError` whose message names the file, and the line and
column where that applies; the command line prints it as one stderr line and exits with 2.
Rows that are merely unusable (empty text, the same text under two labels) are skipped and
counted, never fatal. CSV dialects are sniffed (`,` `;` tab `|`), a UTF-8 BOM is dropped, and
quoted fields may span lines (line numbers then refer to where the record starts).

Optional columns: `lang` (the split is stratified per language, and metrics are reported per
language), `group` (rows sharing a group — translations, near-duplicates — land in the same
split, so the held-out figures are not inflated by a copy in the training data) and `kind`
(what a text is for `models evaluate`'s abstention figures, models/data/scope_metrics.py: `case`,
`unreadable`, or a non-case — `out_of_scope`, `resolved`, `noise` — whose label may be empty)
and `style` (how a text is written — plain, narrative, polite, handover, terse, typo or any
name of yours: `models evaluate` then reports the flag rates per style).
A file of negatives (`train --negatives`) needs no label column: every row is "not a case".
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import random
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from models.data.datasets import Example, Splits
from models.data.scope_metrics import KINDS, NON_CASES

LANG_COLUMN = "lang"
GROUP_COLUMN = "group"
KIND_COLUMN = "kind"
STYLE_COLUMN = "style"
NO_LANGUAGE = "und"  # BCP 47 "undetermined": a file without a lang column
VAL_SHARE = 0.1
TEST_SHARE = 0.1
# one example each for validation and test, and two to train on
MIN_EXAMPLES_PER_LABEL = 4


class DataError(Exception):
    """The user's data cannot be used; the message is the whole explanation (file, line, column)."""


@dataclass
class LoadedData:
    """Examples read from a file, with what was skipped and where they came from."""

    examples: list[Example]
    source: str
    sha256: str
    rows: int
    has_language: bool
    has_group: bool
    skipped: dict[str, int] = field(default_factory=dict)

    def provenance(self) -> dict:
        """What the manifest records about the data."""
        return {
            "file": self.source, "sha256": self.sha256, "rows": self.rows,
            "examples": len(self.examples), "skipped": dict(self.skipped),
            "labels": dict(sorted(Counter(e.label for e in self.examples).items())),
            "languages": (dict(sorted(Counter(e.language for e in self.examples).items()))
                          if self.has_language else {}),
            "groups": len({e.group for e in self.examples if e.group}) if self.has_group else 0,
        }


@dataclass(frozen=True)
class _Row:
    line: int
    text: object
    label: object
    language: str
    group: str
    kind: str = ""
    style: str = ""


def _decode(path: Path, raw: bytes) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise DataError(f"{path}: line {line}, byte {column}: not UTF-8 (save the file as UTF-8)") from None
    return text.removeprefix("\ufeff")


def _sniff_delimiter(sample: str) -> str:
    try:
        return csv.Sniffer().sniff(sample, delimiters=",;\t|").delimiter
    except csv.Error:
        return ","


def _read_csv(path: Path, text: str, text_column: str, label_column: str | None) -> tuple[list[_Row], set[str]]:
    delimiter = _sniff_delimiter(text[:20000])
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise DataError(f"{path}: empty file") from None
    except csv.Error as exc:
        raise DataError(f"{path}: line 1: cannot read the CSV header ({exc})") from None
    for column, option in ((text_column, "--text-column"), (label_column, "--label-column")):
        if column is not None and column not in header:
            raise DataError(f"{path}: line 1: no column {column!r} (columns: {', '.join(header)}); "
                            f"name it with {option}")
    index = {name: header.index(name) for name in header}
    rows = []
    start = reader.line_num + 1
    while True:
        try:
            fields = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            raise DataError(f"{path}: line {start}: {exc}") from None
        line, start = start, reader.line_num + 1
        if not fields or all(not f.strip() for f in fields):
            continue
        if len(fields) < len(header):
            missing = header[len(fields)]
            raise DataError(f"{path}: line {line}, column {missing!r}: {len(fields)} fields, the header has "
                            f"{len(header)} (a {delimiter!r} inside a text needs quotes)")
        values = {name: fields[i] for name, i in index.items()}  # a repeated header name: its first column
        rows.append(_Row(line, values[text_column], values[label_column] if label_column is not None else None,
                         values.get(LANG_COLUMN, "").strip(), values.get(GROUP_COLUMN, "").strip(),
                         values.get(KIND_COLUMN, "").strip(), values.get(STYLE_COLUMN, "").strip()))
    return rows, set(header)


def _json_object(path: Path, line_no: int, line: str) -> dict:
    try:
        item = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise DataError(f"{path}: line {line_no}: not a JSON object ({exc.__class__.__name__})") from None
    if not isinstance(item, dict):
        raise DataError(f"{path}: line {line_no}: expected a JSON object, got {type(item).__name__}")
    return item


def _read_jsonl(path: Path, text: str, text_column: str, label_column: str | None) -> tuple[list[_Row], set[str]]:
    rows, columns = [], set()
    numbered = ((n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip())
    for line_no, item in ((n, _json_object(path, n, line)) for n, line in numbered):
        for column, option in ((text_column, "--text-column"), (label_column, "--label-column")):
            if column is not None and column not in item:
                raise DataError(f"{path}: line {line_no}: no key {column!r} (keys: {', '.join(item)}); "
                                f"name it with {option}")
        columns |= set(item)
        rows.append(_Row(line_no, item[text_column], item[label_column] if label_column is not None else None,
                         str(item.get(LANG_COLUMN) or "").strip(), str(item.get(GROUP_COLUMN) or "").strip(),
                         str(item.get(KIND_COLUMN) or "").strip(), str(item.get(STYLE_COLUMN) or "").strip()))
    if not rows:
        raise DataError(f"{path}: empty file")
    return rows, columns


def _kind(path: Path, row: _Row) -> str:
    if row.kind and row.kind not in KINDS:
        raise DataError(f"{path}: line {row.line}, column {KIND_COLUMN!r}: unknown kind {row.kind!r} "
                        f"(kinds: {', '.join(KINDS)})")
    return row.kind


def _label_string(path: Path, row: _Row, column: str, for_training: bool = True) -> str:
    value = row.label
    if not for_training and _kind(path, row) in NON_CASES and (value is None or not str(value).strip()):
        return ""  # a non-case in an evaluation file: no right label, only "was it flagged"
    if isinstance(value, bool) or value is None or isinstance(value, (list, dict)):
        raise DataError(f"{path}: line {row.line}, column {column!r}: label must be a string or a number, "
                        f"got {json.dumps(value)}")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    label = str(value).strip()
    if not label:
        raise DataError(f"{path}: line {row.line}, column {column!r}: empty label")
    return label


def _looks_numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def read_labelled_file(path: Path | str, text_column: str = "text", label_column: str = "label",
                       for_training: bool = True, label: str | None = None) -> LoadedData:
    """Read and validate a CSV or JSONL file of labelled texts (see the module docstring).

    for_training=False (evaluation data) skips the checks that only splitting needs: at least
    2 labels and MIN_EXAMPLES_PER_LABEL per label. `label`: every row gets this label and the
    file needs no label column (a file of negatives).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    raw = path.read_bytes()
    sha256 = hashlib.sha256(raw).hexdigest()
    text = _decode(path, raw)
    if not text.strip():
        raise DataError(f"{path}: empty file")
    is_jsonl = path.suffix.lower() in (".jsonl", ".ndjson") or text.lstrip().startswith("{")
    reader = _read_jsonl if is_jsonl else _read_csv
    rows, columns = reader(path, text, text_column, None if label is not None else label_column)
    if not rows:
        raise DataError(f"{path}: no data rows after the header")

    skipped: Counter = Counter()
    texts: list[tuple[_Row, str, str]] = []
    for row in rows:
        if not isinstance(row.text, str):
            raise DataError(f"{path}: line {row.line}, column {text_column!r}: text must be a string, "
                            f"got {json.dumps(row.text)}")
        body = " ".join(row.text.split())
        row_label = label if label is not None else _label_string(path, row, label_column, for_training)
        _kind(path, row)
        if not body:
            skipped["empty text"] += 1
            continue
        texts.append((row, body, row_label))
    if not texts:
        raise DataError(f"{path}: column {text_column!r} is empty in every row")
    numeric = [row for row, body, _ in texts if _looks_numeric(body)]
    if len(numeric) * 2 > len(texts):
        raise DataError(f"{path}: line {numeric[0].line}, column {text_column!r}: the text column holds numbers, "
                        f"not text ({len(numeric)} of {len(texts)} rows); name the text column with --text-column")

    examples = _unambiguous([Example(body, text_label, row.language or NO_LANGUAGE, row.group, row.kind,
                                     row.style)
                             for row, body, text_label in texts], skipped)

    if not examples:
        raise DataError(f"{path}: no usable rows ({', '.join(f'{n} {why}' for why, n in skipped.items())})")
    has_group = GROUP_COLUMN in columns
    if for_training:
        check_splittable(examples, has_group, str(path), label_column)
    return LoadedData(examples, str(path), sha256, len(rows), LANG_COLUMN in columns, has_group, dict(skipped))


def check_splittable(examples: list[Example], has_group: bool, where: str, label_column: str = "label") -> None:
    """DataError unless there are ≥ 2 labels and every label has enough examples (groups) to split."""
    counts = Counter(e.label for e in examples)
    if len(counts) < 2:
        found = ", ".join(repr(label) for label in counts) or "none"
        raise DataError(f"{where}: column {label_column!r}: at least 2 labels are needed, found {len(counts)} ({found})")
    units = Counter(e.label for e in _units(examples, has_group))
    too_few = sorted(label for label, n in units.items() if n < MIN_EXAMPLES_PER_LABEL)
    if too_few:
        label = too_few[0]
        what = "groups" if has_group else "examples"
        raise DataError(f"{where}: column {label_column!r}: label {label!r} has {units[label]} {what}, "
                        f"{MIN_EXAMPLES_PER_LABEL} are needed to split it into train/validation/test"
                        + (f" ({len(too_few) - 1} more labels too few)" if len(too_few) > 1 else ""))


def _unambiguous(examples: list[Example], skipped: Counter) -> list[Example]:
    """The examples without texts seen under two labels (all dropped) and without repeats (the
    first kept), each left-out one counted in `skipped`."""
    labels_of: dict[str, set[str]] = defaultdict(set)
    for e in examples:
        labels_of[e.text].add(e.label)
    kept, seen = [], set()
    for e in examples:
        if len(labels_of[e.text]) > 1:
            skipped["same text under different labels"] += 1
        elif e.text in seen:
            skipped["exact duplicate"] += 1
        else:
            seen.add(e.text)
            kept.append(e)
    return kept


def join_loaded(parts: list[LoadedData]) -> LoadedData:
    """Several files' examples as one data set (a recipe's `dataset` + `extra_data`: other writers'
    rows). A text in two files is kept once; a text under two labels is dropped, as within a file."""
    if len(parts) == 1:
        return parts[0]
    skipped: Counter = Counter()
    for part in parts:
        skipped.update(part.skipped)
    examples = _unambiguous([e for part in parts for e in part.examples], skipped)
    sha256 = hashlib.sha256("".join(part.sha256 for part in parts).encode()).hexdigest()
    return LoadedData(examples, " + ".join(part.source for part in parts), sha256, sum(p.rows for p in parts),
                      all(p.has_language for p in parts), any(p.has_group for p in parts), dict(skipped))


def _units(examples: list[Example], by_group: bool = True) -> list[Example]:
    """One representative example per group (or per example when there is no group)."""
    seen, units = set(), []
    for example in examples:
        key = ("g", example.group) if (by_group and example.group) else ("t", example.text)
        if key not in seen:
            seen.add(key)
            units.append(example)
    return units


def _allocate(total: int, sizes: list[int], rng: random.Random) -> list[int]:
    """Split `total` over strata proportionally to `sizes` (largest remainder, ties broken at random)."""
    available = sum(sizes)
    if not available or not total:
        return [0] * len(sizes)
    exact = [total * size / available for size in sizes]
    counts = [min(int(e), size) for e, size in zip(exact, sizes)]
    order = sorted(range(len(sizes)), key=lambda i: (-(exact[i] - int(exact[i])), rng.random()))
    while sum(counts) < min(total, available):
        for i in order:
            if sum(counts) >= total:
                break
            if counts[i] < sizes[i]:
                counts[i] += 1
    return counts


def split_examples(examples: list[Example], seed: int, val_share: float = VAL_SHARE,
                   test_share: float = TEST_SHARE) -> Splits:
    """Train/validation/test split, stratified per label and, within a label, per language.

    Rows of one group go to the same split. Per label, the test and validation counts are shared
    out over the languages in proportion to their units (groups or single rows; largest
    remainder), so each language gets its share, and every label with at least
    MIN_EXAMPLES_PER_LABEL units gets at least one validation and one test unit.
    """
    members: dict[tuple[str, str], list[Example]] = defaultdict(list)
    for example in examples:
        key = ("g", example.group) if example.group else ("t", example.text)
        members[key].append(example)
    by_label: dict[str, dict[str, list[tuple[str, str]]]] = defaultdict(lambda: defaultdict(list))
    for key, rows in members.items():
        by_label[rows[0].label][rows[0].language].append(key)
    rng = random.Random(seed)
    train, val, test = [], [], []
    for label in sorted(by_label):
        per_language = by_label[label]
        languages = sorted(per_language)
        for language in languages:
            per_language[language].sort()
            rng.shuffle(per_language[language])
        sizes = [len(per_language[lang]) for lang in languages]
        n = sum(sizes)
        n_test = max(1, round(n * test_share)) if n >= MIN_EXAMPLES_PER_LABEL else 0
        n_val = max(1, round(n * val_share)) if n >= MIN_EXAMPLES_PER_LABEL else 0
        test_counts = _allocate(n_test, sizes, rng)
        val_counts = _allocate(n_val, [s - t for s, t in zip(sizes, test_counts)], rng)
        for language, n_t, n_v in zip(languages, test_counts, val_counts):
            keys = per_language[language]
            for position, key in enumerate(keys):
                target = test if position < n_t else val if position < n_t + n_v else train
                target += members[key]
    return Splits(train, val, test)
