"""The build's own logic (bundle_spec/), without building: ELF reading, zip symlinks, pins,
mirrors, the extracted arm64 root, which zip belongs to the tree under test, strict mode."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bundle_spec import (
    archive,
    assemble,
    checks,
    common,
    elf,
    matrix,
    pipeline,
    python,
    root,
    wheels,
)
from bundle_spec.common import ARCHES, BuildError, Refused, version_tuple

REPO = Path(__file__).resolve().parent.parent


def onnxruntime_extension() -> Path:
    """The onnxruntime binary extension of this environment (a real manylinux_2_28 ELF)."""
    import onnxruntime

    return next(Path(onnxruntime.__file__).parent.glob("capi/onnxruntime_pybind11_state*.so"))


@pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf (binutils) not installed")
def test_elf_versions_match_readelf() -> None:
    library = onnxruntime_extension()
    listing = subprocess.run(["readelf", "-V", "--wide", str(library)], capture_output=True,
                             text=True, check=True).stdout
    needed_section = listing.split(".gnu.version_r", 1)[1]
    assert elf.needed_versions(library) == set(re.findall(r"Name: (\S+)", needed_section))


def test_glibc_floor_of_the_onnxruntime_wheel_is_its_manylinux_tag(tmp_path: Path) -> None:
    shutil.copy(onnxruntime_extension(), tmp_path / "ort.so")
    (tmp_path / "notes.txt").write_text("not an ELF file")
    (tmp_path / "link.so").symlink_to("ort.so")  # counted once, through its target

    floor = checks.glibc_floor(tmp_path)

    assert floor["elf_files"] == 1
    assert version_tuple("2.17") <= version_tuple(floor["glibc"]) <= version_tuple("2.28")
    assert floor["set_by"]["glibc"] == "ort.so"
    assert "glibcxx" in floor


def test_zip_keeps_symlinks_and_modes(tmp_path: Path) -> None:
    app = tmp_path / "stage" / "decide"
    (app / "_internal" / "pkg").mkdir(parents=True)
    (app / "_internal" / "pkg" / "libreal.so").write_bytes(b"\x7fELF" + os.urandom(64))
    (app / "_internal" / "libreal.so").symlink_to("pkg/libreal.so")
    (app / "decide").write_text("#!/bin/sh\necho hi\n")
    (app / "decide").chmod(0o755)
    zip_path = tmp_path / "out.zip"

    archive.write_zip(app, zip_path)

    target = tmp_path / "unzipped"
    if shutil.which("unzip"):
        subprocess.run(["unzip", "-q", str(zip_path), "-d", str(target)], check=True)
    else:
        from test_bundle import extract_with_symlinks

        extract_with_symlinks(zip_path, target)
    link = target / "decide" / "_internal" / "libreal.so"
    assert link.is_symlink() and os.readlink(link) == "pkg/libreal.so"
    assert link.read_bytes() == (app / "_internal" / "pkg" / "libreal.so").read_bytes()
    assert os.access(target / "decide" / "decide", os.X_OK)


def test_pins_follow_includes_and_reject_ranges(tmp_path: Path) -> None:
    (tmp_path / "base.txt").write_text("# runtime\nnumpy==2.4.6  # why\n")
    (tmp_path / "build.txt").write_text("-r base.txt\npyinstaller==6.22.3\n")
    assert wheels.read_pins(tmp_path / "build.txt") == {"numpy": "2.4.6", "pyinstaller": "6.22.3"}
    (tmp_path / "loose.txt").write_text("numpy>=2\n")
    with pytest.raises(BuildError, match="not pinned"):
        wheels.read_pins(tmp_path / "loose.txt")


def test_build_pins_cover_the_runtime_pins() -> None:
    runtime_pins = wheels.read_pins(REPO / "requirements.txt")
    build_pins = wheels.read_pins(REPO / "requirements-build.txt")
    assert runtime_pins.items() <= build_pins.items()
    assert "pyinstaller" in build_pins


def test_wheel_prefix_normalizes_names() -> None:
    assert wheels.wheel_prefix("py-cpuinfo", "9.0.0") == "py_cpuinfo-9.0.0-"
    assert wheels.wheel_prefix("pyinstaller-hooks-contrib", "2026.9") == "pyinstaller_hooks_contrib-2026.9-"


def test_mirrors_from_deb822_and_one_line_sources(tmp_path: Path) -> None:
    deb822 = tmp_path / "a"
    (deb822 / "sources.list.d").mkdir(parents=True)
    (deb822 / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\n# http://old.example/debian\nURIs: http://mirror.example/debian\n"
        "Suites: bookworm bookworm-updates\nComponents: main\n\n"
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n")
    assert root.host_debian_mirrors(deb822) == (
        "http://mirror.example/debian", "http://mirror.example/debian-security")

    one_line = tmp_path / "b"
    (one_line / "sources.list.d").mkdir(parents=True)
    (one_line / "sources.list").write_text(
        "deb [arch=amd64] http://m.example/debian/ bullseye main\n"
        "deb http://m.example/debian-security bullseye-security main\n")
    assert root.host_debian_mirrors(one_line) == ("http://m.example/debian", "http://m.example/debian-security")

    empty = tmp_path / "c"
    (empty / "sources.list.d").mkdir(parents=True)
    with pytest.raises(Refused, match="--mirror"):
        root.host_debian_mirrors(empty)


def test_debian_versions_sort_numerically() -> None:
    versions = ["3.11.2-6+deb12u9", "3.11.2-6", "3.11.2-6+deb12u10", "3.11.2-6+deb12u8"]
    newest_first = sorted(versions, key=python.debian_version_key, reverse=True)
    assert newest_first == ["3.11.2-6+deb12u10", "3.11.2-6+deb12u9", "3.11.2-6+deb12u8", "3.11.2-6"]


def test_an_emulated_root_runs_its_commands_under_qemu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """aarch64 on an x86_64 host: chroot means qemu_user's private binfmt_misc, not plain chroot."""
    commands: list[list[str]] = []
    monkeypatch.setattr(root, "run", lambda cmd, **_: commands.append(cmd) or "")
    monkeypatch.setattr(common.platform, "machine", lambda: "x86_64")
    arm = root.BuildRoot(tmp_path / "root", ARCHES["aarch64"])
    native = root.BuildRoot(tmp_path / "root", ARCHES["x86_64"])
    assert arm.emulated and not native.emulated
    arm.chroot(["/build/venv/bin/pyinstaller", "x.spec"], tmp_path / "log", nice=10)
    native.chroot(["/build/venv/bin/pyinstaller", "x.spec"], tmp_path / "log", nice=10)
    emulated, plain = commands
    assert emulated[emulated.index("_inside"):emulated.index("--")] == [
        "_inside", "--arch", "aarch64", "--cpu", "cortex-a72", "--root", str(tmp_path / "root")]
    assert emulated[-2:] == plain[-2:] == ["/build/venv/bin/pyinstaller", "x.spec"]
    assert plain[:5] == ["nice", "-n", "10", "chroot", str(tmp_path / "root")]


def test_dpkg_owners_are_read_from_the_roots_file_lists(tmp_path: Path) -> None:
    info = tmp_path / "var" / "lib" / "dpkg" / "info"
    info.mkdir(parents=True)
    (info / "libssl1.1:arm64.list").write_text("/.\n/usr/lib/aarch64-linux-gnu/libssl.so.1.1\n")
    (info / "zlib1g:arm64.list").write_text("/lib/aarch64-linux-gnu/libz.so.1\n")
    (info / "zlib1g:arm64.md5sums").write_text("0123 lib/aarch64-linux-gnu/not-a-listed-file\n")
    owners = assemble.dpkg_file_owners(tmp_path)
    assert owners["/usr/lib/aarch64-linux-gnu/libssl.so.1.1"] == "libssl1.1"
    assert owners["/lib/aarch64-linux-gnu/libz.so.1"] == "zlib1g"
    assert "lib/aarch64-linux-gnu/not-a-listed-file" not in owners


def test_building_another_arch_needs_an_x86_64_host(capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common.platform, "machine", lambda: "ppc64le")
    assert pipeline.main(["--arch", "aarch64"]) == 2
    assert "building aarch64 on ppc64le is not supported" in capsys.readouterr().err


def test_unknown_arch_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert pipeline.main(["--arch", "sparc64"]) == 2
    assert "unknown --arch" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("strip") is None, reason="strip (binutils) not installed")
def test_symbol_table_detection_sees_what_strip_removes(tmp_path: Path) -> None:
    import tokenizers

    library = tmp_path / "tokenizers.so"
    shutil.copy(next(Path(tokenizers.__file__).parent.glob("tokenizers*.so")), library)
    assert elf.has_symbol_table(library)  # the wheel ships it unstripped
    subprocess.run(["strip", "--strip-unneeded", str(library)], check=True)
    assert not elf.has_symbol_table(library)
    assert not elf.has_symbol_table(REPO / "build.py")  # not ELF at all


def test_model_copy_takes_exactly_the_manifest_files(tiny_package_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "source"
    shutil.copytree(tiny_package_dir, source)
    (source / "training-log.txt").write_text("not part of the package")

    summary = assemble.copy_model(source, tmp_path / "bundle" / "model")

    copied = sorted(p.name for p in (tmp_path / "bundle" / "model").iterdir())
    assert "training-log.txt" not in copied
    assert "manifest.json" in copied and "tokenizer.json" in copied
    assert {v["precision"] for v in summary["variants"].values()} == {"fp32", "int8"}
    assert all(oct(p.stat().st_mode & 0o777) == "0o644" for p in (tmp_path / "bundle" / "model").iterdir())


def test_model_without_an_int8_variant_is_refused(tiny_package_dir: Path, tmp_path: Path) -> None:
    import dataclasses

    from runtime.package.load import load_package
    from runtime.package.manifest import write_manifest

    source = tmp_path / "source"
    shutil.copytree(tiny_package_dir, source)
    manifest = load_package(source).manifest
    fp32_only = {name: v for name, v in manifest.variants.items() if v.precision == "fp32"}
    write_manifest(source, dataclasses.replace(manifest, variants=fp32_only))

    with pytest.raises(BuildError, match="int8"):
        assemble.copy_model(source, tmp_path / "bundle" / "model")


def test_model_with_a_changed_file_is_refused(tiny_package_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "source"
    shutil.copytree(tiny_package_dir, source)
    golden = source / "golden.jsonl"
    golden.write_text(golden.read_text().replace("rain", "snow", 1))

    with pytest.raises(BuildError, match="checksum"):
        assemble.copy_model(source, tmp_path / "bundle" / "model")


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root")
def test_mounts_below_a_root_are_undone_before_it_is_deleted(tmp_path: Path) -> None:
    inside = tmp_path / "root" / "proc"
    inside.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(inside)], check=True)
    try:
        root.unmount_below(tmp_path / "root")
        assert not os.path.ismount(inside)
    finally:
        if os.path.ismount(inside):
            subprocess.run(["umount", str(inside)], check=False)


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb not installed")
def test_an_unpacked_deb_is_listed_like_dpkg_and_absolute_library_links_become_relative(tmp_path: Path) -> None:
    """The arm64 root is unpacked natively: files land, dpkg's file list names them (the licence
    step reads it), and an absolute symlink in the multiarch dir points into the root, not the host."""
    package = tmp_path / "pkg"
    (package / "DEBIAN").mkdir(parents=True)
    (package / "DEBIAN" / "control").write_text(
        "Package: libdemo1\nVersion: 1.0\nArchitecture: arm64\nMaintainer: t <t@t>\nDescription: demo\n")
    libdir = package / "usr" / "lib" / "aarch64-linux-gnu"
    libdir.mkdir(parents=True)
    (libdir / "libdemo.so.1").write_bytes(b"\x7fELF-demo")
    (libdir / "libdemo.so").symlink_to("/usr/lib/aarch64-linux-gnu/libdemo.so.1")
    deb = tmp_path / "libdemo1_1.0_arm64.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(package), str(deb)],
                   check=True, capture_output=True)
    target = tmp_path / "root"
    target.mkdir()

    root.unpack_deb(deb, target)
    root.finish_extracted_root(target)

    owners = assemble.dpkg_file_owners(target)
    assert owners["/usr/lib/aarch64-linux-gnu/libdemo.so.1"] == "libdemo1"
    link = target / "usr" / "lib" / "aarch64-linux-gnu" / "libdemo.so"
    assert os.readlink(link) == "libdemo.so.1"
    assert link.read_bytes() == b"\x7fELF-demo"


def test_a_zip_belongs_to_the_tree_only_with_its_commit_inputs_and_checksum(tmp_path: Path) -> None:
    stem = pipeline.zip_stem("x86_64")
    zip_path = tmp_path / f"{stem}.zip"
    zip_path.write_bytes(b"zip bytes")
    manifest = {"zip": zip_path.name, "commit": "abc", "inputs_digest": "d1",
                "zip_sha256": hashlib.sha256(b"zip bytes").hexdigest()}
    (tmp_path / f"{stem}.json").write_text(json.dumps(manifest))

    assert matrix.matching_zip(tmp_path, "x86_64", "abc", "d1") == zip_path
    assert matrix.matching_zip(tmp_path, "x86_64", "abd", "d1") is None  # another commit
    assert matrix.matching_zip(tmp_path, "x86_64", "abc+dirty", "d1") is None  # a dirty tree of it
    assert matrix.matching_zip(tmp_path, "x86_64", "abc", "d2") is None  # other inputs
    assert matrix.matching_zip(tmp_path, "aarch64", "abc", "d1") is None
    zip_path.write_bytes(b"zip bytes, half written")
    assert matrix.matching_zip(tmp_path, "x86_64", "abc", "d1") is None


def test_strict_mode_turns_a_skipped_heavy_test_into_a_failure(tmp_path: Path) -> None:
    (tmp_path / "test_demo.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.heavy\ndef test_needs_a_zip():\n    pytest.skip('no root here')\n\n"
        "def test_light():\n    pytest.skip('not heavy')\n")
    command = [sys.executable, "-m", "pytest", "-p", "strict_mode", "-q", "-p", "no:cacheprovider",
               str(tmp_path / "test_demo.py")]
    env = {**os.environ, "PYTHONPATH": str(REPO / "tests")}  # where the plugin module lives

    lenient = subprocess.run(command, env={**env, "DECIDE_STRICT": "0"}, cwd=tmp_path,
                             capture_output=True, text=True, check=False)
    strict = subprocess.run(command, env={**env, "DECIDE_STRICT": "1"}, cwd=tmp_path,
                            capture_output=True, text=True, check=False)

    assert lenient.returncode == 0, lenient.stdout
    assert "2 skipped" in lenient.stdout
    assert strict.returncode == 1, strict.stdout
    assert "1 failed, 1 skipped" in strict.stdout
    assert "no root here" in strict.stdout
