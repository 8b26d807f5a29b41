"""Probe the CPU: architecture, instruction-set flags, usable cores (runtime/platform/cgroup.py).

Stdlib + py-cpuinfo's CPUID class only. This runs before numpy/onnxruntime are imported, because
which stack (and whether any) can run depends on the answer: importing them first could die
with "Illegal instruction" instead of a clear message.

Why not `cpuinfo.get_cpu_info()`: it sleeps 1 s, spawns subprocesses, re-executes
sys.executable when not frozen (inside a frozen app it can fork the app and write to stdout,
py-cpuinfo #80/#168) and under qemu-user reports the host's flags. The CPUID class executes the
instruction itself, which is fast and correct under emulation.
"""

from __future__ import annotations

import ctypes
import os
import platform
from dataclasses import dataclass
from typing import Any

from runtime.platform.cgroup import CpuBudget, cpu_budget

# Env var that replaces the probe, for tests and for trying a tier on another machine:
# "x86_64:sse2,sse4_2,popcnt" or "aarch64:asimd,asimddp".
FAKE_CPU_ENV = "DECIDE_FAKE_CPU"

# Linux <asm/hwcap.h> bits for arm64.
_AT_HWCAP = 16
_AT_HWCAP2 = 26
_ARM64_HWCAP = {
    "fp": 1 << 0,
    "asimd": 1 << 1,
    "aes": 1 << 3,
    "crc32": 1 << 7,
    "atomics": 1 << 8,
    "fphp": 1 << 9,
    "asimdhp": 1 << 10,
    "asimdrdm": 1 << 12,
    "asimddp": 1 << 20,
    "sve": 1 << 22,
    "asimdfhm": 1 << 23,
}
_ARM64_HWCAP2 = {
    "sve2": 1 << 1,
    "i8mm": 1 << 13,
    "bf16": 1 << 14,
}

_ARCH_ALIASES = {"amd64": "x86_64", "x86_64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}


@dataclass(frozen=True)
class CpuFeatures:
    """What the probe found: normalised architecture name, flag names, usable cores."""

    arch: str  # "x86_64", "aarch64", or the raw machine name when unknown
    flags: frozenset[str]
    usable_cores: int  # the smaller of affinity and the cgroup CPU quota (runtime/platform/cgroup.py)
    source: str  # "cpuid", "hwcap", "fake" or "none": where the flags came from
    cores_source: str = "affinity"  # where usable_cores comes from

    def has(self, flag: str) -> bool:
        """True if the CPU reports `flag`."""
        return flag in self.flags


def normalise_arch(machine: str) -> str:
    """Map platform.machine() spellings to the names used in platforms/*.json."""
    return _ARCH_ALIASES.get(machine.lower(), machine.lower())


def parse_fake_cpu(spec: str, budget: CpuBudget) -> CpuFeatures:
    """Parse the DECIDE_FAKE_CPU form "arch:flag1,flag2"."""
    arch, _, flag_text = spec.partition(":")
    flags = frozenset(f.strip().lower() for f in flag_text.split(",") if f.strip())
    return CpuFeatures(normalise_arch(arch.strip()), flags, budget.cores, "fake", budget.source)


def _x86_flags() -> frozenset[str]:
    """CPUID flags via py-cpuinfo, plus AVX-VNNI and OS state support that it does not read."""
    # Imported here, not at module level: only x86 needs it, and its import runs `uname`/`file`
    # (via the platform module) — harmless, but not worth paying on ARM or with a fake CPU.
    from cpuinfo import cpuinfo as cpuinfo_module

    return x86_flags_from(cpuinfo_module.CPUID(cpuinfo_module.Trace(False, False)))


# py-cpuinfo's machine code for a leaf-7 query starts with `mov eax,7`.
_MOV_EAX_7 = b"\xB8\x07\x00\x00\x00"
_LEAF7 = 7


def max_basic_leaf(cpuid: Any) -> int:
    """CPUID(0).EAX: the highest basic leaf this CPU answers."""
    return cpuid._run_asm(
        b"\x31\xC0",  # xor eax,eax
        b"\x0f\xa2",  # cpuid
        b"\xC3",  # ret (eax)
    )


class _BasicLeafGuard:
    """Stands in for py-cpuinfo's CPUID object and answers leaf-7 queries with 0 when the CPU's
    highest basic leaf is below 7.

    Why: py-cpuinfo reads leaf 7 whenever the highest EXTENDED leaf (0x8000_0000+) is >= 7, which
    is always true. A CPU whose highest basic leaf is lower (Core 2 / Nehalem with the BIOS
    "limit CPUID maxval" option, Pentium 4, AMD K8/K10) does not have leaf 7: Intel CPUs (and
    qemu) then return the highest basic leaf's registers, which py-cpuinfo reads as avx2,
    avx512…, so the tier picker could choose code this CPU cannot run.
    """

    def __init__(self, cpuid: Any, max_basic: int) -> None:
        self._cpuid = cpuid
        self._max_basic = max_basic

    def _run_asm(self, *machine_code: bytes) -> int:
        if self._max_basic < _LEAF7 and _MOV_EAX_7 in b"".join(machine_code):
            return 0
        return self._cpuid._run_asm(*machine_code)

    def get_max_extension_support(self) -> int:
        """Highest extended leaf, as py-cpuinfo reads it."""
        return self._cpuid.get_max_extension_support()


def x86_flags_from(cpuid: Any) -> frozenset[str]:
    """Flag names from a py-cpuinfo CPUID object, leaf 7 only if CPUID(0).EAX >= 7, plus the
    extras of `_x86_extra_flags`, minus vector flags the OS does not enable."""
    guarded = _BasicLeafGuard(cpuid, max_basic_leaf(cpuid))
    # get_flags only calls self._run_asm: run py-cpuinfo's decoding on the guarded object.
    flags = set(type(cpuid).get_flags(guarded, guarded.get_max_extension_support()))
    flags |= _x86_extra_flags(guarded, flags)
    return frozenset(drop_unusable_vector_flags(flags))


def drop_unusable_vector_flags(flags: set[str]) -> set[str]:
    """Remove AVX/AVX-512 flags the OS does not enable (XCR0), as the kernel does in /proc/cpuinfo.

    CPUID reports what the silicon has; AVX code still faults if the OS does not save the
    registers. Without OSXSAVE there is no AVX at all; "xcr0", "os_avx", "os_avx512" come
    from XGETBV.
    """
    if "osxsave" in flags and "xcr0" not in flags:
        return flags  # OSXSAVE set but XGETBV could not run: keep CPUID's word (MLAS re-checks)
    kept = set(flags)
    if "os_avx" not in flags:
        kept -= {f for f in flags if f.startswith("avx") or f in {"fma", "f16c"}}
    if "os_avx512" not in flags:
        kept -= {f for f in flags if f.startswith("avx512")}
    return kept


def _x86_extra_flags(cpuid: object, flags: set[str]) -> set[str]:
    """AVX-VNNI (CPUID 7.1:EAX[4]) and whether the OS saves AVX/AVX-512 state (XCR0).

    Uses the CPUID object's private `_run_asm`; if that ever changes we only lose these
    extras (MLAS re-checks XCR0 itself, so a wrong guess costs speed, never a crash).
    """
    extra: set[str] = set()
    run_asm = getattr(cpuid, "_run_asm", None)
    if run_asm is None:
        return extra
    try:
        if "avx2" in flags:
            leaf7_1_eax = run_asm(
                b"\xB9\x01\x00\x00\x00",  # mov ecx,1
                b"\xB8\x07\x00\x00\x00",  # mov eax,7
                b"\x0f\xa2",  # cpuid
                b"\xC3",  # ret (eax)
            )
            if leaf7_1_eax & (1 << 4):
                extra.add("avx_vnni")
        if "osxsave" in flags:
            xcr0 = run_asm(
                b"\x31\xC9",  # xor ecx,ecx
                b"\x0f\x01\xd0",  # xgetbv
                b"\xC3",  # ret (eax)
            )
            extra.add("xcr0")  # marks that XGETBV ran, so missing os_avx means "OS disabled"
            if xcr0 & 0b110 == 0b110:
                extra.add("os_avx")
            if xcr0 & 0b11100110 == 0b11100110:
                extra.add("os_avx512")
    except (OSError, ValueError, TypeError):
        return set()
    return extra


def _arm64_flags() -> frozenset[str]:
    """HWCAP bits via getauxval (correct per emulated CPU model under qemu, unlike /proc/cpuinfo)."""
    libc = ctypes.CDLL(None)
    getauxval = libc.getauxval
    getauxval.restype = ctypes.c_ulong
    getauxval.argtypes = [ctypes.c_ulong]
    return hwcap_flags(getauxval(_AT_HWCAP), getauxval(_AT_HWCAP2))


def hwcap_flags(hwcap: int, hwcap2: int) -> frozenset[str]:
    """Flag names (as in /proc/cpuinfo "Features") for arm64 AT_HWCAP/AT_HWCAP2 bit masks."""
    flags = {name for name, bit in _ARM64_HWCAP.items() if hwcap & bit}
    flags |= {name for name, bit in _ARM64_HWCAP2.items() if hwcap2 & bit}
    return frozenset(flags)


def probe() -> CpuFeatures:
    """Probe this CPU (or read DECIDE_FAKE_CPU). Never raises; unknown → empty flag set."""
    budget = cpu_budget()
    cores, why = budget.cores, budget.source
    fake = os.environ.get(FAKE_CPU_ENV)
    if fake:
        return parse_fake_cpu(fake, budget)
    arch = normalise_arch(platform.machine())
    try:
        if arch == "x86_64":
            return CpuFeatures(arch, _x86_flags(), cores, "cpuid", why)
        if arch == "aarch64":
            return CpuFeatures(arch, _arm64_flags(), cores, "hwcap", why)
    except (OSError, AttributeError, ImportError) as exc:
        # A probe failure must not crash the launcher: the tier picker then refuses clearly.
        return CpuFeatures(arch, frozenset({f"probe-error:{type(exc).__name__}"}), cores, "none", why)
    return CpuFeatures(arch, frozenset(), cores, "none", why)
