"""The pinned wheels for the target and the build venv in the root, both made natively.

The venv is a pyvenv.cfg plus a symlink to the root's /opt/py311 interpreter, and the host's pip
installs the target's wheels into it (`--target` with the target's platform tags: installing a
wheel is unpacking files, it needs no target CPU). Under qemu, `python -m venv` and pip took
~2 min of the aarch64 build.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import sys
from pathlib import Path

from bundle_spec.common import PYTHON_PREFIX, Arch, BuildError, note, run
from bundle_spec.python import build_python_for_cross
from bundle_spec.root import BuildRoot

VENV = "/build/venv"  # inside the root


def read_pins(requirements: Path) -> dict[str, str]:
    """`name==version` pins of a requirements file, following `-r other.txt` includes."""
    pins: dict[str, str] = {}
    for raw in requirements.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("-r"):
            pins.update(read_pins(requirements.parent / line[2:].strip()))
            continue
        name, sep, version = line.partition("==")
        if not sep:
            raise BuildError(f"{requirements}: '{line}' is not pinned with ==")
        pins[name.strip()] = version.strip()
    return pins


def wheel_prefix(name: str, version: str) -> str:
    """How a wheel file of `name==version` starts (names normalized as wheels spell them)."""
    return f"{re.sub(r'[-_.]+', '_', name).lower()}-{version}-"


def target_platform_options(arch: Arch) -> list[str]:
    """pip options that select wheels for CPython 3.11 on `arch` instead of the host."""
    platforms = [arg for tag in (*arch.wheel_platforms, "any") for arg in ("--platform", tag)]
    return ["--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
            "--abi", "cp311", "--abi", "abi3", "--abi", "none", *platforms]


def ensure_wheels(arch: Arch, pins: dict[str, str], wheel_dir: Path, logs: Path) -> list[Path]:
    """One wheel per pin for the target, downloaded by the host's pip unless already cached."""
    wheel_dir.mkdir(parents=True, exist_ok=True)

    def cached(name: str, version: str) -> Path | None:
        prefix = wheel_prefix(name, version)
        return next((p for p in sorted(wheel_dir.glob("*.whl")) if p.name.lower().startswith(prefix)), None)

    missing = [f"{n}=={v}" for n, v in pins.items() if cached(n, v) is None]
    if missing:
        note(f"downloading {len(missing)} wheels: {' '.join(missing)}")
        run([sys.executable, "-m", "pip", "download", "--no-deps", *target_platform_options(arch),
             "--dest", str(wheel_dir), *missing], log=logs / "wheels.log")
    wheels = []
    for name, version in pins.items():
        wheel = cached(name, version)
        if wheel is None:
            raise BuildError(f"pip did not deliver a wheel for {name}=={version} ({arch.name})")
        wheels.append(wheel)
        note(f"{wheel.name}  {wheel.stat().st_size / 1e6:.1f} MB")
    return wheels


def ensure_venv(root: BuildRoot, wheels: list[Path], logs: Path) -> None:
    """/build/venv in the root: the compiled Python plus exactly the pinned wheels (no deps).

    --no-deps on purpose: tokenizers declares huggingface-hub and onnxruntime declares
    protobuf/sympy, none of which the runtime imports; leaving them out keeps them out of
    the bundle.
    """
    digest = hashlib.sha256("|".join([root.stamp_digest("python"), *(w.name for w in wheels)]).encode()).hexdigest()
    venv = root.path / VENV.lstrip("/")
    site = venv / "lib" / "python3.11" / "site-packages"
    if root.stamp_matches("venv", digest) and site.is_dir():
        note(f"reusing {VENV}")
        return
    shutil.rmtree(venv, ignore_errors=True)
    (venv / "bin").mkdir(parents=True)
    site.mkdir(parents=True)
    (venv / "lib64").symlink_to("lib")
    for name in ("python", "python3", "python3.11"):
        (venv / "bin" / name).symlink_to(f"{PYTHON_PREFIX}/bin/python3.11")  # resolved in the root
    (venv / "pyvenv.cfg").write_text(f"home = {PYTHON_PREFIX}/bin\ninclude-system-site-packages = false\n")
    run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
         *target_platform_options(root.arch), "--target", str(site), *map(str, wheels)],
        log=logs / "venv.log")
    # Byte-compiled here by a host CPython 3.11 (same bytecode): under qemu, PyInstaller would
    # otherwise compile every module it imports, in every one of its helper processes.
    try:
        run([build_python_for_cross(), "-m", "compileall", "-q", "-j0", str(site)], log=logs / "venv.log")
    except BuildError as exc:
        note(f"not byte-compiled natively ({exc}); PyInstaller compiles on the target instead")
    note(f"{len(wheels)} wheels installed natively into {VENV}")
    root.write_stamp("venv", digest)
