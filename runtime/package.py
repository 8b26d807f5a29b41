"""Model package format: `models/<name>/manifest.json` and the files it names.

The factory (`models/`) writes packages with `write_manifest`, the runtime reads them with
`load_package`, so both sides share one definition of the format. Stdlib only: this module is
imported before the CPU probe has chosen a numpy/onnxruntime stack.

Layout of a package directory:
    manifest.json     this format (see `Manifest`)
    tokenizer.json    a `tokenizers` tokenizer
    <variant files>   ONNX models: inputs input_ids, attention_mask (int64 [batch, seq]),
                      output logits (float32 [batch, num_labels]); may share external data files
    golden.jsonl      one JSON object a line: {"text", "language", "label", "probs"}; probs are
                      the FP32 reference probabilities, in label order. Optional "expected":
                      {variant: {"alone": probs, "batched": probs}}, each variant's own outputs
                      as `decide selftest` runs it (each text alone; all texts in one call)
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from runtime.abstain import DEFAULT_MAX_UNKNOWN_SHARE, AbstentionPolicy

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"


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
    golden_tolerance: float = 2e-3  # max |Δp| vs the FP32 reference on the golden set
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
    # When an answer is not a decision (runtime/abstain.py): {"negative_labels": [...],
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
            novelty_threshold=None if threshold is None else float(threshold), min_score=min_score)

    def to_json(self) -> dict[str, Any]:
        """The manifest as the JSON object stored in manifest.json."""
        data = asdict(self)
        data["variants"] = {name: asdict(v) for name, v in self.variants.items()}
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Manifest":
        """Parse a manifest.json object; raise PackageError on anything malformed."""
        try:
            if data.get("format") != FORMAT_VERSION:
                raise PackageError(
                    f"manifest format {data.get('format')!r} is not supported "
                    f"(this runtime reads format {FORMAT_VERSION})"
                )
            variants = {
                name: Variant(
                    name=v["name"],
                    file=FileEntry(**v["file"]),
                    precision=v["precision"],
                    data_files=tuple(FileEntry(**f) for f in v.get("data_files", ())),
                    weights_storage=v.get("weights_storage", "fp32"),
                    quantization=v.get("quantization"),
                    metrics=v.get("metrics", {}),
                    golden_tolerance=float(v.get("golden_tolerance", 2e-3)),
                    expected_tolerance=(float(v["expected_tolerance"])
                                        if v.get("expected_tolerance") is not None else None),
                )
                for name, v in data["variants"].items()
            }
            golden = data.get("golden")
            return cls(
                name=data["name"],
                version=data["version"],
                labels=tuple(data["labels"]),
                languages=tuple(data.get("languages", ())),
                max_length=int(data["max_length"]),
                tokenizer=FileEntry(**data["tokenizer"]),
                pad_id=int(data["pad_id"]),
                variants=variants,
                golden=FileEntry(**golden) if golden else None,
                description=data.get("description", ""),
                provenance=data.get("provenance", {}),
                calibration=_calibration(data.get("calibration")),
                abstention=dict(data.get("abstention") or {}),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise PackageError(f"malformed manifest: {exc!r}") from exc


def _calibration(value: Any) -> dict[str, Any]:
    """The manifest's calibration section; a temperature must be a finite positive number."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise PackageError(f"malformed manifest: calibration must be an object, got {type(value).__name__}")
    temperature = value.get("temperature", 1.0)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 < temperature < 1e3:
        raise PackageError(f"malformed manifest: calibration.temperature must be a positive number, got {temperature!r}")
    return dict(value)


@dataclass(frozen=True)
class Package:
    """A manifest together with the directory its files live in."""

    root: Path
    manifest: Manifest

    def path(self, entry: FileEntry) -> Path:
        """Absolute path of one of the package's files."""
        return self.root / entry.file


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_entry(root: Path, name: str) -> FileEntry:
    """Describe `root/name` as it is on disk now (used by the factory when writing)."""
    path = root / name
    return FileEntry(file=name, sha256=sha256_file(path), bytes=path.stat().st_size)


def load_package(root: Path | str) -> Package:
    """Read and check `root/manifest.json` (`check_manifest_json`); does not verify checksums
    (see `verify_files`)."""
    root = Path(root)
    manifest_path = root / MANIFEST_NAME
    try:
        data = json.loads(manifest_path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise PackageError(f"no model package at {root} ({MANIFEST_NAME} missing)") from exc
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: bad JSON or bad UTF-8
        raise PackageError(f"cannot read {manifest_path}: {exc}") from exc
    check_manifest_json(data, manifest_path)
    return Package(root=root, manifest=Manifest.from_json(data))


# ---------------------------------------------------------------------------------------------
# Validation: every field of manifest.json, so that a damaged package is refused with one line
# naming the file and field, never a traceback or a service that answers only internal_error.


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _check(condition: bool, where: str, field_name: str, expected: str) -> None:
    if not condition:
        raise PackageError(f"malformed manifest {where}: field {field_name!r} must be {expected}")


def _check_file_entry(value: Any, where: str, field_name: str) -> None:
    """{"file": relative path inside the package, "sha256": 64 hex digits, "bytes": int ≥ 0}."""
    _check(isinstance(value, dict) and set(value) == {"file", "sha256", "bytes"}, where, field_name,
           'an object with exactly "file", "sha256" and "bytes"')
    name = value["file"]
    _check(isinstance(name, str) and name != "" and not PurePosixPath(name).is_absolute()
           and ".." not in PurePosixPath(name).parts and "\0" not in name,
           where, f"{field_name}.file", "a relative path inside the package")
    digest = value["sha256"]
    _check(isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest),
           where, f"{field_name}.sha256", "64 lower-case hex digits")
    _check(_is_int(value["bytes"]) and value["bytes"] >= 0, where, f"{field_name}.bytes", "an integer ≥ 0")


def _check_variant(name: str, value: Any, where: str) -> None:
    prefix = f"variants.{name}"
    _check(isinstance(value, dict), where, prefix, "an object")
    _check(value.get("name") == name, where, f"{prefix}.name", f"the variant's key {name!r}")
    _check_file_entry(value.get("file"), where, f"{prefix}.file")
    _check(isinstance(value.get("precision"), str) and value["precision"] != "", where, f"{prefix}.precision",
           "a non-empty string")
    data_files = value.get("data_files", [])
    _check(isinstance(data_files, list), where, f"{prefix}.data_files", "a list of file entries")
    for index, entry in enumerate(data_files):
        _check_file_entry(entry, where, f"{prefix}.data_files[{index}]")
    _check(isinstance(value.get("weights_storage", ""), str), where, f"{prefix}.weights_storage", "a string")
    _check(value.get("quantization") is None or isinstance(value["quantization"], dict), where,
           f"{prefix}.quantization", "an object or null")
    _check(isinstance(value.get("metrics", {}), dict), where, f"{prefix}.metrics", "an object")
    tolerance = value.get("golden_tolerance", 0.0)
    _check(_is_number(tolerance) and tolerance >= 0, where, f"{prefix}.golden_tolerance", "a number ≥ 0")


def check_manifest_json(data: Any, where: Path | str = MANIFEST_NAME) -> None:
    """Check the types and values of every manifest field; raise PackageError naming the first
    bad one (unknown fields are allowed: newer factories may add some)."""
    where = str(where)
    if not isinstance(data, dict):
        raise PackageError(f"malformed manifest {where}: must be a JSON object")
    if data.get("format") != FORMAT_VERSION:
        raise PackageError(f"{where}: manifest format {data.get('format')!r} is not supported "
                           f"(this runtime reads format {FORMAT_VERSION})")
    for key in ("name", "version"):
        _check(isinstance(data.get(key), str) and data[key].strip() != "", where, key, "a non-empty string")
    labels = data.get("labels")
    _check(isinstance(labels, list) and len(labels) >= 2
           and all(isinstance(label, str) and label.strip() for label in labels)
           and len(set(labels)) == len(labels), where, "labels", "a list of at least 2 unique non-empty strings")
    languages = data.get("languages", [])
    _check(isinstance(languages, list) and all(isinstance(lang, str) for lang in languages), where,
           "languages", "a list of strings")
    _check(_is_int(data.get("max_length")) and 2 <= data["max_length"] <= 1 << 16, where, "max_length",
           "an integer from 2 to 65536 (tokens)")
    _check_file_entry(data.get("tokenizer"), where, "tokenizer")
    _check(_is_int(data.get("pad_id")) and data["pad_id"] >= 0, where, "pad_id", "an integer ≥ 0")
    variants = data.get("variants")
    _check(isinstance(variants, dict) and len(variants) > 0, where, "variants", "a non-empty object")
    for name, variant in variants.items():
        _check_variant(name, variant, where)
    if data.get("golden") is not None:
        _check_file_entry(data["golden"], where, "golden")
    _check(isinstance(data.get("description", ""), str), where, "description", "a string")
    _check(isinstance(data.get("provenance", {}), dict), where, "provenance", "an object")
    if data.get("abstention") is not None:
        _check_abstention(data["abstention"], labels, variants, where)


def _check_abstention(value: Any, labels: list[str], variants: dict[str, Any], where: str) -> None:
    """negative_labels: labels of the package, leaving at least one case label; max_unknown_share
    in (0, 1]; novelty: the graph output's name and a finite threshold for every variant."""
    _check(isinstance(value, dict), where, "abstention", "an object")
    negatives = value.get("negative_labels", [])
    _check(isinstance(negatives, list) and all(n in labels for n in negatives) and len(set(negatives)) == len(negatives)
           and len(set(negatives)) < len(labels), where, "abstention.negative_labels",
           "a list of distinct labels of the package, leaving at least one case label")
    share = value.get("max_unknown_share", DEFAULT_MAX_UNKNOWN_SHARE)
    _check(_is_number(share) and 0 < share <= 1, where, "abstention.max_unknown_share", "a number in (0, 1]")
    novelty = value.get("novelty")
    if novelty is None:
        return
    _check(isinstance(novelty, dict) and isinstance(novelty.get("output"), str) and novelty["output"] not in ("", "logits"),
           where, "abstention.novelty.output", "the name of a graph output other than logits")
    thresholds = novelty.get("thresholds")
    _check(isinstance(thresholds, dict) and set(variants) <= set(thresholds) and all(map(_is_number, thresholds.values())),
           where, "abstention.novelty.thresholds", "a finite number for every variant")


def verify_golden_file(package: Package) -> None:
    """Verify golden.jsonl's checksum and that every line is a golden example: {"text": str,
    "label": one of the labels, "probs": one number per label}; PackageError names the line."""
    entry = package.manifest.golden
    if entry is None:
        return
    verify_files(package, [entry])
    path = package.path(entry)
    labels = package.manifest.labels
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, ValueError) as exc:
        raise PackageError(f"cannot read {path}: {exc}") from exc
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise PackageError(f"{path} line {number}: not JSON ({exc})") from exc
        probs = record.get("probs") if isinstance(record, dict) else None
        if not (isinstance(record, dict) and isinstance(record.get("text"), str) and record.get("label") in labels
                and isinstance(probs, list) and len(probs) == len(labels) and all(map(_is_number, probs))):
            raise PackageError(f"{path} line {number}: must be an object with \"text\", \"label\" (one of the "
                               f"{len(labels)} labels) and \"probs\" ({len(labels)} numbers)")


def verify_files(package: Package, entries: tuple[FileEntry, ...] | list[FileEntry]) -> None:
    """Check that each file exists with the manifest's size and sha256; raise PackageError naming the first that does not."""
    for entry in entries:
        path = package.path(entry)
        if not path.is_file():
            raise PackageError(f"model file missing: {path}")
        size = path.stat().st_size  # before hashing: a truncated copy is named by its size
        if size != entry.bytes:
            raise PackageError(f"model file {path} has {size} bytes, manifest says {entry.bytes}")
        try:
            actual = sha256_file(path)
        except OSError as exc:  # e.g. permission denied
            raise PackageError(f"cannot read model file {path}: {exc.strerror or exc}") from exc
        if actual != entry.sha256:
            raise PackageError(
                f"checksum mismatch for {path}: sha256 {actual}, manifest says {entry.sha256}"
            )


def write_manifest(root: Path | str, manifest: Manifest) -> Path:
    """Write manifest.json into `root` (the factory's only way to publish a package)."""
    path = Path(root) / MANIFEST_NAME
    path.write_text(json.dumps(manifest.to_json(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def read_golden(package: Package) -> list[dict[str, Any]]:
    """The golden examples: text, language, expected label and FP32 probabilities."""
    if package.manifest.golden is None:
        return []
    lines = package.path(package.manifest.golden).read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]
