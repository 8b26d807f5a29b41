"""The frozen bundle on emulated CPU models: the models, one cell per model, the table, and the
zip of the tree under test.

Used by the tests (tests/test_matrix.py, tests/test_bundle*.py) and benchmarks/matrix.py; the
runner (private binfmt_misc in a user namespace, qemu-user >= 10) is bundle_spec/qemu_user.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bundle_spec.common import DEFAULT_CACHE, REPO
from bundle_spec.pipeline import zip_stem
from bundle_spec.qemu_user import SIGILL_EXIT, run_emulated
from bundle_spec.source_tree import git_commit, inputs_digest
from runtime.package.load import sha256_file

# CPU models of the matrix, oldest first. Values are QEMU_CPU strings.
X86_CPU_MODELS: dict[str, str] = {
    "Conroe": "Conroe",  # Core 2 (2006): SSSE3, no SSE4.1 -> below x86-64-v2
    "Penryn": "Penryn",  # Core 2 (2008): SSE4.1, no SSE4.2/POPCNT -> below x86-64-v2
    "Nehalem": "Nehalem",  # x86-64-v2: SSE4.2 + POPCNT, no AVX
    "SandyBridge": "SandyBridge",  # AVX, no AVX2/FMA
    "Haswell": "Haswell",  # x86-64-v3: AVX2 + FMA (no AVX-512 or VNNI under qemu)
    "max": "max",  # everything qemu's TCG emulates
}
ARM_CPU_MODELS: dict[str, str] = {
    "cortex-a53": "cortex-a53",  # ARMv8.0: asimd, no dotprod
    "cortex-a72": "cortex-a72",  # ARMv8.0 (Raspberry Pi 4): no dotprod; ORT #23957 SIGILL there
    "neoverse-n1": "neoverse-n1",  # ARMv8.2: asimddp (dotprod)
    "max": "max,sve=off",  # i8mm, bf16; SVE off: a 128-bit NEON machine with every extension
}


# ---------------------------------------------------------------------------------------------
# Matrix cells: the frozen decide bundle on one emulated CPU.

UNPACK_CACHE = Path.home() / ".cache" / "decide" / "matrix"
KEEP_UNPACKED = 3  # per zip name: ~140 MB each
EMULATED_TIMEOUT = 1800  # s per command: ORT session creation alone is slow under TCG
# Flags shown in the table: the ones the tiers turn on.
TABLE_FLAGS = {
    "x86_64": ("ssse3", "sse4_1", "sse4_2", "popcnt", "avx", "avx2", "fma", "avx512f",
               "avx512vnni", "avx_vnni"),
    "aarch64": ("asimd", "asimddp", "i8mm", "bf16", "sve"),
}
EXIT_CPU_UNSUPPORTED = 3  # runtime/exits.py


@dataclass(frozen=True)
class Bundle:
    """An unpacked decide zip: where its launcher and default model are."""

    arch: str
    zip_path: Path
    executable: Path
    model_dir: Path
    libc_root: Path | None  # aarch64: the arm64 root whose glibc qemu loads (QEMU_LD_PREFIX)


@dataclass
class CellResult:
    """One row of the matrix table."""

    arch: str
    cpu: str
    flags: list[str]
    tier: str = "-"
    variant: str = "-"
    selftest: str = "-"
    max_dp: float | None = None
    tolerance: float | None = None
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    refused: str = ""  # the stderr line of a documented refusal (exit 3), if any

    @property
    def ok(self) -> bool:
        """No SIGILL/traceback/mismatch; a documented refusal counts as ok."""
        return not self.problems


class BundleUnavailable(RuntimeError):
    """No zip of the tree under test, and it cannot be built here (tests skip or, strict, fail)."""


def matching_zip(folder: Path, arch: str, commit: str, digest: str) -> Path | None:
    """The zip in `folder` whose build manifest names this commit and inputs digest, intact."""
    manifest_path = folder / f"{zip_stem(arch)}.json"
    if not manifest_path.is_file():
        return None
    manifest = json.loads(manifest_path.read_text())
    zip_path = folder / manifest.get("zip", "")
    if (manifest.get("commit") != commit or manifest.get("inputs_digest") != digest
            or not zip_path.is_file() or sha256_file(zip_path) != manifest.get("zip_sha256")):
        return None
    return zip_path


def zip_for_tree(arch: str, model_dir: Path, build_log: Path, rebuild: bool = False) -> Path:
    """The zip built from the tree under test: this commit (`<sha>+dirty` for a dirty tree) and
    these inputs (source_tree.inputs_digest), never merely the newest zip in dist/.

    Looked for in dist/ (a `python3 build.py` of this tree) and in <build cache>/bundles/<arch>-
    <commit>-<digest>/, where it is built (`build.py --no-smoke`: the matrix cells run selftest
    on the emulated CPUs anyway) when neither has it, or always with `rebuild` (cached roots and
    wheels: only PyInstaller, assemble and zip run again). Raises BundleUnavailable when building is impossible here (not
    root), RuntimeError when build.py fails.
    """
    commit, digest = git_commit(), inputs_digest(model_dir)
    out = DEFAULT_CACHE / "bundles" / f"{arch}-{commit.replace('+', '-')[:18]}-{digest[:12]}"
    if not rebuild:
        for folder in (REPO / "dist", out):
            found = matching_zip(folder, arch, commit, digest)
            if found is not None:
                return found
    if os.geteuid() != 0:
        raise BundleUnavailable(f"no {arch} zip of this tree ({commit}), and building one needs root")
    build_log.parent.mkdir(parents=True, exist_ok=True)
    with open(build_log, "w", encoding="utf-8") as log:
        done = subprocess.run([sys.executable, str(REPO / "build.py"), "--arch", arch, "--model",
                               str(model_dir), "--dist", str(out), "--no-smoke"], cwd=REPO,
                              stdout=log, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"build.py --arch {arch} failed (exit {done.returncode}):\n"
                           f"{build_log.read_text()[-4000:]}")
    return out / f"{zip_stem(arch)}.zip"


def arm_libc_root(zip_path: Path) -> Path:
    """The arm64 root an aarch64 zip was built in (its glibc runs the app under qemu)."""
    manifest_path = zip_path.with_suffix(".json")
    if manifest_path.is_file():
        recorded = json.loads(manifest_path.read_text()).get("build_root")
        if recorded and (Path(recorded) / "lib").exists():
            return Path(recorded)
    return DEFAULT_CACHE / "aarch64" / "root"


def unpack_bundle(zip_path: Path, arch: str) -> Bundle:
    """Unzip once per zip content (cached); `unzip` keeps PyInstaller's symlinks, zipfile does not.

    The zip's .sha256 file, when there, is checked first (catches a zip still being written).
    """
    checksum = zip_path.with_name(zip_path.name + ".sha256")
    if checksum.exists():
        expected = checksum.read_text().split()[0]
        digest = sha256_file(zip_path)
        if digest != expected:
            raise FileNotFoundError(f"{zip_path}: sha256 differs from {checksum.name} "
                                    "(still being written, or stale)")
    stat = zip_path.stat()
    key = f"{zip_path.stem}-{stat.st_size}-{int(stat.st_mtime)}"
    target = UNPACK_CACHE / key
    if not (target / ".complete").exists():
        # Earlier builds of this zip: keep the newest few, another run may still be using them.
        earlier = sorted(UNPACK_CACHE.glob(f"{zip_path.stem}-*"), key=lambda p: p.stat().st_mtime)
        for stale in earlier[:-KEEP_UNPACKED]:
            shutil.rmtree(stale, ignore_errors=True)
        target.mkdir(parents=True)
        subprocess.run(["unzip", "-q", str(zip_path), "-d", str(target)], check=True)
        (target / ".complete").touch()
    launchers = sorted(
        (p for p in target.rglob("decide") if p.is_file() and os.access(p, os.X_OK)),
        key=lambda p: len(p.parts),
    )
    manifests = sorted(
        (p for p in target.rglob("manifest.json") if (p.parent / "golden.jsonl").exists()),
        key=lambda p: len(p.parts),
    )
    if not launchers or not manifests:
        raise FileNotFoundError(f"{zip_path}: no `decide` launcher or model with golden.jsonl inside")
    return Bundle(arch, zip_path, launchers[0], manifests[0].parent, arm_libc_root(zip_path) if arch == "aarch64" else None)


def golden_requests(model_dir: Path, count: int) -> tuple[list[str], list[list[float]], list[str]]:
    """The first `count` golden texts, their FP32 reference probabilities, and the label order."""
    manifest = json.loads((model_dir / "manifest.json").read_text())
    rows = [json.loads(line) for line in (model_dir / "golden.jsonl").read_text().splitlines()
            if line.strip()]
    # One text per language first, so a few requests still cover every script.
    picked, seen = [], set()
    for row in rows:
        if row.get("language") not in seen:
            picked.append(row)
            seen.add(row.get("language"))
    picked += [r for r in rows if r not in picked]
    picked = picked[:count]
    return [r["text"] for r in picked], [r["probs"] for r in picked], list(manifest["labels"])


def _problems_of(done: subprocess.CompletedProcess[str], what: str) -> list[str]:
    """SIGILL, other signals and Python tracebacks: the failures no cell may show."""
    problems = []
    if done.returncode == SIGILL_EXIT:
        problems.append(f"{what}: SIGILL")
    elif done.returncode < 0:
        problems.append(f"{what}: killed by signal {-done.returncode}")
    if "Traceback (most recent call last)" in done.stderr:
        problems.append(f"{what}: traceback: {done.stderr.strip().splitlines()[-1]}")
    return problems


# OpenBLAS core types whose kernels the older cells lack: AVX2 (Conroe … SandyBridge), SVE (every ARM cell: max runs sve=off)
FORCED_BLAS_CORE = {"x86_64": "Haswell", "aarch64": "NEOVERSEV1"}


def _check_refusal(cell: CellResult, run: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    """A CPU the bundle cannot serve: serving must be refused with exit 3 and one stderr line."""
    serve = run([], stdin='{"id": 1, "text": "hello"}\n')
    cell.problems += _problems_of(serve, "serve")
    lines = serve.stderr.strip().splitlines()
    cell.refused = lines[-1] if lines else ""
    cell.selftest = f"refused (exit {serve.returncode})"
    if serve.returncode != EXIT_CPU_UNSUPPORTED or len(lines) != 1 or serve.stdout.strip():
        cell.problems.append(f"refusal must be exit 3 with one stderr line, got exit "
                             f"{serve.returncode}, {len(lines)} stderr lines")


def _check_answers(cell: CellResult, bundle: Bundle, run: Callable[..., subprocess.CompletedProcess[str]],
                   requests: int) -> None:
    """A few golden texts served: every one answered, scores within the variant's golden tolerance."""
    texts, reference, labels = golden_requests(bundle.model_dir, requests)
    lines = "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts))
    serve = run([], stdin=lines)
    cell.problems += _problems_of(serve, "serve")
    answers = {}
    for line in serve.stdout.splitlines():
        reply = json.loads(line)
        if "id" in reply and "scores" in reply:
            answers[reply["id"]] = reply
    if len(answers) != len(texts):
        cell.problems.append(f"serve: {len(answers)}/{len(texts)} answers, exit {serve.returncode}")
    diffs = [abs(answers[i]["scores"][label] - p)
             for i, probs in enumerate(reference) if i in answers
             for label, p in zip(labels, probs)]
    cell.max_dp = max(diffs) if diffs else None
    manifest = json.loads((bundle.model_dir / "manifest.json").read_text())
    variant = manifest["variants"].get(cell.variant, {})
    cell.tolerance = float(variant.get("golden_tolerance", 2e-3))
    # The wire rounds scores to 6 decimals: allow that on top of the manifest's tolerance.
    if cell.max_dp is not None and cell.max_dp > cell.tolerance + 1e-6:
        cell.problems.append(f"serve: max |dp| {cell.max_dp:.2e} > tolerance {cell.tolerance:.0e}")


def run_cell(bundle: Bundle, cpu_name: str, requests: int = 4, emulate: bool = True,
             variant: str | None = None) -> CellResult:
    """info → selftest → a few requests of the frozen bundle on one CPU model (or natively).

    `variant` forces a model variant (DECIDE_VARIANT) instead of the tier's choice.
    """
    models = X86_CPU_MODELS if bundle.arch == "x86_64" else ARM_CPU_MODELS
    ld_prefix = bundle.libc_root
    # a user's environment may force OpenBLAS's kernels for a newer CPU (a shell profile, an image
    # made elsewhere): every cell runs with one, so a launcher that lets it through shows as SIGILL
    env = {**os.environ, "OPENBLAS_CORETYPE": FORCED_BLAS_CORE[bundle.arch],
           **({"DECIDE_VARIANT": variant} if variant else {})}

    def run(args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        argv = [str(bundle.executable), *args]
        if not emulate:
            return subprocess.run(argv, input=stdin, capture_output=True, text=True, env=env,
                                  timeout=EMULATED_TIMEOUT, check=False)
        return run_emulated(argv, bundle.arch, models[cpu_name], ld_prefix=ld_prefix, env=env,
                            input=stdin, timeout=EMULATED_TIMEOUT)

    started = time.monotonic()
    cell = CellResult(bundle.arch, cpu_name if emulate else "native", [])
    info = run(["info", "--json"])
    cell.problems += _problems_of(info, "info")
    try:
        report = json.loads(info.stdout)
    except json.JSONDecodeError:
        cell.problems.append(f"info: no JSON (exit {info.returncode}): {info.stderr.strip()[-300:]}")
        cell.seconds = time.monotonic() - started
        return cell
    flags = set(report.get("cpu", {}).get("flags", ()))
    cell.flags = [f for f in TABLE_FLAGS.get(bundle.arch, ()) if f in flags]
    choice = report.get("choice") or {}
    cell.tier, cell.variant = choice.get("tier") or "-", choice.get("variant") or "-"
    if info.returncode == EXIT_CPU_UNSUPPORTED:
        _check_refusal(cell, run)
        cell.seconds = time.monotonic() - started
        return cell
    if info.returncode != 0:
        cell.problems.append(f"info: exit {info.returncode}: {report.get('error')}")
    selftest = run(["selftest", "--json"])
    cell.problems += _problems_of(selftest, "selftest")
    try:
        results = json.loads(selftest.stdout)["results"]
        cell.selftest = "pass" if selftest.returncode == 0 and all(r["passed"] for r in results) \
            else "FAIL"
    except (json.JSONDecodeError, KeyError):
        cell.selftest = f"no result (exit {selftest.returncode})"
    if cell.selftest != "pass":
        cell.problems.append(f"selftest: {cell.selftest}: {selftest.stderr.strip()[-300:]}")
    _check_answers(cell, bundle, run, requests)
    cell.seconds = time.monotonic() - started
    return cell


def format_table(cells: Sequence[CellResult]) -> str:
    """CPU model → flags → tier → variant → selftest → max |Δp| vs native FP32, one row a cell."""
    header = ("arch", "CPU model", "flags", "tier", "variant", "selftest", "max |dp| (tol)", "time",
              "problems")
    rows = [header]
    for c in cells:
        dp = "-" if c.max_dp is None else f"{c.max_dp:.1e} ({c.tolerance:.0e})"
        rows.append((c.arch, c.cpu, ",".join(c.flags) or "-", c.tier, c.variant, c.selftest, dp,
                     f"{c.seconds:.0f}s", "; ".join(c.problems) or (c.refused and "refused: "
                                                                    + c.refused) or "ok"))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(header) - 1)]
    out = []
    for r in rows:
        out.append("  ".join(str(v).ljust(w) for v, w in zip(r, widths)) + "  " + str(r[-1]))
    return "\n".join(out)
