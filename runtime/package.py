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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

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
    cpu_families: tuple[str, ...] = ()  # tiers this variant was made for
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
    format: int = FORMAT_VERSION

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
                    cpu_families=tuple(v.get("cpu_families", ())),
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
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise PackageError(f"malformed manifest: {exc!r}") from exc


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
    """Read `root/manifest.json`; does not verify checksums (see `verify_files`)."""
    root = Path(root)
    manifest_path = root / MANIFEST_NAME
    try:
        data = json.loads(manifest_path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise PackageError(f"no model package at {root} ({MANIFEST_NAME} missing)") from exc
    except (OSError, json.JSONDecodeError) as exc:
        raise PackageError(f"cannot read {manifest_path}: {exc}") from exc
    return Package(root=root, manifest=Manifest.from_json(data))


def verify_files(package: Package, entries: tuple[FileEntry, ...] | list[FileEntry]) -> None:
    """Check that each file exists with the manifest's size and sha256; raise PackageError naming the first that does not."""
    for entry in entries:
        path = package.path(entry)
        if not path.is_file():
            raise PackageError(f"model file missing: {path}")
        size = path.stat().st_size
        if size != entry.bytes:
            raise PackageError(f"model file {path} has {size} bytes, manifest says {entry.bytes}")
        actual = sha256_file(path)
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
