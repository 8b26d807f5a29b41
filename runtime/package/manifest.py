"""The manifest format: its dataclasses, the one reader that validates and builds them, and the one writer.

`read_manifest(data)` checks the type and value of every field the runtime trusts and builds the
`Manifest` in the same pass, so there is one definition of each field's rule and default (issue
26: a separate checker and parser disagreed on the golden tolerance's default, and
`expected_tolerance` was never checked). `write_manifest` (below) writes a manifest only after it
reads back through here, so the factory cannot publish what the runtime refuses.
Stdlib only (read before the CPU check).

Strings are capped and may hold no control characters: labels go into every answer line and
names into log lines (a 10 MB label made every answer 10 MB; a newline in a name forged log lines).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from runtime.package.abstain import DEFAULT_MAX_UNKNOWN_SHARE, AbstentionPolicy

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
DEFAULT_GOLDEN_TOLERANCE = 2e-3
MAX_LABELS = 1024
MAX_LABEL_CHARS = 100  # every answer carries every label (scores): this bounds an answer line
MAX_NAME_CHARS = 128  # name, version, variant names, precision, language codes, graph output names
MAX_TEXT_CHARS = 10_000  # description, weights_storage
MAX_PATH_CHARS = 255
MAX_LANGUAGES = 1000
# The most bytes a file of each kind may have (the manifest's "bytes" is checked against these;
# the files read into memory are read with this cap).
MAX_TOKENIZER_BYTES = 256 << 20
MAX_GOLDEN_BYTES = 16 << 20
MAX_GRAPH_BYTES = 1 << 34  # ONNX graphs and their external data (16 GiB)
_REQUIRED = object()


class PackageError(Exception):
    """A model package is missing, malformed or does not match its manifest."""


@dataclass(frozen=True)
class FileEntry:
    """One file of the package, with the checksum the runtime verifies before loading it."""

    file: str
    sha256: str
    bytes: int


@dataclass(frozen=True)
class Variant:
    """One runnable form of the model (FP32 or an int8 quantization)."""

    name: str  # e.g. "fp32", "int8-u8u8", "int8-u8s8"
    file: FileEntry  # the ONNX graph
    precision: str  # "fp32" or "int8": what the matrix multiplications compute in
    data_files: tuple[FileEntry, ...] = ()  # external-data files the graph references
    weights_storage: str = "fp32"  # how weights are stored on disk, e.g. "fp16" expanded at load
    quantization: dict[str, Any] | None = None  # settings used by the factory, None for fp32
    metrics: dict[str, Any] = field(default_factory=dict)  # accuracy/macro-F1 per language …
    golden_tolerance: float = DEFAULT_GOLDEN_TOLERANCE  # max |Δp| vs the FP32 reference on the golden set
    # max |Δp| vs the variant's own expected outputs in golden.jsonl ("expected"); None: the
    # package has none (older packages), selftest then checks the FP32 reference only
    expected_tolerance: float | None = None

    def files(self) -> tuple[FileEntry, ...]:
        """Every file the variant needs, graph first."""
        return (self.file, *self.data_files)


@dataclass(frozen=True)
class Manifest:
    """What a model package contains and where it came from."""

    name: str
    version: str
    labels: tuple[str, ...]
    languages: tuple[str, ...]
    max_length: int  # tokens, special tokens included
    tokenizer: FileEntry
    pad_id: int
    variants: dict[str, Variant]
    golden: FileEntry | None = None
    description: str = ""
    provenance: dict[str, Any] = field(default_factory=dict)
    # {"temperature": T, …}: the runtime divides logits by T before the softmax (fitted by the
    # factory on validation data so that scores mean what they say); absent = 1.0
    calibration: dict[str, Any] = field(default_factory=dict)
    # When an answer is not a decision (runtime/package/abstain.py): {"negative_labels": [...],
    # "max_unknown_share": x, "novelty": {"output": name, "thresholds": {variant: t}, …}, …};
    # absent = no negative labels, no novelty score, the default unreadable threshold
    abstention: dict[str, Any] = field(default_factory=dict)
    format: int = FORMAT_VERSION

    @property
    def temperature(self) -> float:
        """The softmax temperature the scores are calibrated with (1.0 when none was fitted)."""
        return float(self.calibration.get("temperature", 1.0))

    def novelty_output(self) -> str | None:
        """The graph output holding the novelty score, or None when the package has none."""
        novelty = self.abstention.get("novelty")
        return novelty["output"] if novelty else None

    def abstention_policy(self, variant: str, min_score: float | None = None) -> AbstentionPolicy:
        """The abstention policy of one variant (its novelty threshold), with --min-score."""
        novelty = self.abstention.get("novelty") or {}
        threshold = novelty.get("thresholds", {}).get(variant)
        return AbstentionPolicy(
            labels=self.labels, negative_labels=frozenset(self.abstention.get("negative_labels", ())),
            max_unknown_share=float(self.abstention.get("max_unknown_share", DEFAULT_MAX_UNKNOWN_SHARE)),
            novelty_threshold=None if threshold is None else float(threshold), min_score=min_score,
            negative_margin=float(self.abstention.get("negative_margin", 0.0)))

    def files(self) -> list[FileEntry]:
        """Every file the manifest lists (shared data files once), tokenizer first."""
        entries = [self.tokenizer, *([self.golden] if self.golden else [])]
        for variant in self.variants.values():
            entries += [entry for entry in variant.files() if entry not in entries]
        return entries

    def to_json(self) -> dict[str, Any]:
        """The manifest as the JSON object stored in manifest.json."""
        data = asdict(self)
        data["variants"] = {name: asdict(v) for name, v in self.variants.items()}
        return data


# ---------------------------------------------------------------------------------------------
# The reader. Every rule names the field, so a damaged package is refused with one line naming
# the file and field, never a traceback or a service that answers only internal_error.


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite int or float (not a bool)."""
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _printable(text: str) -> bool:
    """No C0/C1 control character (nor DEL): such strings reach answer and log lines."""
    return not any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in text)


class _Object:
    """One JSON object of the manifest and the path of field names leading to it."""

    def __init__(self, data: Any, where: str, prefix: str = ""):
        self.where, self.prefix = where, prefix
        if not isinstance(data, dict):
            self.fail("", "an object" if prefix else "a JSON object")
        self.data: dict[str, Any] = data

    def name(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix and key else self.prefix or key

    def fail(self, key: str, expected: str) -> NoReturn:
        if not self.prefix and not key:
            raise PackageError(f"malformed manifest {self.where}: must be {expected}")
        raise PackageError(f"malformed manifest {self.where}: field {self.name(key)!r} must be {expected}")

    def get(self, key: str, default: Any = _REQUIRED) -> Any:
        if key in self.data and self.data[key] is not None:
            return self.data[key]
        if default is _REQUIRED:
            self.fail(key, "present")
        return default

    def check(self, condition: bool, key: str, expected: str) -> None:
        if not condition:
            self.fail(key, expected)

    def text(self, key: str, limit: int = MAX_NAME_CHARS, default: Any = _REQUIRED, empty: bool = False) -> str:
        value = self.get(key, default)
        self.check(isinstance(value, str) and (empty or value.strip() != "") and len(value) <= limit
                   and _printable(value), key,
                   f"a {'' if empty else 'non-empty '}string of at most {limit} characters without control characters")
        return value

    def integer(self, key: str, low: int, high: int, expected: str) -> int:
        value = self.get(key)
        self.check(_is_int(value) and low <= value <= high, key, expected)
        return value

    def number(self, key: str, default: Any, low: float = 0.0, high: float = math.inf,
               expected: str = "a number ≥ 0") -> Any:
        value = self.get(key, default)
        if value is None:
            return None
        self.check(is_number(value) and low <= value <= high, key, expected)
        return float(value)

    def section(self, key: str, default: Any = _REQUIRED) -> dict[str, Any]:
        """A nested object kept as it is (the runtime does not read inside it)."""
        value = self.get(key, default)
        self.check(isinstance(value, dict), key, "an object")
        return dict(value)

    def child(self, key: str) -> _Object:
        return _Object(self.get(key), self.where, self.name(key))

    def entry(self, key: str, max_bytes: int) -> FileEntry:
        """The file entry under `key` (see `_entry`)."""
        return _entry(self.get(key), self.where, self.name(key), max_bytes)


def _entry(data: Any, where: str, name: str, max_bytes: int) -> FileEntry:
    """{"file": relative path inside the package, "sha256": 64 hex digits, "bytes": int ≥ 0}."""
    value = _Object(data, where, name)
    value.check(set(value.data) == {"file", "sha256", "bytes"}, "",
                'an object with exactly "file", "sha256" and "bytes"')
    path = value.data["file"]
    steps = path.split("/") if isinstance(path, str) else []
    value.check(isinstance(path, str) and 0 < len(path) <= MAX_PATH_CHARS and _printable(path) and "\\" not in path
                and not path.startswith("/") and not {"", ".", ".."} & set(steps), "file",
                "a relative path inside the package")
    digest = value.data["sha256"]
    value.check(isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest),
                "sha256", "64 lower-case hex digits")
    size = value.data["bytes"]
    value.check(_is_int(size) and 0 <= size <= max_bytes, "bytes", f"an integer from 0 to {max_bytes}")
    return FileEntry(file=path, sha256=digest, bytes=size)


def _variant(key: str, data: Any, where: str) -> Variant:
    fields = _Object(data, where, f"variants.{key}")
    fields.check(fields.get("name", None) == key, "name", f"the variant's key {key!r}")
    data_files = fields.get("data_files", [])
    fields.check(isinstance(data_files, list), "data_files", "a list of file entries")
    quantization = fields.get("quantization", None)
    fields.check(quantization is None or isinstance(quantization, dict), "quantization", "an object or null")
    return Variant(
        name=key,
        file=fields.entry("file", MAX_GRAPH_BYTES),
        precision=fields.text("precision"),
        data_files=tuple(_entry(entry, where, f"{fields.prefix}.data_files[{index}]", MAX_GRAPH_BYTES)
                         for index, entry in enumerate(data_files)),
        weights_storage=fields.text("weights_storage", MAX_TEXT_CHARS, default="fp32", empty=True),
        quantization=None if quantization is None else dict(quantization),
        metrics=fields.section("metrics", {}),
        golden_tolerance=fields.number("golden_tolerance", DEFAULT_GOLDEN_TOLERANCE),
        expected_tolerance=fields.number("expected_tolerance", None),
    )


def _labels(fields: _Object) -> tuple[str, ...]:
    labels = fields.get("labels")
    fields.check(isinstance(labels, list) and 2 <= len(labels) <= MAX_LABELS
                 and all(isinstance(label, str) and label.strip() and len(label) <= MAX_LABEL_CHARS
                         and _printable(label) for label in labels)
                 and len(set(labels)) == len(labels), "labels",
                 f"a list of 2 to {MAX_LABELS} unique non-empty strings of at most {MAX_LABEL_CHARS} "
                 "characters without control characters")
    return tuple(labels)


def _languages(fields: _Object) -> tuple[str, ...]:
    languages = fields.get("languages", [])
    fields.check(isinstance(languages, list) and len(languages) <= MAX_LANGUAGES
                 and all(isinstance(lang, str) and len(lang) <= MAX_NAME_CHARS and _printable(lang)
                         for lang in languages), "languages", "a list of short strings")
    return tuple(languages)


def _description(fields: _Object) -> str:
    """Free text: newlines and tabs allowed, other control characters not."""
    text = fields.get("description", "")
    fields.check(isinstance(text, str) and len(text) <= MAX_TEXT_CHARS
                 and _printable(text.replace("\n", " ").replace("\t", " ")), "description",
                 f"a string of at most {MAX_TEXT_CHARS} characters without control characters but newlines and tabs")
    return text


def _calibration(fields: _Object) -> dict[str, Any]:
    """A temperature, if given, must be a finite positive number below 1000."""
    calibration = _Object(fields.section("calibration", {}), fields.where, "calibration")
    temperature = calibration.get("temperature", 1.0)
    calibration.check(is_number(temperature) and 0 < temperature < 1e3, "temperature", "a positive number")
    return calibration.data


def _abstention(fields: _Object, labels: tuple[str, ...], variants: dict[str, Variant]) -> dict[str, Any]:
    """negative_labels: labels of the package, leaving at least one case label; max_unknown_share
    in (0, 1]; novelty: the graph output's name and a finite threshold for every variant."""
    abstention = _Object(fields.section("abstention", {}), fields.where, "abstention")
    negatives = abstention.get("negative_labels", [])
    abstention.check(isinstance(negatives, list) and all(n in labels for n in negatives)
                     and len(set(negatives)) == len(negatives) < len(labels), "negative_labels",
                     "a list of distinct labels of the package, leaving at least one case label")
    share = abstention.get("max_unknown_share", DEFAULT_MAX_UNKNOWN_SHARE)
    abstention.check(is_number(share) and 0 < share <= 1, "max_unknown_share", "a number in (0, 1]")
    margin = abstention.get("negative_margin", 0.0)
    abstention.check(is_number(margin) and -20 <= margin <= 20, "negative_margin", "a number in [-20, 20] (log-odds)")
    if abstention.get("novelty", None) is not None:
        novelty = abstention.child("novelty")
        output = novelty.get("output", "")
        novelty.check(isinstance(output, str) and output not in ("", "logits") and len(output) <= MAX_NAME_CHARS
                      and _printable(output), "output", "the name of a graph output other than logits")
        thresholds = novelty.get("thresholds", None)
        novelty.check(isinstance(thresholds, dict) and set(variants) <= set(thresholds)
                      and all(map(is_number, thresholds.values())), "thresholds", "a finite number for every variant")
    return abstention.data


def read_manifest(data: Any, where: str = MANIFEST_NAME) -> Manifest:
    """Validate a manifest.json object and build the Manifest; PackageError names the first bad
    field. Unknown fields are allowed (newer factories may add some) and ignored."""
    fields = _Object(data, where)
    if data.get("format") != FORMAT_VERSION:
        raise PackageError(f"{where}: manifest format {data.get('format')!r} is not supported "
                           f"(this runtime reads format {FORMAT_VERSION})")
    labels = _labels(fields)
    raw_variants = fields.get("variants")
    fields.check(isinstance(raw_variants, dict) and len(raw_variants) > 0, "variants", "a non-empty object")
    for key in raw_variants:
        fields.check(isinstance(key, str) and key.strip() != "" and len(key) <= MAX_NAME_CHARS and _printable(key),
                     "variants", f"an object whose keys are names of at most {MAX_NAME_CHARS} characters")
    variants = {key: _variant(key, value, where) for key, value in raw_variants.items()}
    return Manifest(
        name=fields.text("name"),
        version=fields.text("version"),
        labels=labels,
        languages=_languages(fields),
        max_length=fields.integer("max_length", 2, 1 << 16, "an integer from 2 to 65536 (tokens)"),
        tokenizer=fields.entry("tokenizer", MAX_TOKENIZER_BYTES),
        pad_id=fields.integer("pad_id", 0, 1 << 31, "an integer ≥ 0"),
        variants=variants,
        golden=fields.entry("golden", MAX_GOLDEN_BYTES) if fields.get("golden", None) is not None else None,
        description=_description(fields),
        provenance=fields.section("provenance", {}),
        calibration=_calibration(fields),
        abstention=_abstention(fields, labels, variants),
    )


def write_manifest(root: Path | str, manifest: Manifest) -> Path:
    """Write manifest.json into `root` (the factory's only way to publish a package); a manifest
    the runtime's reader would refuse raises PackageError and nothing is written."""
    path = Path(root) / MANIFEST_NAME
    text = json.dumps(manifest.to_json(), indent=2, ensure_ascii=False) + "\n"
    read_manifest(json.loads(text), str(path))
    path.write_text(text, encoding="utf-8")
    return path
