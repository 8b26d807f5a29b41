"""The linux-aarch64 zip as shipped: size, glibc floor, the right architecture, symlinks kept.

The zip comes from tests/emulation.py's zip_for_current_inputs (built with `build.py --arch
aarch64` when missing; cached per inputs digest). Running it on emulated CPUs is
tests/test_matrix.py's job; these checks read the zip and its build manifest only.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import emulation
import pytest
from build_module import load_build_module

REPO = Path(__file__).resolve().parent.parent
MODEL_DIR = REPO / "models" / "topics-multilingual"
build = load_build_module()


@pytest.fixture(scope="module")
def aarch64_zip() -> Path:
    """The aarch64 zip of the current inputs, or skip with the reason it cannot be had here."""
    if not (MODEL_DIR / "manifest.json").is_file():
        pytest.skip(f"{MODEL_DIR} is not built yet (the bundle embeds it)")
    try:
        return emulation.zip_for_current_inputs("aarch64", MODEL_DIR,
                                                REPO / "build" / "test-build-aarch64.log")
    except emulation.BundleUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def manifest(aarch64_zip: Path) -> dict:
    """build.py's manifest written next to the zip."""
    return json.loads(aarch64_zip.with_suffix(".json").read_text())


def test_zip_is_under_100_mb_and_matches_its_checksum(aarch64_zip: Path, manifest: dict) -> None:
    assert aarch64_zip.stat().st_size < 100_000_000
    assert manifest["arch"] == "aarch64"
    checksum = aarch64_zip.with_name(aarch64_zip.name + ".sha256").read_text().split()[0]
    assert checksum == build.sha256_file(aarch64_zip) == manifest["zip_sha256"]


def test_glibc_floor_holds(manifest: dict) -> None:
    floor = manifest["glibc_floor"]
    assert build.version_tuple(floor["glibc"]) <= build.version_tuple(build.DEFAULT_MAX_GLIBC), floor


def test_every_executable_and_library_is_aarch64(aarch64_zip: Path) -> None:
    """No x86 file slipped in from the host (the build runs on x86_64)."""
    bundle = emulation.unpack_bundle(aarch64_zip, "aarch64")
    top = bundle.executable.parent
    machines = {}
    for path in top.rglob("*"):
        if path.is_file() and not path.is_symlink():
            info = emulation.read_elf_info(path)
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
