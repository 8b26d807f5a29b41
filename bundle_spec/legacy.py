"""The legacy numeric stack (numpy 1.26, SSE3 baseline) for x86_64 CPUs below x86-64-v2."""

from __future__ import annotations

import compileall
import json
import py_compile
import re
import shutil
import sys
import zipfile
from pathlib import Path

from bundle_spec.common import REPO, Arch, note, run
from bundle_spec.wheels import ensure_wheels
from runtime.platform.stack import LEGACY_DIR, LEGACY_NUMPY


def add_legacy_stack(arch: Arch, staging: Path, cache: Path, logs: Path, smoke: bool) -> None:
    """Unpack numpy 1.26.4 into _internal/legacy when a tier of platforms/<arch>.json needs it.

    CPUs below x86-64-v2 cannot run numpy 2.4; runtime/platform/stack.py puts this directory first on
    sys.path for those tiers (same onnxruntime). Left out: tests, f2py, distutils, C headers and
    static libraries, type stubs, and the SIMD test module _simd (0.6 MB zipped, imported by
    numpy's tests only). The modules are byte-compiled (unchecked-hash: zip timestamps cannot
    invalidate them), since a frozen app never writes bytecode and a Core 2 would otherwise
    compile numpy at every start.
    """
    tiers = json.loads((REPO / "platforms" / f"{arch.name}.json").read_text(encoding="utf-8"))["tiers"]
    legacy_tiers = [t["name"] for t in tiers if t.get("numeric_stack") == "legacy"]
    if not legacy_tiers:
        return
    name, _, version = LEGACY_NUMPY.partition("==")
    (wheel,) = ensure_wheels(arch, {name: version}, cache / "wheels" / f"{arch.name}-legacy", logs)
    target = staging / "_internal" / LEGACY_DIR
    skipped = re.compile(r"numpy/((.*/)?tests/|f2py/|distutils/|_pyinstaller/|core/include/|core/lib/"
                         r"|random/lib/|random/_examples/|core/_simd\.)|.*\.(pyi|pxd)$")
    with zipfile.ZipFile(wheel) as archive:
        members = [m for m in archive.namelist() if not skipped.match(m)]
        archive.extractall(target, members)
    for path in target.rglob("*.so*"):
        path.chmod(0o755)  # zipfile drops the mode bits
    if sys.version_info[:2] == (3, 11):  # same bytecode as the bundle's CPython 3.11
        compileall.compile_dir(target, quiet=1, workers=0,
                               invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    else:
        note(f"not byte-compiled (host Python is {sys.version.split()[0]}, the bundle's is 3.11)")
    licences = staging / "licenses" / f"{name}-{version}-legacy"
    licences.mkdir(parents=True, exist_ok=True)
    for licence in target.glob(f"{name}-{version}.dist-info/LICENSE*"):
        shutil.copy(licence, licences / licence.name)
    with open(staging / "licenses" / "README.txt", "a", encoding="utf-8") as index:
        index.write(f"{licences.name}/: {name} {version}, the legacy numeric stack (BSD-3-Clause; "
                    "its OpenBLAS and gfortran runtime licences are in the same file)\n")
    size = sum(p.stat().st_size for p in target.rglob("*") if p.is_file())
    note(f"legacy stack for tier {', '.join(legacy_tiers)}: {name} {version} in _internal/{LEGACY_DIR} "
         f"({size / 1e6:.1f} MB unpacked)")
    if smoke:  # the frozen app must import this numpy, not the one in its PYZ
        run([str(staging / "decide"), "selftest", "--tier", legacy_tiers[0]], log=logs / "smoke-legacy.log")
