"""The build's steps in order, its command line, and the build manifest.

Steps, each printed with its start time (long outputs go to build/<arch>/logs/):
  1. host checks   root, host tools (apt-installed if missing), qemu for another arch, the model
  2. build root    Debian 11 (glibc 2.31): debootstrap on x86_64, arm64 unpacked natively  [cached]
  3. python        CPython 3.11 from Debian's source pool; every extension module imported   [cached]
  4. wheels        the pinned wheels, downloaded on the host for the target                  [cached]
  5. venv          those wheels in a venv of that Python, installed natively                 [cached]
  6. freeze        PyInstaller onedir with bundle_spec/decide.spec, inside the root (emulated
                   for aarch64: it runs the target's Python), then strip
  7. assemble      models/, platforms/, README, licences; the legacy numpy stack (x86_64)
  8. glibc floor   highest GLIBC_ version any ELF in the bundle needs; fails above --max-glibc
  9. smoke test    `decide selftest` (emulated on the arch's oldest CPU model for aarch64)
 10. zip           zip with symlinks kept, .sha256, build manifest, size report

Only PyInstaller, the extension-module check, ldconfig and the smoke test run under qemu for
aarch64; everything else is native (measured step times: README, "The bundle").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import sys
from pathlib import Path

from bundle_spec import qemu_user
from bundle_spec.archive import installed_versions, print_report, size_report, write_zip
from bundle_spec.assemble import assemble
from bundle_spec.checks import glibc_floor, smoke_test
from bundle_spec.common import (
    ARCHES,
    DEFAULT_CACHE,
    DEFAULT_MAX_GLIBC,
    PYTHON_PREFIX,
    PYTHON_SOURCE,
    REPO,
    ROOT_SUITE,
    STEP_CPU_SECONDS,
    STEP_SECONDS,
    Arch,
    BuildError,
    Refused,
    finish_steps,
    note,
    run,
    step,
    version_tuple,
)
from bundle_spec.freeze import freeze
from bundle_spec.legacy import add_legacy_stack
from bundle_spec.python import ensure_python
from bundle_spec.root import (
    BuildRoot,
    ensure_extracted_root,
    ensure_native_root,
    hold_build_lock,
    host_debian_mirrors,
)
from bundle_spec.source_tree import git_commit, inputs_digest
from bundle_spec.wheels import ensure_venv, ensure_wheels, read_pins
from runtime.package.load import sha256_file
from runtime.platform.appdir import DEFAULT_MODEL
from runtime.version import __version__ as VERSION

STEPS = 10


def host_tools(arch: Arch) -> dict[str, str]:
    """Program → Debian package the build needs on the host for `arch`."""
    tools = {"debootstrap": "debootstrap", "dpkg-deb": "dpkg", "apt-get": "apt"}
    if arch.emulated:
        tools |= {f"{arch.triplet}-gcc": f"gcc-{arch.triplet}", f"{arch.triplet}-strip": f"binutils-{arch.triplet}",
                  "make": "make", "pkg-config": "pkg-config", "patch": "patch", "xz": "xz-utils",
                  "python3.11": "python3.11"}
    return tools


def zip_stem(arch: str, model_dir: Path | None = None) -> str:
    """dist/<stem>.zip, .zip.sha256 and .json for this version and arch; a bundle of another
    model than the default is named after it (decide-<version>-<model>-linux-<arch>)."""
    if model_dir is None or Path(model_dir).resolve() == (REPO / DEFAULT_MODEL).resolve():
        return f"decide-{VERSION}-linux-{arch}"
    return f"decide-{VERSION}-{Path(model_dir).name}-linux-{arch}"


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Command-line options (all have working defaults)."""
    parser = argparse.ArgumentParser(
        prog="build.py", description="Build the decide bundle: dist/decide-<version>-linux-<arch>.zip.",
        epilog=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default=platform.machine(), help="target architecture (default: host)")
    parser.add_argument("--model", type=Path, default=REPO / DEFAULT_MODEL, help="model package to embed")
    parser.add_argument("--max-glibc", default=DEFAULT_MAX_GLIBC,
                        help="fail if any ELF needs a newer glibc (default %(default)s)")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE,
                        help="cache folder (default %(default)s; env DECIDE_BUILD_CACHE)")
    parser.add_argument("--dist", type=Path, default=REPO / "dist", help="output folder (default %(default)s)")
    parser.add_argument("--mirror", help="Debian archive URL (default: from the host's apt sources)")
    parser.add_argument("--security-mirror", help="Debian security URL (default: host's apt sources)")
    parser.add_argument("--nice", type=int, default=10, help="niceness of the heavy steps (default 10)")
    parser.add_argument("--no-smoke", action="store_true", help="skip `decide selftest` after building")
    return parser.parse_args(argv)


def check_host(args: argparse.Namespace) -> Arch:
    """Step 1: refuse early and clearly when this machine cannot build what was asked."""
    arch = ARCHES.get(args.arch)
    if arch is None:
        raise Refused(f"unknown --arch {args.arch!r}; known: {', '.join(ARCHES)}")
    if arch.emulated:
        if not arch.emulated_cpu or platform.machine() != "x86_64":
            raise Refused(f"building {arch.name} on {platform.machine()} is not supported")
        try:
            qemu_user.ensure_qemu()
        except qemu_user.EmulationUnavailable as exc:
            raise Refused(f"building {arch.name} here needs qemu-user: {exc}") from exc
    if os.geteuid() != 0:
        raise Refused("debootstrap, chroot and mount need root: run build.py as root")
    missing = sorted({package for tool, package in host_tools(arch).items() if shutil.which(tool) is None})
    if missing:
        if shutil.which("apt-get") is None:
            raise Refused(f"missing host packages {', '.join(missing)} and no apt-get to install them")
        note(f"installing {', '.join(missing)} with apt-get")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        wait = ["-o", "DPkg::Lock::Timeout=600"]  # another apt (e.g. the other arch's build) may be running
        run(["apt-get", *wait, "update", "-q"], env=env)
        run(["apt-get", *wait, "install", "-y", "-q", "--no-install-recommends", *missing], env=env)
    if not (args.model / "manifest.json").is_file():
        raise Refused(f"no model package at {args.model} (manifest.json missing): "
                      "build it with the factory in models/ first, or pass --model DIR")
    note(f"arch {arch.name}, model {args.model}, max glibc {args.max_glibc}, cache {args.cache}")
    return arch


def build(args: argparse.Namespace) -> dict[str, object]:
    """All steps; returns the build manifest (also written next to the zip)."""
    step(1, STEPS, "host checks")
    arch = check_host(args)
    _lock = hold_build_lock(args.cache / arch.name / "build.lock")  # released when build() returns
    mirrors = (args.mirror, args.security_mirror) if args.mirror and args.security_mirror \
        else host_debian_mirrors()
    logs = REPO / "build" / arch.name / "logs"
    shutil.rmtree(logs, ignore_errors=True)
    root = BuildRoot(args.cache / arch.name / "root", arch)

    if arch.emulated:
        step(2, STEPS, f"build root: Debian {ROOT_SUITE} ({arch.debian}), unpacked natively")
        ensure_extracted_root(root, mirrors, logs, args.nice)
        step(3, STEPS, f"python: CPython 3.11 cross-compiled for the root ({PYTHON_PREFIX})")
    else:
        step(2, STEPS, f"build root: Debian {ROOT_SUITE} ({arch.debian})")
        ensure_native_root(root, mirrors, logs, args.nice)
        step(3, STEPS, f"python: CPython 3.11 compiled in the root ({PYTHON_PREFIX})")
    python_source = ensure_python(root, mirrors, logs, args.nice)

    step(4, STEPS, "wheels: pinned in requirements-build.txt (+ requirements.txt)")
    wheels = ensure_wheels(arch, read_pins(REPO / "requirements-build.txt"),
                           args.cache / "wheels" / arch.name, logs)

    step(5, STEPS, "venv: compiled Python + exactly those wheels")
    ensure_venv(root, wheels, logs)

    step(6, STEPS, f"freeze: PyInstaller onedir (bundle_spec/decide.spec){', emulated' if arch.emulated else ''}")
    onedir = freeze(root, logs, args.nice)

    step(7, STEPS, "assemble: models/, platforms/, README, licences")
    staging = REPO / "build" / arch.name / "decide"
    model = assemble(onedir, staging, args.model, root, logs)
    add_legacy_stack(arch, staging, args.cache, logs, smoke=not args.no_smoke)

    step(8, STEPS, f"glibc floor (must be ≤ {args.max_glibc})")
    floor = glibc_floor(staging)
    note(f"{floor['elf_files']} ELF files; GLIBC_{floor.get('glibc')} (set by {floor['set_by'].get('glibc')}), "
         f"GLIBCXX_{floor.get('glibcxx')}, CXXABI_{floor.get('cxxabi')}")
    if version_tuple(str(floor["glibc"])) > version_tuple(args.max_glibc):
        raise BuildError(f"glibc floor {floor['glibc']} is above --max-glibc {args.max_glibc} "
                         f"({floor['set_by']['glibc']} needs it)")

    versions = installed_versions(root)
    build_info = {
        "name": "decide", "version": VERSION, "arch": arch.name, "commit": git_commit(),
        "inputs_digest": inputs_digest(args.model), "root": f"debian {ROOT_SUITE}",
        "python": f"3.11 ({PYTHON_SOURCE} {python_source})",
        "packages": {name: versions.get(re.sub(r"[-.]", "_", name), "?")
                     for name in read_pins(REPO / "requirements.txt")},
        "model": model, "glibc_floor": floor,
    }
    (staging / "build-info.json").write_text(json.dumps(build_info, indent=2) + "\n")

    step(9, STEPS, "smoke test: decide selftest" + (f" (emulated {arch.emulated_cpu})" if arch.emulated else ""))
    if args.no_smoke:
        note("skipped (--no-smoke)")
    else:
        smoke_test(staging, root, logs / "smoke.log")

    step(10, STEPS, "zip")
    args.dist.mkdir(parents=True, exist_ok=True)
    zip_path = args.dist / f"{zip_stem(arch.name, args.model)}.zip"
    write_zip(staging, zip_path)
    digest = sha256_file(zip_path)
    (args.dist / f"{zip_path.name}.sha256").write_text(f"{digest}  {zip_path.name}\n")
    sizes = size_report(staging)
    total = finish_steps()
    manifest = {**build_info, "zip": zip_path.name, "zip_bytes": zip_path.stat().st_size,
                "zip_sha256": digest, **sizes, "build_seconds": total, "step_seconds": dict(STEP_SECONDS),
                "step_cpu_seconds": dict(STEP_CPU_SECONDS),
                "build_root": str(root.path)}
    (args.dist / f"{zip_stem(arch.name, args.model)}.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print_report(manifest, zip_path)
    return manifest


def main(argv: list[str]) -> int:
    """Entry point; returns the process exit code."""
    args = parse_args(argv)
    try:
        build(args)
    except Refused as exc:
        print(f"build.py: refused: {exc}", file=sys.stderr)
        return 2
    except BuildError as exc:
        print(f"build.py: failed: {exc}", file=sys.stderr)
        return 1
    return 0
