"""The shipped bundle, end to end: the x86_64 zip of the tree under test, unzipped and moved,
driven like a user would.

The session fixture takes the zip whose build manifest names this commit and inputs digest
(bundle_spec.matrix.zip_for_tree: dist/ or the build cache), building it when there is none, then
every test runs the real frozen binary as a subprocess. Building needs root (debootstrap, chroot):
elsewhere these tests skip with the reason, and fail under DECIDE_STRICT=1 (CI).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
from zips import MODEL_DIR, zip_of_this_tree

from bundle_spec import qemu_user
from bundle_spec.checks import glibc_floor
from bundle_spec.common import (
    ARCHES,
    CHROOT_ENV,
    DEFAULT_CACHE,
    DEFAULT_MAX_GLIBC,
    BuildError,
    Refused,
    version_tuple,
)
from bundle_spec.root import BuildRoot, ensure_clean_root, host_debian_mirrors
from runtime.package.load import sha256_file

REPO = Path(__file__).resolve().parent.parent
MODEL_NAME = MODEL_DIR.name
EXIT_OK, EXIT_CPU_UNSUPPORTED, EXIT_PACKAGE = 0, 3, 4  # bundle_spec/README.box.md

pytestmark = pytest.mark.heavy


@pytest.fixture(scope="session")
def zip_path() -> Path:
    """The x86_64 zip built from the tree under test (built here when there is none)."""
    if platform.machine() != "x86_64":
        pytest.skip("the bundle tests run on an x86_64 host")
    return zip_of_this_tree("x86_64")


@pytest.fixture(scope="session")
def built(zip_path: Path) -> dict:
    """The build manifest written next to the zip."""
    return json.loads(zip_path.with_suffix(".json").read_text())


@pytest.fixture(scope="session")
def bundle(zip_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The zip unpacked with `unzip`, then moved as a whole to another directory."""
    unpacked = tmp_path_factory.mktemp("unzipped")
    if shutil.which("unzip"):
        subprocess.run(["unzip", "-q", str(zip_path), "-d", str(unpacked)], check=True)
    else:
        extract_with_symlinks(zip_path, unpacked)
    moved = tmp_path_factory.mktemp("moved") / "somewhere" / "else"
    moved.parent.mkdir(parents=True)
    shutil.move(unpacked / "decide", moved)
    return moved


def extract_with_symlinks(zip_path: Path, target: Path) -> None:
    """What `unzip` does for this zip: files with their mode bits, symlinks as symlinks."""
    with zipfile.ZipFile(zip_path) as archive:
        for info in archive.infolist():
            mode = info.external_attr >> 16
            path = target / info.filename
            path.parent.mkdir(parents=True, exist_ok=True)
            if (mode & 0o170000) == 0o120000:
                os.symlink(archive.read(info).decode(), path)
            elif not info.is_dir():
                path.write_bytes(archive.read(info))
                os.chmod(path, mode & 0o777 or 0o644)


def run_decide(bundle: Path, *args: str, stdin: str = "", cwd: Path | None = None,
               timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run the frozen binary like a user: from another working directory, text in, text out."""
    return subprocess.run([str(bundle / "decide"), *args], input=stdin, capture_output=True, text=True,
                          cwd=cwd or bundle.parent, timeout=timeout, check=False)


def golden_examples(bundle: Path) -> list[dict]:
    """The model's golden examples, read from the bundled package."""
    lines = (bundle / "models" / MODEL_NAME / "golden.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def test_zip_is_small_and_carries_fp32_and_int8(zip_path: Path, built: dict) -> None:
    assert zip_path.stat().st_size < 100_000_000
    assert built["zip_bytes"] == zip_path.stat().st_size
    checksum_line = zip_path.with_name(f"{built['zip']}.sha256").read_text()
    assert checksum_line.split()[0] == sha256_file(zip_path)
    precisions = {v["precision"] for v in built["model"]["variants"].values()}
    assert {"fp32", "int8"} <= precisions
    with zipfile.ZipFile(zip_path) as archive:
        names = set(archive.namelist())
    for variant in built["model"]["variants"].values():
        assert f"decide/models/{MODEL_NAME}/{variant['file']}" in names
    for required in ("decide/decide", "decide/README.md", "decide/licenses/README.txt",
                     "decide/platforms/x86_64.json", f"decide/models/{MODEL_NAME}/manifest.json"):
        assert required in names


def test_symlinks_survive_the_zip(zip_path: Path, bundle: Path) -> None:
    with zipfile.ZipFile(zip_path) as archive:
        links_in_zip = {Path(info.filename).relative_to("decide") for info in archive.infolist()
                        if (info.external_attr >> 16) & 0o170000 == 0o120000}
    links_unpacked = {p.relative_to(bundle) for p in bundle.rglob("*") if p.is_symlink()}
    assert links_in_zip  # PyInstaller >= 6 links numpy's bundled libraries into _internal/
    assert links_unpacked == links_in_zip
    assert all((bundle / link).exists() for link in links_unpacked)  # none dangling


def test_glibc_floor_is_measured_and_within_limit(built: dict, bundle: Path) -> None:
    floor = glibc_floor(bundle)
    assert floor["elf_files"] > 10
    assert floor["glibc"] == built["glibc_floor"]["glibc"]
    assert version_tuple(floor["glibc"]) <= version_tuple(DEFAULT_MAX_GLIBC)


def test_moved_bundle_answers_json_lines(bundle: Path) -> None:
    examples = golden_examples(bundle)[:6]
    manifest = json.loads((bundle / "models" / MODEL_NAME / "manifest.json").read_text())
    labels = manifest["labels"]
    requests = [{"id": i, "text": ex["text"]} for i, ex in enumerate(examples)]
    requests.append({"id": "batch", "texts": [ex["text"] for ex in examples[:3]]})
    lines = [json.dumps(r, ensure_ascii=False) for r in requests]
    lines.insert(2, "{not json")
    lines.append(json.dumps({"id": "h", "op": "health"}))

    done = run_decide(bundle, stdin="\n".join(lines) + "\n")

    assert done.returncode == EXIT_OK, done.stderr
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(answers) == len(lines)
    assert answers[2]["error"]["code"] == "invalid_json"
    singles = [a for a in answers if isinstance(a.get("id"), int)]
    assert [a["id"] for a in singles] == list(range(len(examples)))
    negatives = set(manifest.get("abstention", {}).get("negative_labels", ()))
    for answer, example in zip(singles, examples):
        assert abs(sum(answer["scores"].values()) - 1.0) < 1e-3
        top = max(labels, key=answer["scores"].__getitem__)
        assert answer["leaning"] in set(labels) - negatives  # the best case label, flagged or not
        if answer["abstained"]:  # e.g. a golden example of the package's "not a case" class
            assert answer["label"] is None and answer["reason"] in ("out_of_scope", "unreadable"), answer
            assert top in negatives or answer["reason"] != "out_of_scope" or manifest["abstention"].get("novelty")
        else:
            assert answer["label"] == answer["leaning"] == top
        # Within what the factory promises for the variant the bundle chose on this CPU
        # (+1e-6: answers are rounded to 6 decimals).
        tolerance = manifest["variants"][answer["variant"]].get("golden_tolerance", 2e-3) + 1e-6
        reference = dict(zip(labels, example["probs"]))
        assert max(abs(answer["scores"][name] - reference[name]) for name in labels) <= tolerance
    batch = next(a for a in answers if a.get("id") == "batch")
    assert [r["label"] for r in batch["results"]] == [a["label"] for a in singles[:3]]
    assert answers[-1] == {"id": "h", "op": "health", "status": "ok"}


def test_selftest_passes_in_the_moved_bundle(bundle: Path) -> None:
    done = run_decide(bundle, "selftest")
    assert done.returncode == EXIT_OK, done.stdout + done.stderr


def test_legacy_numeric_stack_is_the_one_imported_when_its_tier_is_forced(bundle: Path) -> None:
    """What a Core 2 gets (emulated: tests/test_matrix.py Conroe), natively: numpy 1.26 from
    _internal/legacy overrides the numpy 2.4 frozen into the PYZ, and the model still answers."""
    info = run_decide(bundle, "info", "--json", "--tier", "baseline")
    assert info.returncode == EXIT_OK, info.stderr
    stack = json.loads(info.stdout)["numeric_stack"]
    assert (stack["name"], stack["numpy"]) == ("legacy", "1.26.4")
    assert Path(stack["path"]) == bundle / "_internal" / "legacy"
    done = run_decide(bundle, "selftest", "--tier", "baseline")
    assert done.returncode == EXIT_OK, done.stdout + done.stderr
    assert "numpy 1.26.4 from" in done.stderr  # logged when the stack is activated
    standard = json.loads(run_decide(bundle, "info", "--json").stdout)["numeric_stack"]
    assert standard["name"] == "standard" and not standard["numpy"].startswith("1.")


def tampered_model(bundle: Path, tmp_path: Path) -> Path:
    """A copy of the bundled model package that the test may break."""
    copy = tmp_path / MODEL_NAME
    shutil.copytree(bundle / "models" / MODEL_NAME, copy)
    return copy


def test_refuses_a_model_file_with_a_bad_checksum(bundle: Path, tmp_path: Path) -> None:
    model = tampered_model(bundle, tmp_path)
    tokenizer = model / "tokenizer.json"
    data = bytearray(tokenizer.read_bytes())
    data[-2] = ord(" ") if data[-2] != ord(" ") else ord("\n")  # same size, other content
    tokenizer.write_bytes(bytes(data))

    done = run_decide(bundle, "--model", str(model), stdin='{"id": 1, "text": "hello"}\n')

    assert done.returncode == EXIT_PACKAGE
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1
    assert "checksum" in done.stderr or "sha256" in done.stderr


def test_refuses_a_missing_model_file(bundle: Path, tmp_path: Path) -> None:
    model = tampered_model(bundle, tmp_path)
    (model / "tokenizer.json").unlink()

    done = run_decide(bundle, "--model", str(model), stdin='{"id": 1, "text": "hello"}\n')

    assert done.returncode == EXIT_PACKAGE
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1
    assert "tokenizer.json" in done.stderr


def test_refuses_a_cpu_without_sse3(bundle: Path) -> None:
    """Below the legacy stack's floor (an early Athlon 64): one line, exit 3, no SIGILL.
    CPUs below x86-64-v2 with SSE3 are served: tests/test_matrix.py (Conroe)."""
    try:
        qemu_user.ensure_qemu()
        done = qemu_user.run_emulated([str(bundle / "decide")], "x86_64", "Opteron_G1,pni=off",
                                      input='{"id": 1, "text": "hello"}\n', timeout=600)
    except qemu_user.EmulationUnavailable as exc:
        pytest.skip(f"cannot emulate an old CPU here: {exc}")
    assert done.returncode == EXIT_CPU_UNSUPPORTED, done.stderr
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1
    assert "pni" in done.stderr and "SSE3" in done.stderr


@pytest.fixture(scope="session")
def clean_bullseye() -> Path:
    """A minimal Debian 11 root (glibc 2.31) without any build tools, cached between runs."""
    root = BuildRoot(DEFAULT_CACHE / "x86_64" / "clean-bullseye", ARCHES["x86_64"])
    try:
        ensure_clean_root(root, host_debian_mirrors()[0], REPO / "build" / "test-root.log")
    except (BuildError, Refused) as exc:
        pytest.skip(f"cannot debootstrap a Debian 11 root here: {exc}")
    return root.path


def test_runs_in_a_clean_debian_11_root(bundle: Path, clean_bullseye: Path) -> None:
    root = BuildRoot(clean_bullseye, ARCHES["x86_64"])
    inside = clean_bullseye / "opt" / "decide"
    shutil.rmtree(inside, ignore_errors=True)
    shutil.copytree(bundle, inside, symlinks=True)
    example = golden_examples(bundle)[0]
    try:
        with root.mounted():
            selftest = subprocess.run(["chroot", str(clean_bullseye), "/opt/decide/decide", "selftest"],
                                      capture_output=True, text=True, env=CHROOT_ENV, timeout=300, check=False)
            answer = subprocess.run(["chroot", str(clean_bullseye), "/opt/decide/decide"],
                                    input=json.dumps({"id": 7, "text": example["text"]}) + "\n",
                                    capture_output=True, text=True, env=CHROOT_ENV, timeout=300, check=False)
    finally:
        shutil.rmtree(inside, ignore_errors=True)
    glibc = (clean_bullseye / "usr" / "lib" / "x86_64-linux-gnu").glob("libc-2.*.so")
    assert [p.name for p in glibc] == ["libc-2.31.so"]  # really the old glibc
    assert selftest.returncode == EXIT_OK, selftest.stdout + selftest.stderr
    assert answer.returncode == EXIT_OK, answer.stderr
    reply = json.loads(answer.stdout)
    assert reply["id"] == 7 and "label" in reply


def test_frozen_binary_stays_offline_and_writes_only_where_told(bundle: Path, tmp_path: Path) -> None:
    # issue 33, as tests/test_offline.py from source: the zip's binary with CI unset, an empty
    # read-only HOME and working directory, serving for over a minute under strace.
    import csv

    from offline_runs import Scenario, drive_socket, drive_stdio, drive_to_end, run_all
    from syscall_trace import strace

    binary = strace()
    if binary is None:
        pytest.skip("strace is not installed and cannot be installed here: the frozen binary's "
                    "network and file-system trace is not checked")
    run_dir, out_dir, records = tmp_path / "run", tmp_path / "out", tmp_path / "records.csv"
    for directory in (run_dir, out_dir):
        directory.mkdir(mode=0o700)
    with records.open("w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows([["id", "text"], *([f"r{i}", f"pump {i} hot"] for i in range(2000))])
    decide = str(bundle / "decide")
    scenarios = [
        Scenario("stdio", [decide], drive_stdio),
        Scenario("socket", [decide, "serve", "--socket", str(run_dir / "decide.sock"), "--ready"], drive_socket,
                 allowed=[run_dir]),
        # two worker processes: the frozen binary started again by multiprocessing
        Scenario("score", [decide, "score", str(records), "--output", str(out_dir / "scored.csv"), "--processes",
                           "2"], drive_to_end, allowed=[out_dir]),
    ]
    found = run_all(binary, scenarios, tmp_path / "home", tmp_path / "work", tmp_path / "logs")
    outcomes = {s.name: s.outcome for s in scenarios}
    for scenario in scenarios[:2]:
        assert scenario.sent >= 10 and scenario.served == scenario.sent, outcomes
    assert len((out_dir / "scored.csv").read_text().splitlines()) == 2001, outcomes
    assert found == {s.name: [] for s in scenarios}, (found, outcomes)
