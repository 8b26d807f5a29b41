"""CPU probe: fake CPUs parse, OS-disabled AVX is dropped, leaf 7 is read only when the CPU has
it, the real probe is sane and numpy-free."""

import json
import platform
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from cpuinfo import cpuinfo

from runtime.platform.cgroup import CpuBudget, cpu_budget
from runtime.platform.cpu import (
    CpuFeatures,
    drop_unusable_vector_flags,
    hwcap_flags,
    normalise_arch,
    parse_fake_cpu,
    probe,
    x86_flags_from,
)
from runtime.platform.tiers import load_platform, select

REPO = Path(__file__).resolve().parent.parent


def test_fake_cpu_spec_is_parsed():
    features = parse_fake_cpu("AMD64: SSE4_2, popcnt ,avx2", CpuBudget(3, "affinity (3 CPUs)", 3, None))
    assert features.arch == "x86_64"
    assert features.flags == {"sse4_2", "popcnt", "avx2"}
    assert features.usable_cores == 3 and features.source == "fake"


def test_arch_spellings_are_normalised():
    assert normalise_arch("arm64") == "aarch64"
    assert normalise_arch("x86_64") == "x86_64"
    assert normalise_arch("riscv64") == "riscv64"


def test_avx_flags_dropped_when_os_does_not_save_ymm_state():
    flags = {"sse4_2", "osxsave", "xcr0", "avx", "avx2", "fma", "avx512f", "avx_vnni"}  # no os_avx
    assert drop_unusable_vector_flags(flags) == {"sse4_2", "osxsave", "xcr0"}


def test_avx512_dropped_when_os_saves_only_ymm_state():
    flags = {"osxsave", "xcr0", "os_avx", "avx", "avx2", "avx512f", "avx512vnni"}
    assert drop_unusable_vector_flags(flags) == {"osxsave", "xcr0", "os_avx", "avx", "avx2"}


def test_flags_kept_when_xgetbv_could_not_run():
    flags = {"osxsave", "avx", "avx2"}  # MLAS re-checks XCR0 itself; a wrong guess costs speed only
    assert drop_unusable_vector_flags(flags) == flags


def test_no_osxsave_means_no_avx():
    assert drop_unusable_vector_flags({"sse4_2", "avx"}) == {"sse4_2"}


def test_real_probe_matches_this_machine(monkeypatch):
    monkeypatch.delenv("DECIDE_FAKE_CPU", raising=False)
    features = probe()
    assert features.arch == normalise_arch(platform.machine())
    assert features.usable_cores == cpu_budget().cores >= 1
    if features.arch == "x86_64":
        assert features.source == "cpuid"
        assert {"sse2", "sse4_2", "popcnt"} <= features.flags  # numpy 2.4 already runs here


def test_probe_imports_no_numeric_stack():
    code = "import sys; from runtime.platform.cpu import probe; probe(); print('numpy' in sys.modules, 'onnxruntime' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_arm64_hwcap_bits_map_to_feature_names():
    # Bits from <asm/hwcap.h>: HWCAP_ASIMD = 1 << 1, HWCAP_ASIMDDP = 1 << 20, HWCAP2_I8MM = 1 << 13.
    assert hwcap_flags(0b11, 0) == {"fp", "asimd"}  # Cortex-A53
    assert hwcap_flags(0b11 | 1 << 20, 0) == {"fp", "asimd", "asimddp"}  # Neoverse-N1
    assert {"asimddp", "sve", "i8mm", "bf16"} <= hwcap_flags(0b11 | 1 << 20 | 1 << 22, 1 << 13 | 1 << 14)


# ----------------------------------------------------------------------------- CPUID leaf 7

Registers = tuple[int, int, int, int]  # eax, ebx, ecx, edx


class FakeCpuid(cpuinfo.CPUID):
    """py-cpuinfo's CPUID class with the instruction replaced by a table of leaves.

    It interprets the machine-code snippets py-cpuinfo (and runtime.platform.cpu) pass to `_run_asm`
    (mov/xor into eax/ecx, cpuid, xgetbv, mov from ebx/ecx/edx, ret) and answers like an Intel
    CPU: a basic leaf above CPUID(0).EAX returns the highest basic leaf's registers.
    """

    def __init__(self, leaves: dict[int, Registers], max_extended: int = 0x80000008, xcr0: int = 0):
        # No super().__init__(): it only looks for SELinux, which a table does not need.
        self.leaves = leaves
        self.max_basic = leaves[0][0]
        self.max_extended = max_extended
        self.xcr0 = xcr0

    def cpuid(self, leaf: int) -> Registers:
        if leaf == 0x80000000:
            return (self.max_extended, 0, 0, 0)
        if leaf < 0x80000000 and leaf > self.max_basic:
            leaf = self.max_basic  # what Intel CPUs (and qemu) do
        return self.leaves.get(leaf, (0, 0, 0, 0))

    def _run_asm(self, *machine_code: bytes) -> int:
        code = b"".join(machine_code)
        regs = {"eax": 0, "ebx": 0, "ecx": 0, "edx": 0}
        at = 0
        while at < len(code):
            op = code[at]
            if op in (0xB8, 0xB9):  # mov eax/ecx, imm32
                regs["eax" if op == 0xB8 else "ecx"] = struct.unpack_from("<I", code, at + 1)[0]
                at += 5
            elif code[at:at + 2] in (b"\x31\xC0", b"\x31\xC9"):  # xor eax,eax / xor ecx,ecx
                regs["eax" if code[at + 1] == 0xC0 else "ecx"] = 0
                at += 2
            elif code[at:at + 2] == b"\x0f\xa2":  # cpuid
                regs["eax"], regs["ebx"], regs["ecx"], regs["edx"] = self.cpuid(regs["eax"])
                at += 2
            elif code[at:at + 3] == b"\x0f\x01\xd0":  # xgetbv
                regs["eax"] = self.xcr0
                at += 3
            elif code[at] == 0x89:  # mov eax, <ebx|ecx|edx>
                regs["eax"] = regs[{0xD8: "ebx", 0xC8: "ecx", 0xD0: "edx"}[code[at + 1]]]
                at += 2
            elif op == 0xC3:  # ret
                return regs["eax"]
            else:
                raise AssertionError(f"FakeCpuid cannot interpret {code[at:].hex()}")
        raise AssertionError("snippet without ret")


def bits(*positions: int) -> int:
    return sum(1 << p for p in positions)


# Leaf 1 of an SSSE3 CPU: EDX sse(25) sse2(26); ECX pni(0) ssse3(9).
CORE2_LEAF1: Registers = (0x6F6, 0, bits(0, 9), bits(25, 26))
# Leaf 1 of an AVX CPU: + sse4_1(19) sse4_2(20) popcnt(23) osxsave(27) avx(28).
AVX_LEAF1: Registers = (0x206A7, 0, bits(0, 9, 19, 20, 23, 27, 28), bits(25, 26))
# Leaf 7 EBX bits 5 (avx2), 8 (bmi2), 16 (avx512f): a highest-basic-leaf answer that has these
# bits set is read as AVX2/AVX-512 by py-cpuinfo.
GARBAGE: Registers = (0x05B0B101, bits(5, 8, 16, 17, 30, 31), 0, 0x2CB43049)
XCR0_AVX = 0b111  # x87, SSE and AVX state enabled by the OS


def leaf7_flag_names() -> set[str]:
    """Every name py-cpuinfo derives from leaf 7 (all its bits set), learnt from py-cpuinfo itself."""
    only_leaf7 = FakeCpuid({0: (7, 0, 0, 0), 7: (0, 0xFFFFFFFF, 0xFFFFFFFF, 0)}, max_extended=0)
    return set(only_leaf7.get_flags(0x80000000))


def test_fake_cpuid_reproduces_py_cpuinfos_leaf7_misreading():
    """The bug the guard exists for: py-cpuinfo alone claims AVX2 on a CPU without leaf 7."""
    cpu = FakeCpuid({0: (2, 0, 0, 0), 1: CORE2_LEAF1, 2: GARBAGE})
    raw = set(cpu.get_flags(cpu.get_max_extension_support()))
    assert {"avx2", "bmi2", "avx512f"} <= raw


def test_leaf7_ignored_when_highest_basic_leaf_is_below_7():
    cpu = FakeCpuid({0: (2, 0, 0, 0), 1: CORE2_LEAF1, 2: GARBAGE})
    flags = x86_flags_from(cpu)
    assert {"sse2", "pni", "ssse3"} <= flags
    assert not flags & leaf7_flag_names()


def test_leaf7_garbage_would_have_moved_an_avx_cpu_to_the_avx2_tier():
    """With OS AVX state on, drop_unusable_vector_flags keeps avx2: only the guard stops it."""
    fma_leaf1 = (AVX_LEAF1[0], 0, AVX_LEAF1[2] | bits(12), AVX_LEAF1[3])  # AVX + FMA, no AVX2
    leaves = {0: (6, 0, 0, 0), 1: fma_leaf1, 6: GARBAGE}
    platform_tiers = load_platform(REPO / "platforms", "x86_64")
    raw_cpu = FakeCpuid(leaves, xcr0=XCR0_AVX)
    raw_flags = set(raw_cpu.get_flags(raw_cpu.get_max_extension_support())) | {"xcr0", "os_avx"}
    raw = CpuFeatures("x86_64", frozenset(drop_unusable_vector_flags(raw_flags)), 4, "cpuid")
    guarded = CpuFeatures("x86_64", x86_flags_from(FakeCpuid(leaves, xcr0=XCR0_AVX)), 4, "cpuid")
    assert select(raw, platform_tiers, None).tier.name == "avx2"  # what the bug would pick
    assert select(guarded, platform_tiers, None).tier.name == "avx"
    assert {"os_avx", "fma"} <= guarded.flags and "avx2" not in guarded.flags


def test_leaf7_read_when_the_cpu_has_it():
    haswell_leaf7: Registers = (0, bits(3, 5, 8), 0, 0)  # bmi1, avx2, bmi2
    cpu = FakeCpuid({0: (0xD, 0, 0, 0), 1: AVX_LEAF1, 7: haswell_leaf7}, xcr0=XCR0_AVX)
    flags = x86_flags_from(cpu)
    assert {"avx", "avx2", "bmi1", "bmi2", "os_avx"} <= flags
    assert not {"avx512f", "avx512vnni"} & flags


@pytest.mark.parametrize("model", ["Conroe,level=2"])
def test_emulated_cpu_with_low_basic_leaf_gets_no_leaf7_flags(model: str):
    """qemu answers leaf 7 like Intel when `level` is below 7: py-cpuinfo alone reads pku/umip."""
    from bundle_spec import qemu_user

    try:
        qemu_user.ensure_qemu(install=False)
    except qemu_user.EmulationUnavailable as exc:
        pytest.skip(str(exc))
    code = ("import json; from cpuinfo import cpuinfo; "
            "from runtime.platform.cpu import probe; c = cpuinfo.CPUID(); "
            "print(json.dumps([sorted(probe().flags), c.get_flags(c.get_max_extension_support())]))")
    # `python -c` imports from its working directory: the repository's runtime/.
    done = qemu_user.run_emulated([str(Path(sys.executable).resolve()), "-c", code], "x86_64", model,
                                  workdir=REPO, env={"DECIDE_FAKE_CPU": "", "PATH": "/usr/bin:/bin"},
                                  timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    probed, raw = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(raw) & leaf7_flag_names(), "qemu no longer returns leaf-2 data for leaf 7"
    assert not set(probed) & leaf7_flag_names()
    assert {"sse2", "pni", "ssse3"} <= set(probed) and "sse4_1" not in probed
