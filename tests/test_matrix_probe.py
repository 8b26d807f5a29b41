"""The emulation harness really emulates, also for a frozen (PyInstaller) program.

A throwaway onedir binary prints the CPU flags it sees (CPUID on x86). Run under each emulated
x86 model through bundle_spec/qemu_user.py, the flags must be the model's, not the host's — proof that
the bootloader's re-exec no longer escapes qemu. The binary is cached by source hash in
~/.cache/decide/matrix-probe (PyInstaller takes ~30 s on 2 cores).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from zips import zip_of_this_tree

from bundle_spec import elf, qemu_user
from bundle_spec import matrix as emulation

PROBE_SOURCE = '''\
"""Print the CPU flags this process sees, as JSON (CPUID on x86, getauxval on arm64)."""
import ctypes, json, platform
machine = platform.machine()
if machine == "x86_64":
    from cpuinfo import cpuinfo
    cpuid = cpuinfo.CPUID(cpuinfo.Trace(False, False))
    flags = sorted(cpuid.get_flags(cpuid.get_max_extension_support()))
else:
    getauxval = ctypes.CDLL(None).getauxval
    getauxval.restype, getauxval.argtypes = ctypes.c_ulong, [ctypes.c_ulong]
    flags = [hex(getauxval(16)), hex(getauxval(26))]
print(json.dumps({"machine": machine, "flags": flags}))
'''

pytestmark = pytest.mark.heavy
CACHE = Path.home() / ".cache" / "decide" / "matrix-probe"

# What each model must show (present) and must not show (absent): the steps between tiers.
X86_EXPECTED: dict[str, tuple[set[str], set[str]]] = {
    "Conroe": ({"sse2", "ssse3"}, {"sse4_1", "sse4_2", "popcnt", "avx"}),
    "Penryn": ({"ssse3", "sse4_1"}, {"sse4_2", "popcnt", "avx"}),
    "Nehalem": ({"sse4_2", "popcnt"}, {"avx", "avx2"}),
    "SandyBridge": ({"sse4_2", "avx"}, {"avx2", "fma"}),
    "Haswell": ({"avx", "avx2", "fma"}, {"avx512f", "avx512vnni"}),
    "max": ({"avx2", "fma"}, set()),
}


def build_probe_binary() -> Path:
    """Freeze PROBE_SOURCE with PyInstaller (onedir) once per source version; return the binary."""
    digest = hashlib.sha256(PROBE_SOURCE.encode()).hexdigest()[:12]
    work = CACHE / digest
    binary = work / "dist" / "cpuprobe" / "cpuprobe"
    if binary.is_file():
        return binary
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    (work / "cpuprobe.py").write_text(PROBE_SOURCE)
    cmd = [sys.executable, "-m", "PyInstaller", "--onedir", "--noconfirm", "--log-level=WARN",
           "--distpath", "dist", "--workpath", "build", "--specpath", ".", "cpuprobe.py"]
    done = subprocess.run(cmd, cwd=work, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"PyInstaller failed:\n{done.stderr[-3000:]}")
    return binary


@pytest.fixture(scope="module")
def probe_binary() -> Path:
    """The frozen probe (x86_64), or skip when PyInstaller or emulation is not available."""
    pytest.importorskip("PyInstaller")
    try:
        qemu_user.ensure_qemu()
    except qemu_user.EmulationUnavailable as exc:
        pytest.skip(str(exc))
    binary = build_probe_binary()
    info = elf.read_elf_info(binary)
    assert info is not None and info.elf_type == elf.ET_EXEC, "bootloader must be ET_EXEC"
    return binary


def run_probe(binary: Path, cpu: str) -> dict:
    """Run the frozen probe on an emulated x86 CPU and parse its JSON line."""
    done = qemu_user.run_emulated([str(binary)], "x86_64", cpu, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("model", list(X86_EXPECTED))
def test_frozen_probe_sees_the_emulated_x86_model(probe_binary: Path, model: str) -> None:
    present, absent = X86_EXPECTED[model]
    seen = set(run_probe(probe_binary, emulation.X86_CPU_MODELS[model])["flags"])
    assert present <= seen, f"{model}: missing {present - seen}"
    assert not (absent & seen), f"{model}: has {absent & seen}, so it ran on the host CPU"


def test_each_x86_model_gives_different_flags(probe_binary: Path) -> None:
    seen = {m: frozenset(run_probe(probe_binary, m)["flags"]) for m in ("Penryn", "Nehalem")}
    assert seen["Penryn"] < seen["Nehalem"]


def test_plain_qemu_alone_is_escaped_by_the_bootloader(probe_binary: Path) -> None:
    """Why the harness exists: under `qemu-x86_64 -cpu Conroe ./binary` the bootloader's
    re-exec runs natively, so the program reports the host's flags instead of Conroe's."""
    host = json.loads(subprocess.run([str(probe_binary)], capture_output=True, text=True,
                                     check=True).stdout)["flags"]
    if "sse4_2" not in host:
        pytest.skip("host CPU is as old as Conroe: escape cannot be told apart")
    done = subprocess.run(
        [str(qemu_user.QEMU_BINARIES["x86_64"]), "-cpu", "Conroe", str(probe_binary)],
        capture_output=True, text=True, timeout=300, check=True,
    )
    assert json.loads(done.stdout.strip().splitlines()[-1])["flags"] == host


# ARM64: the same probe frozen inside the arm64 build root (the one the aarch64 zip of this tree
# was built in), then run with each QEMU_CPU model. HWCAP bits: asimd 1<<1, asimddp 1<<20,
# sve 1<<22; HWCAP2: i8mm 1<<13, bf16 1<<14.
ARM_PYTHON = "/build/venv/bin/python"  # the build venv: PyInstaller is there
ARM_EXPECTED: dict[str, tuple[dict[str, bool], dict[str, bool]]] = {
    "cortex-a53": ({"asimd": True, "asimddp": False, "sve": False}, {"i8mm": False}),
    "cortex-a72": ({"asimd": True, "asimddp": False, "sve": False}, {"i8mm": False}),
    "neoverse-n1": ({"asimd": True, "asimddp": True, "sve": False}, {"i8mm": False}),
    "max": ({"asimd": True, "asimddp": True, "sve": False}, {"i8mm": True, "bf16": True}),
}
HWCAP_BITS = {"asimd": 1 << 1, "asimddp": 1 << 20, "sve": 1 << 22}
HWCAP2_BITS = {"i8mm": 1 << 13, "bf16": 1 << 14}


@pytest.fixture(scope="module")
def arm_root() -> Path:
    """The arm64 build root of this tree's aarch64 zip (made by building that zip if need be)."""
    return emulation.arm_libc_root(zip_of_this_tree("aarch64"))


@pytest.fixture(scope="module")
def arm_probe_binary(arm_root: Path) -> str:
    """The probe frozen by PyInstaller inside the arm64 root (path inside the root)."""
    try:
        qemu_user.ensure_qemu()
    except qemu_user.EmulationUnavailable as exc:
        pytest.skip(str(exc))
    digest = hashlib.sha256(PROBE_SOURCE.encode()).hexdigest()[:12]
    work = f"/build/matrix-probe/{digest}"
    binary = f"{work}/dist/cpuprobe/cpuprobe"
    if not (arm_root / binary.lstrip("/")).is_file():
        host_work = arm_root / work.lstrip("/")
        shutil.rmtree(host_work, ignore_errors=True)
        host_work.mkdir(parents=True)
        (host_work / "cpuprobe.py").write_text(PROBE_SOURCE)
        done = qemu_user.run_emulated(
            [ARM_PYTHON, "-m", "PyInstaller", "--onedir", "--noconfirm", "--log-level=WARN",
             "--distpath", "dist", "--workpath", "build", "--specpath", ".", "cpuprobe.py"],
            "aarch64", "cortex-a72", root=arm_root, workdir=Path(work), timeout=1800,
        )
        assert done.returncode == 0, done.stderr[-3000:]
    return binary


@pytest.mark.parametrize("model", list(ARM_EXPECTED))
def test_frozen_probe_sees_the_emulated_arm_model(arm_root: Path, arm_probe_binary: str, model: str) -> None:
    done = qemu_user.run_emulated([arm_probe_binary], "aarch64", emulation.ARM_CPU_MODELS[model],
                                  root=arm_root, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["machine"] == "aarch64"
    hwcap, hwcap2 = (int(v, 16) for v in out["flags"])
    want1, want2 = ARM_EXPECTED[model]
    assert {n: bool(hwcap & HWCAP_BITS[n]) for n in want1} == want1
    assert {n: bool(hwcap2 & HWCAP2_BITS[n]) for n in want2} == want2
