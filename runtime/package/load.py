"""Model package: a directory holding `manifest.json` and exactly the files it lists.

The factory (`models/`) writes packages with `write_manifest`, the runtime reads them with
`load_package`, so both sides share one definition of the format (runtime/package/manifest.py). Stdlib
only: this module is imported before the CPU probe has chosen a numpy/onnxruntime stack.

Layout of a package directory:
    manifest.json     the format (runtime/package/manifest.py)
    tokenizer.json    a `tokenizers` tokenizer
    <variant files>   ONNX models: inputs input_ids, attention_mask (int64 [batch, seq]),
                      output logits (float32 [batch, num_labels]); may share external data files
    manifest.json.minisig   optional: the manifest's signature (runtime/package/signing.py)
    golden.jsonl      one JSON object a line: {"text", "language", "label", "probs"}; probs are
                      the FP32 reference probabilities, in label order. Optional "expected":
                      {variant: {"alone": probs, "batched": probs}}, each variant's own outputs
                      as `decide selftest` runs it (each text alone; all texts in one call)
    LICENSE*, NOTICE*, README*   optional documents (never read by the runtime)

Every byte the runtime loads is a regular file inside the package, listed and hashed in the
manifest (issue 23): `load_package` refuses symlinks anywhere below the package directory,
files the manifest does not list, FIFOs and devices; `verify_files` hashes what will be loaded;
`check_external_data` requires every external-data file a graph names to be a listed data file
of its variant; files read into memory are read once, capped, and checked against their sha256.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import re
import stat
from collections.abc import Iterable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from runtime.package.manifest import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    MAX_GOLDEN_BYTES,
    MAX_TOKENIZER_BYTES,
    FileEntry,
    Manifest,
    PackageError,
    Variant,
    is_number,
    read_manifest,
)
from runtime.package.onnxdata import NotOnnx, external_data_locations
from runtime.package.signing import MAX_SIGNATURE_BYTES, SIGNATURE_NAME
from runtime.platform.safefile import (
    FileRefused,
    hash_inside,
    kind,
    open_dir,
    open_inside,
    open_subdir,
    read_blocks,
    read_inside,
)

__all__ = ["FORMAT_VERSION", "MANIFEST_NAME", "FileEntry", "Manifest", "Package", "PackageError", "Variant",
           "beyond_variant", "check_external_data", "file_entry", "json_lines", "load_package", "read_golden", "read_manifest", "read_verified",
           "verify_files", "verify_golden_file"]

MAX_MANIFEST_BYTES = 4 << 20  # the default model's is 24 KB
MAX_TREE_ENTRIES = 10_000  # files and directories below a package directory
MAX_TREE_DEPTH = 16
# Documents a package may carry besides its listed files; the bundle copies them, nothing reads them.
DOCUMENT_NAMES = re.compile(r"(LICEN[CS]E|NOTICE|README)", re.IGNORECASE)


@dataclass(frozen=True)
class Package:
    """A manifest together with the directory its files live in, the manifest's bytes as read
    and its signature file's bytes (None: unsigned), which runtime/package/signing.py checks."""

    root: Path
    manifest: Manifest
    manifest_bytes: bytes = field(default=b"", repr=False, compare=False)
    signature: bytes | None = field(default=None, repr=False, compare=False)

    def path(self, entry: FileEntry) -> Path:
        """Absolute path of one of the package's files."""
        return self.root / entry.file


def _refused(root: Path, exc: FileRefused) -> PackageError:
    return PackageError(f"{root}: {exc}; every file of a package must be a regular file inside it, "
                        "listed in its manifest")


def load_package(root: Path | str, allow_unlisted: bool = False) -> Package:
    """Read and validate `root/manifest.json` and check the directory holds nothing else than
    the files it lists (no symlink, FIFO, device or unlisted file); does not verify checksums
    (see `verify_files`). allow_unlisted=True lets unlisted regular files pass, for a caller that
    copies only the listed ones out (the bundle build); nothing that serves may pass it."""
    root = Path(root)
    manifest_path = root / MANIFEST_NAME
    try:
        dir_fd = open_dir(root)
    except FileNotFoundError as exc:
        raise PackageError(f"no model package at {root} ({MANIFEST_NAME} missing)") from exc
    except OSError as exc:
        raise PackageError(f"no model package at {root} ({exc.strerror or exc})") from exc
    try:
        try:
            raw = read_inside(dir_fd, MANIFEST_NAME, MAX_MANIFEST_BYTES, "manifest")
        except FileNotFoundError as exc:
            raise PackageError(f"no model package at {root} ({MANIFEST_NAME} missing)") from exc
        except FileRefused as exc:
            raise _refused(root, exc) from exc
        except OSError as exc:
            raise PackageError(f"cannot read {manifest_path}: {exc.strerror or exc}") from exc
        try:
            data = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError) as exc:  # ValueError: bad JSON or bad UTF-8
            raise PackageError(f"cannot read {manifest_path}: {exc}") from exc
        manifest = read_manifest(data, str(manifest_path))
        _check_tree(dir_fd, root, {MANIFEST_NAME, SIGNATURE_NAME, *(entry.file for entry in manifest.files())},
                    allow_unlisted)
        signature = _read_signature(dir_fd, root)
    finally:
        os.close(dir_fd)
    return Package(root=root, manifest=manifest, manifest_bytes=raw, signature=signature)


def _read_signature(dir_fd: int, root: Path) -> bytes | None:
    """manifest.json.minisig's bytes (capped, a regular file), None when the package has none."""
    try:
        return read_inside(dir_fd, SIGNATURE_NAME, MAX_SIGNATURE_BYTES, "signature file")
    except FileNotFoundError:
        return None
    except FileRefused as exc:
        raise _refused(root, exc) from exc
    except OSError as exc:
        raise PackageError(f"cannot read {root / SIGNATURE_NAME}: {exc.strerror or exc}") from exc


def _check_tree(dir_fd: int, root: Path, listed: set[str], allow_unlisted: bool) -> None:
    """Every entry below the package directory is a listed regular file, a document at the top,
    or a directory; PackageError names the first that is not."""
    pending = [(os.dup(dir_fd), "", 0)]
    seen = 0
    try:
        while pending:
            fd, prefix, depth = pending.pop()
            try:
                try:
                    with os.scandir(fd) as entries:
                        names = sorted(entry.name for entry in entries)
                except OSError as exc:
                    raise PackageError(f"{root}: cannot list {prefix or '.'}: {exc.strerror or exc}") from exc
                for name in names:
                    seen += 1
                    relative = prefix + name
                    if seen > MAX_TREE_ENTRIES:
                        raise PackageError(f"{root}: more than {MAX_TREE_ENTRIES} files and directories")
                    pending.extend(_tree_entry(fd, name, relative, depth, root, listed, allow_unlisted))
            finally:
                os.close(fd)
    finally:
        for fd, _, _ in pending:
            os.close(fd)


def _tree_entry(dir_fd: int, name: str, relative: str, depth: int, root: Path, listed: set[str],
                allow_unlisted: bool) -> list[tuple[int, str, int]]:
    """Judge one directory entry; a subdirectory comes back as (fd, prefix, depth) to walk."""
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except OSError as exc:
        raise PackageError(f"{root}: {relative}: {exc.strerror or exc}") from exc
    if stat.S_ISREG(mode):
        if relative in listed or allow_unlisted or (depth == 0 and DOCUMENT_NAMES.match(name)):
            return []
        raise PackageError(f"{root}: {relative} is not listed in {MANIFEST_NAME}; a package holds only the files "
                           "its manifest lists (remove it, or rebuild the package)")
    if stat.S_ISDIR(mode):
        if depth + 1 >= MAX_TREE_DEPTH:
            raise PackageError(f"{root}: {relative}: directories nested deeper than {MAX_TREE_DEPTH}")
        try:
            return [(open_subdir(dir_fd, name, relative), relative + "/", depth + 1)]
        except FileRefused as exc:
            raise _refused(root, exc) from exc
    raise _refused(root, FileRefused(f"{relative} is {kind(mode)}, not a regular file"))


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


def _package_fd(package: Package) -> int:
    try:
        return open_dir(package.root)
    except OSError as exc:
        raise PackageError(f"no model package at {package.root} ({exc.strerror or exc})") from exc


@contextmanager
def _opened(package: Package, entry: FileEntry) -> Iterator[int]:
    """The package directory's fd; opening or reading `entry` below it fails as a PackageError."""
    path = package.path(entry)
    dir_fd = _package_fd(package)
    try:
        yield dir_fd
    except FileNotFoundError:
        raise PackageError(f"model file missing: {path}") from None
    except FileRefused as exc:
        raise _refused(package.root, exc) from exc
    except OSError as exc:  # e.g. permission denied
        raise PackageError(f"cannot read model file {path}: {exc.strerror or exc}") from exc
    finally:
        os.close(dir_fd)


def verify_files(package: Package, entries: Iterable[FileEntry]) -> None:
    """Check that each file is a regular file inside the package with the manifest's size and
    sha256; raise PackageError naming the first that is not."""
    for entry in entries:
        path = package.path(entry)
        with _opened(package, entry) as dir_fd:
            size, actual = hash_inside(dir_fd, entry.file, entry.bytes)
        if size != entry.bytes:
            raise PackageError(f"model file {path} has {size} bytes, manifest says {entry.bytes}")
        if actual != entry.sha256:
            raise PackageError(f"checksum mismatch for {path}: sha256 {actual}, manifest says {entry.sha256}")


def beyond_variant(manifest: Manifest, variant: str) -> list[FileEntry]:
    """The listed files that serving `variant` does not read (other variants' files): hashed too
    when the whole package must be intact (a signed package, a reload)."""
    used = {manifest.tokenizer, *([manifest.golden] if manifest.golden else []), *manifest.variants[variant].files()}
    return [entry for entry in manifest.files() if entry not in used]


def read_verified(package: Package, entry: FileEntry, cap: int, verify: bool = True) -> bytes:
    """A file read into memory once (at most `cap` bytes), checked against its manifest entry's
    size and sha256 unless verify=False: what is checked is exactly what is used."""
    path = package.path(entry)
    limit = entry.bytes if verify else cap
    with _opened(package, entry) as dir_fd, open_inside(dir_fd, entry.file) as (fd, info):
        if verify and info.st_size != entry.bytes:
            raise PackageError(f"model file {path} has {info.st_size} bytes, manifest says {entry.bytes}")
        if info.st_size > cap:
            raise PackageError(f"model file {path} has {info.st_size} bytes, more than the {cap} allowed")
        data = b"".join(read_blocks(fd, limit))
    if len(data) > limit or (verify and len(data) != entry.bytes):
        raise PackageError(f"model file {path} changed size while it was read")
    if verify and (actual := hashlib.sha256(data).hexdigest()) != entry.sha256:
        raise PackageError(f"checksum mismatch for {path}: sha256 {actual}, manifest says {entry.sha256}")
    return data


def check_external_data(package: Package, variant: Variant) -> None:
    """Every external-data file the variant's graph names must be one of the variant's listed
    data files (ORT would otherwise load bytes no checksum covers)."""
    graph = package.path(variant.file)
    try:
        with _opened(package, variant.file) as dir_fd, open_inside(dir_fd, variant.file.file) as (fd, info):
            if info.st_size == 0:
                raise PackageError(f"{graph}: not an ONNX graph (empty file)")
            with closing(mmap.mmap(fd, 0, prot=mmap.PROT_READ)) as view:
                locations = external_data_locations(view)
    except NotOnnx as exc:
        raise PackageError(f"{graph}: not an ONNX graph ({exc})") from exc
    folder = PurePosixPath(variant.file.file).parent
    allowed = {entry.file for entry in variant.data_files}
    for location in sorted(locations):
        steps = location.split("/")
        named = str(folder / location) if not location.startswith("/") and not {"", ".", ".."} & set(steps) else None
        if named not in allowed:
            raise PackageError(f"{graph}: its external data {location[:200]!r} is not a data file of variant "
                               f"{variant.name} in {MANIFEST_NAME}; ORT would load it unchecked")


def json_lines(text: str) -> Iterator[tuple[int, Any]]:
    """(line number, value) of each non-blank line of a JSON-lines text; ValueError (with the
    line number) for a line that is not JSON."""
    numbered = ((number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip())
    for number, line in numbered:
        try:
            yield number, json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"line {number}: not JSON ({exc})") from exc


def _golden_records(text: str, path: Path, labels: tuple[str, ...]) -> list[dict[str, Any]]:
    """golden.jsonl's examples; PackageError names the first line that is not one."""
    records = []
    try:
        for number, record in json_lines(text):
            probs = record.get("probs") if isinstance(record, dict) else None
            if not (isinstance(record, dict) and isinstance(record.get("text"), str)
                    and record.get("label") in labels and isinstance(probs, list) and len(probs) == len(labels)
                    and all(map(is_number, probs))):
                raise PackageError(f"{path} line {number}: must be an object with \"text\", \"label\" (one of "
                                   f"the {len(labels)} labels) and \"probs\" ({len(labels)} numbers)")
            records.append(record)
    except ValueError as exc:
        raise PackageError(f"{path} {exc}") from exc
    return records


def read_golden(package: Package, verify: bool = True) -> list[dict[str, Any]]:
    """The golden examples (text, language, expected label, FP32 probabilities), read once and
    checked against the manifest's sha256 (unless verify=False) and line by line."""
    entry = package.manifest.golden
    if entry is None:
        return []
    path = package.path(entry)
    try:
        text = read_verified(package, entry, MAX_GOLDEN_BYTES, verify).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PackageError(f"cannot read {path}: {exc}") from exc
    return _golden_records(text, path, package.manifest.labels)


def verify_golden_file(package: Package) -> None:
    """golden.jsonl matches its checksum and every line is a golden example."""
    read_golden(package)


def read_tokenizer(package: Package, verify: bool = True) -> str:
    """tokenizer.json as text, read once, capped and checked against the manifest."""
    entry = package.manifest.tokenizer
    try:
        return read_verified(package, entry, MAX_TOKENIZER_BYTES, verify).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PackageError(f"cannot load the tokenizer {package.path(entry)}: not UTF-8 ({exc})") from exc


