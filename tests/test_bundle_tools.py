"""build.py's own logic, without building: ELF version reading, zip symlinks, pins, mirrors."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from build_module import load_build_module

REPO = Path(__file__).resolve().parent.parent


build = load_build_module()


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
    assert build.elf_needed_versions(library) == set(re.findall(r"Name: (\S+)", needed_section))


def test_glibc_floor_of_the_onnxruntime_wheel_is_its_manylinux_tag(tmp_path: Path) -> None:
    shutil.copy(onnxruntime_extension(), tmp_path / "ort.so")
    (tmp_path / "notes.txt").write_text("not an ELF file")
    (tmp_path / "link.so").symlink_to("ort.so")  # counted once, through its target

    floor = build.glibc_floor(tmp_path)

    assert floor["elf_files"] == 1
    assert build.version_tuple("2.17") <= build.version_tuple(floor["glibc"]) <= build.version_tuple("2.28")
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

    build.write_zip(app, zip_path)

    target = tmp_path / "unzipped"
    if shutil.which("unzip"):
        subprocess.run(["unzip", "-q", str(zip_path), "-d", str(target)], check=True)
    else:
        sys.path.insert(0, str(REPO / "tests"))
        from test_bundle import extract_with_symlinks

        extract_with_symlinks(zip_path, target)
    link = target / "decide" / "_internal" / "libreal.so"
    assert link.is_symlink() and os.readlink(link) == "pkg/libreal.so"
    assert link.read_bytes() == (app / "_internal" / "pkg" / "libreal.so").read_bytes()
    assert os.access(target / "decide" / "decide", os.X_OK)


def test_pins_follow_includes_and_reject_ranges(tmp_path: Path) -> None:
    (tmp_path / "base.txt").write_text("# runtime\nnumpy==2.4.6  # why\n")
    (tmp_path / "build.txt").write_text("-r base.txt\npyinstaller==6.22.3\n")
    assert build.read_pins(tmp_path / "build.txt") == {"numpy": "2.4.6", "pyinstaller": "6.22.3"}
    (tmp_path / "loose.txt").write_text("numpy>=2\n")
    with pytest.raises(build.BuildError, match="not pinned"):
        build.read_pins(tmp_path / "loose.txt")


def test_build_pins_cover_the_runtime_pins() -> None:
    runtime_pins = build.read_pins(REPO / "requirements.txt")
    build_pins = build.read_pins(REPO / "requirements-build.txt")
    assert runtime_pins.items() <= build_pins.items()
    assert "pyinstaller" in build_pins


def test_wheel_prefix_normalizes_names() -> None:
    assert build.wheel_prefix("py-cpuinfo", "9.0.0") == "py_cpuinfo-9.0.0-"
    assert build.wheel_prefix("pyinstaller-hooks-contrib", "2026.9") == "pyinstaller_hooks_contrib-2026.9-"


def test_mirrors_from_deb822_and_one_line_sources(tmp_path: Path) -> None:
    deb822 = tmp_path / "a"
    (deb822 / "sources.list.d").mkdir(parents=True)
    (deb822 / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\n# http://old.example/debian\nURIs: http://mirror.example/debian\n"
        "Suites: bookworm bookworm-updates\nComponents: main\n\n"
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n")
    assert build.host_debian_mirrors(deb822) == (
        "http://mirror.example/debian", "http://mirror.example/debian-security")

    one_line = tmp_path / "b"
    (one_line / "sources.list.d").mkdir(parents=True)
    (one_line / "sources.list").write_text(
        "deb [arch=amd64] http://m.example/debian/ bullseye main\n"
        "deb http://m.example/debian-security bullseye-security main\n")
    assert build.host_debian_mirrors(one_line) == ("http://m.example/debian", "http://m.example/debian-security")

    empty = tmp_path / "c"
    (empty / "sources.list.d").mkdir(parents=True)
    with pytest.raises(build.Refused, match="--mirror"):
        build.host_debian_mirrors(empty)


def test_debian_versions_sort_numerically() -> None:
    versions = ["3.11.2-6+deb12u9", "3.11.2-6", "3.11.2-6+deb12u10", "3.11.2-6+deb12u8"]
    newest_first = sorted(versions, key=build._debian_version_key, reverse=True)
    assert newest_first == ["3.11.2-6+deb12u10", "3.11.2-6+deb12u9", "3.11.2-6+deb12u8", "3.11.2-6"]


def test_an_emulated_root_runs_its_commands_under_qemu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """aarch64 on an x86_64 host: chroot means qemu_user's private binfmt_misc, not plain chroot."""
    commands: list[list[str]] = []
    monkeypatch.setattr(build, "run", lambda cmd, **_: commands.append(cmd) or "")
    monkeypatch.setattr(build.platform, "machine", lambda: "x86_64")
    arm = build.BuildRoot(tmp_path / "root", build.ARCHES["aarch64"])
    native = build.BuildRoot(tmp_path / "root", build.ARCHES["x86_64"])
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
    owners = build.dpkg_file_owners(tmp_path)
    assert owners["/usr/lib/aarch64-linux-gnu/libssl.so.1.1"] == "libssl1.1"
    assert owners["/lib/aarch64-linux-gnu/libz.so.1"] == "zlib1g"
    assert "lib/aarch64-linux-gnu/not-a-listed-file" not in owners


def test_building_another_arch_needs_an_x86_64_host(capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build.platform, "machine", lambda: "ppc64le")
    assert build.main(["--arch", "aarch64"]) == 2
    assert "building aarch64 on ppc64le is not supported" in capsys.readouterr().err


def test_unknown_arch_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert build.main(["--arch", "sparc64"]) == 2
    assert "unknown --arch" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("strip") is None, reason="strip (binutils) not installed")
def test_symbol_table_detection_sees_what_strip_removes(tmp_path: Path) -> None:
    import tokenizers

    library = tmp_path / "tokenizers.so"
    shutil.copy(next(Path(tokenizers.__file__).parent.glob("tokenizers*.so")), library)
    assert build.elf_has_symbol_table(library)  # the wheel ships it unstripped
    subprocess.run(["strip", "--strip-unneeded", str(library)], check=True)
    assert not build.elf_has_symbol_table(library)
    assert not build.elf_has_symbol_table(REPO / "build.py")  # not ELF at all


def test_model_copy_takes_exactly_the_manifest_files(tiny_package_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "source"
    shutil.copytree(tiny_package_dir, source)
    (source / "training-log.txt").write_text("not part of the package")

    summary = build.copy_model(source, tmp_path / "bundle" / "model")

    copied = sorted(p.name for p in (tmp_path / "bundle" / "model").iterdir())
    assert "training-log.txt" not in copied
    assert "manifest.json" in copied and "tokenizer.json" in copied
    assert {v["precision"] for v in summary["variants"].values()} == {"fp32", "int8"}
    assert all(oct(p.stat().st_mode & 0o777) == "0o644" for p in (tmp_path / "bundle" / "model").iterdir())


def test_model_without_an_int8_variant_is_refused(tiny_package_dir: Path, tmp_path: Path) -> None:
    import dataclasses

    from runtime.package import load_package, write_manifest

    source = tmp_path / "source"
    shutil.copytree(tiny_package_dir, source)
    manifest = load_package(source).manifest
    fp32_only = {name: v for name, v in manifest.variants.items() if v.precision == "fp32"}
    write_manifest(source, dataclasses.replace(manifest, variants=fp32_only))

    with pytest.raises(build.BuildError, match="int8"):
        build.copy_model(source, tmp_path / "bundle" / "model")


def test_model_with_a_changed_file_is_refused(tiny_package_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "source"
    shutil.copytree(tiny_package_dir, source)
    golden = source / "golden.jsonl"
    golden.write_text(golden.read_text().replace("rain", "snow", 1))

    with pytest.raises(build.BuildError, match="checksum"):
        build.copy_model(source, tmp_path / "bundle" / "model")


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root")
def test_mounts_below_a_root_are_undone_before_it_is_deleted(tmp_path: Path) -> None:
    inside = tmp_path / "root" / "proc"
    inside.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(inside)], check=True)
    try:
        build.unmount_below(tmp_path / "root")
        assert not os.path.ismount(inside)
    finally:
        if os.path.ismount(inside):
            subprocess.run(["umount", str(inside)], check=False)
