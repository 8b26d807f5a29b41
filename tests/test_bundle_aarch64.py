"""The linux-aarch64 zip as shipped: size, glibc floor, the right architecture, symlinks kept, and
the CPython it was frozen from complete on an emulated Cortex-A53.

The zip is the one built from the tree under test (bundle_spec.matrix.zip_for_tree: this commit
and inputs digest; built with `build.py --arch aarch64` when missing: README, "The bundle", says
how long that takes). Running the app on emulated CPUs is tests/test_matrix.py's job.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from zips import zip_of_this_tree

from bundle_spec import elf, matrix
from bundle_spec.common import ARCHES, DEFAULT_MAX_GLIBC, version_tuple
from bundle_spec.python import check_extension_modules
from bundle_spec.root import BuildRoot
from runtime.package.load import sha256_file

pytestmark = pytest.mark.heavy


@pytest.fixture(scope="module")
def aarch64_zip() -> Path:
    """The aarch64 zip of the tree under test, or skip with the reason it cannot be had here."""
    return zip_of_this_tree("aarch64")


@pytest.fixture(scope="module")
def manifest(aarch64_zip: Path) -> dict:
    """build.py's manifest written next to the zip."""
    return json.loads(aarch64_zip.with_suffix(".json").read_text())


def test_zip_is_under_100_mb_and_matches_its_checksum(aarch64_zip: Path, manifest: dict) -> None:
    assert aarch64_zip.stat().st_size < 100_000_000
    assert manifest["arch"] == "aarch64"
    checksum = aarch64_zip.with_name(aarch64_zip.name + ".sha256").read_text().split()[0]
    assert checksum == sha256_file(aarch64_zip) == manifest["zip_sha256"]


def test_glibc_floor_holds(manifest: dict) -> None:
    floor = manifest["glibc_floor"]
    assert version_tuple(floor["glibc"]) <= version_tuple(DEFAULT_MAX_GLIBC), floor


def test_every_executable_and_library_is_aarch64(aarch64_zip: Path) -> None:
    """No x86 file slipped in from the host (the build runs on x86_64)."""
    bundle = matrix.unpack_bundle(aarch64_zip, "aarch64")
    top = bundle.executable.parent
    machines = {}
    for path in top.rglob("*"):
        if path.is_file() and not path.is_symlink():
            info = elf.read_elf_info(path)
            if info is not None:
                machines[str(path.relative_to(top))] = info.arch
    assert machines["decide"] == "aarch64"
    assert len(machines) > 20  # libpython, numpy, onnxruntime, tokenizers, lib-dynload …
    assert {name: arch for name, arch in machines.items() if arch != "aarch64"} == {}


def test_symlinks_and_arm_tiers_are_in_the_zip(aarch64_zip: Path) -> None:
    with zipfile.ZipFile(aarch64_zip) as archive:
        infos = archive.infolist()
    names = {i.filename for i in infos}
    symlinks = [i for i in infos if (i.external_attr >> 16) & 0o170000 == 0o120000]
    assert symlinks, "PyInstaller >= 6 onedir uses symlinks; the zip must keep them"
    assert {"decide/decide", "decide/platforms/aarch64.json", "decide/README.md",
            "decide/licenses/README.txt"} <= names


def test_every_extension_module_of_the_built_cpython_imports_on_cortex_a53(manifest: dict,
                                                                         tmp_path: Path) -> None:
    """The class of the _ctypes-without-libffi bug: a module that configure skipped or linked
    wrongly. The cross-built CPython the zip was frozen from, every lib-dynload module imported
    on the oldest supported ARM64 CPU (raises naming each module that fails or is missing)."""
    root = BuildRoot(Path(manifest["build_root"]), ARCHES["aarch64"])
    report = check_extension_modules(root, "cortex-a53", tmp_path / "check.log")
    assert {"_ctypes", "_ssl", "_sqlite3", "pyexpat"} <= set(report["modules"])
    assert report["failed"] == {} and report["missing"] == []
