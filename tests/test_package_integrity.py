"""Every byte decide loads is a regular file inside the package, listed and hashed in the manifest
(issue 23), checked by class on copies of the tiny package: symlinks anywhere (files, directories,
manifest.json itself, even with the right content), unlisted and extra files, external-data files
a graph names but its variant does not list, FIFOs, devices and sockets, oversized files and
strings. Each ends `decide` with exit 4 and one stderr line that says nothing about a symlink's
target, fast and in bounded memory."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest
from fixtures.child import after_shell

from runtime.package.load import PackageError, file_entry, load_package
from runtime.package.manifest import MAX_LABEL_CHARS, read_manifest, write_manifest

REPO = Path(__file__).resolve().parent.parent
SECRET = "not-for-your-eyes-" * 1000  # 18,000 bytes: neither the text nor its size may leak


MEMORY_LIMIT = 512 << 20  # address space for a refused run: reading /dev/zero or a flood would hit it


def run_decide(root: Path, *args: str, timeout: float = 60, bounded: bool = False) -> subprocess.CompletedProcess:
    """decide on `root`; bounded=True runs it under MEMORY_LIMIT (a package error is found before
    numpy and onnxruntime are imported, so nothing legitimate needs more)."""
    command = [sys.executable, "-m", "runtime", "--model", str(root), "--variant", "fp32", *args]
    if bounded:
        command = after_shell(f"ulimit -v {MEMORY_LIMIT >> 10}", command)  # KiB, soft and hard
    return subprocess.run(command, check=False, cwd=REPO, input=b'{"id": 1, "text": "rain"}\n', capture_output=True,
                          timeout=timeout, env={**os.environ, "DECIDE_TIER": ""})


def assert_refused(result: subprocess.CompletedProcess, *words: str) -> str:
    err = result.stderr.decode()
    assert result.returncode == 4, (result.returncode, err)
    assert result.stdout == b"", "nothing may be served from such a package"
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("decide: model package error: "), err
    assert "Traceback" not in err
    for word in words:
        assert word in err, (word, err)
    assert "not-for-your-eyes" not in err and str(len(SECRET)) not in err, err
    return err


@pytest.fixture
def package(tiny_package_dir, tmp_path) -> Path:
    return Path(shutil.copytree(tiny_package_dir, tmp_path / "pkg"))


@pytest.fixture
def outside(tmp_path) -> Path:
    """A directory next to the package, with a secret file in it."""
    directory = tmp_path / "outside"
    directory.mkdir()
    (directory / "secret").write_text(SECRET)
    return directory


def relist(root: Path, change: Callable[[dict], None]) -> None:
    """Change the manifest as a factory would write it (through write_manifest's own check)."""
    data = json.loads((root / "manifest.json").read_text())
    change(data)
    write_manifest(root, read_manifest(data))


def move_to(root: Path, name: str, target: Path) -> None:
    """Replace the package file `name` by a symlink to an identical copy at `target` (same
    bytes, same sha256: only the link itself is wrong)."""
    shutil.move(root / name, target)
    (root / name).symlink_to(target)


# -- symbolic links anywhere -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["tokenizer.json", "golden.jsonl", "fp32.onnx", "fp32.data", "manifest.json"])
def test_a_listed_file_that_is_a_symlink_is_refused_even_with_the_right_bytes(package, outside, name):
    move_to(package, name, outside / name)
    assert_refused(run_decide(package), f"{name} is a symbolic link")


def test_a_symlink_to_a_secret_says_nothing_about_it(package, outside):
    (package / "golden.jsonl").unlink()
    (package / "golden.jsonl").symlink_to(outside / "secret")
    assert_refused(run_decide(package), "golden.jsonl is a symbolic link")


@pytest.mark.parametrize("target", ["/dev/zero", "/proc/self/mem", "missing-target"])
def test_symlinks_to_devices_and_nowhere_are_refused_without_being_followed(package, target):
    (package / "manifest.json").unlink()
    (package / "manifest.json").symlink_to(target)
    assert_refused(run_decide(package, timeout=30, bounded=True), "manifest.json is a symbolic link")


def test_a_symlinked_directory_inside_the_package_is_refused(package, outside):
    graphs = outside / "graphs"
    graphs.mkdir()
    for name in ("fp32.onnx", "fp32.data"):
        shutil.move(package / name, graphs / name)
    (package / "graphs").symlink_to(graphs)

    def in_graphs(data: dict) -> None:  # the graph and its data file now live in graphs/
        for entry in (data["variants"]["fp32"]["file"], *data["variants"]["fp32"]["data_files"]):
            entry["file"] = "graphs/" + entry["file"]
    data = json.loads((package / "manifest.json").read_text())
    in_graphs(data)
    (package / "manifest.json").write_text(json.dumps(data))
    assert_refused(run_decide(package), "graphs is a symbolic link")


def test_an_unlisted_symlink_is_refused(package, outside):
    (package / "notes.txt").symlink_to(outside / "secret")
    assert_refused(run_decide(package), "notes.txt is a symbolic link")


def test_the_package_directory_itself_may_be_reached_through_a_symlink(package, tmp_path):
    current = tmp_path / "current"
    current.symlink_to(package)  # models/current → models/v2: an ordinary deployment
    result = run_decide(current)
    assert result.returncode == 0, result.stderr.decode()
    assert json.loads(result.stdout)["label"] == "weather"


# -- files the manifest does not list --------------------------------------------------------


@pytest.mark.parametrize("name", ["extra.bin", ".hidden", "fp32.data.bak", "sub/dir/more.onnx"])
def test_an_unlisted_file_is_refused(package, name):
    (package / name).parent.mkdir(parents=True, exist_ok=True)
    (package / name).write_bytes(b"\0" * 10)
    assert_refused(run_decide(package), f"{name} is not listed in manifest.json")


def test_documents_may_sit_beside_the_listed_files(package):
    for name in ("LICENSE", "README.md", "NOTICE.txt"):
        (package / name).write_text("about this model\n")
    (package / "empty-dir").mkdir()
    result = run_decide(package)
    assert result.returncode == 0, result.stderr.decode()


def external_graph(package: Path, location: str) -> None:
    """Point the fp32 graph's external weights at `location` and list the new graph's checksum."""
    model = onnx.load(str(package / "fp32.onnx"), load_external_data=False)
    hits = 0
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
                hits += 1
    assert hits, "the tiny fp32 graph keeps its vote matrix in fp32.data"
    onnx.save(model, str(package / "fp32.onnx"))
    relist(package, lambda data: data["variants"]["fp32"]["file"].update(file_entry(package, "fp32.onnx").__dict__))


def test_external_data_the_variant_does_not_list_is_never_loaded(package):
    # altered weights in a second data file, listed as the OTHER variant's data file: every file of
    # the package is listed and hashed, yet fp32's graph must not read a file fp32 does not list
    original = (package / "fp32.data").read_bytes()
    (package / "evil.data").write_bytes(original[::-1])
    relist(package, lambda data: data["variants"]["int8-u8u8"]["data_files"].append(
        file_entry(package, "evil.data").__dict__))
    external_graph(package, "evil.data")
    assert_refused(run_decide(package), "'evil.data' is not a data file of variant fp32")


@pytest.mark.parametrize("location", ["../outside.data", "/tmp/outside.data", "./fp32.data", "sub/../fp32.data"])
def test_external_data_outside_or_around_the_package_is_refused(package, tmp_path, location):
    shutil.copy(package / "fp32.data", tmp_path / "outside.data")
    external_graph(package, location)
    assert_refused(run_decide(package), "is not a data file of variant fp32")


def test_the_engine_checks_external_data_before_onnxruntime_opens_the_graph(package, monkeypatch):
    (package / "evil.data").write_bytes((package / "fp32.data").read_bytes())
    relist(package, lambda data: data["variants"]["int8-u8u8"]["data_files"].append(
        file_entry(package, "evil.data").__dict__))
    external_graph(package, "evil.data")
    from runtime.engine import engine

    opened = []
    monkeypatch.setattr(engine.ort, "InferenceSession", lambda *a, **k: opened.append(a))
    with pytest.raises(PackageError, match="evil.data"):
        engine.Engine(load_package(package), "fp32")
    assert opened == [], "ORT was handed a graph whose external data no checksum covers"


# -- files that are not regular files ---------------------------------------------------------


@pytest.mark.parametrize("name", ["manifest.json", "golden.jsonl", "tokenizer.json", "fp32.data"])
def test_a_fifo_is_refused_without_hanging(package, name):
    (package / name).unlink()
    os.mkfifo(package / name)
    assert_refused(run_decide(package, timeout=30, bounded=True), f"{name} is a FIFO")


@pytest.mark.parametrize("name", ["manifest.json", "fp32.onnx"])
def test_a_device_node_is_refused_without_being_read(package, name):
    (package / name).unlink()
    try:
        os.mknod(package / name, 0o644 | 0o020000, os.makedev(1, 5))  # a character device: /dev/zero
    except PermissionError:
        pytest.skip("creating a device node needs root (CAP_MKNOD)")
    assert_refused(run_decide(package, timeout=30, bounded=True), f"{name} is a character device")


def test_a_socket_or_directory_in_place_of_a_file_is_refused(package, tmp_path):
    (package / "golden.jsonl").unlink()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(package / "golden.jsonl"))
        assert_refused(run_decide(package), "golden.jsonl is a socket")
    (package / "golden.jsonl").unlink()
    (package / "golden.jsonl").mkdir()
    assert_refused(run_decide(package), "golden.jsonl is a directory")


# -- oversized files and strings ----------------------------------------------------------------


def test_an_oversized_manifest_is_refused_without_reading_it_whole(package):
    text = (package / "manifest.json").read_text()
    (package / "manifest.json").write_text(text + " " * (5 << 20))  # still valid JSON, 5 MiB
    assert_refused(run_decide(package, bounded=True), "manifest.json has", "more than the 4194304 a manifest may have")


def test_a_file_larger_than_listed_is_refused(package):
    with open(package / "golden.jsonl", "ab") as fh:
        fh.write(b"\n" * 1000)
    assert_refused(run_decide(package), "golden.jsonl has", "manifest says")


@pytest.mark.parametrize("field, value", [
    ("golden", {"file": "golden.jsonl", "sha256": "0" * 64, "bytes": 1 << 30}),
    ("tokenizer", {"file": "tokenizer.json", "sha256": "0" * 64, "bytes": 1 << 40}),
])
def test_a_listed_size_beyond_the_cap_of_its_kind_is_refused(package, field, value):
    data = json.loads((package / "manifest.json").read_text())
    data[field] = value
    (package / "manifest.json").write_text(json.dumps(data))
    assert_refused(run_decide(package), f"'{field}.bytes' must be an integer from 0 to")


@pytest.mark.parametrize("change, field", [
    (lambda d: d.update(labels=["weather", "x" * (1 << 20), "tech"]), "labels"),  # a 10 MB one: the size cap
    (lambda d: d.update(labels=["weather", "sports", "te\nch"]), "labels"),
    (lambda d: d.update(name="tiny\ndecide: forged log line"), "name"),
    (lambda d: d.update(version="1.0\x1b[31m"), "version"),
    (lambda d: d.update(languages=["en", "d\x07e"]), "languages"),
    (lambda d: d["variants"]["fp32"].update(precision="fp" * 100), "variants.fp32.precision"),
    (lambda d: d["variants"]["fp32"].update(expected_tolerance="tight"), "variants.fp32.expected_tolerance"),
    (lambda d: d["variants"]["fp32"].update(expected_tolerance=-1.0), "variants.fp32.expected_tolerance"),
])
def test_manifest_strings_are_capped_and_free_of_control_characters(package, change, field):
    data = json.loads((package / "manifest.json").read_text())
    change(data)
    (package / "manifest.json").write_text(json.dumps(data))
    err = assert_refused(run_decide(package), f"'{field}'")
    assert len(err) < 2000, "the refusal quotes no 10 MB label"


def test_the_label_cap_is_what_the_manifest_reader_enforces(tiny_package_dir):
    data = json.loads((tiny_package_dir / "manifest.json").read_text())
    data["labels"] = ["weather", "s" * MAX_LABEL_CHARS, "tech"]
    assert read_manifest(data).labels[1] == "s" * MAX_LABEL_CHARS
    data["labels"][1] += "s"
    with pytest.raises(PackageError, match="'labels'"):
        read_manifest(data)


def test_the_bundle_copy_may_pass_unlisted_files_but_never_a_symlink(package, outside):
    # bundle_spec copies only the listed files out of a package, so it may read one holding more
    (package / "training-log.txt").write_text("not part of the package")
    with pytest.raises(PackageError, match="training-log.txt is not listed"):
        load_package(package)
    assert load_package(package, allow_unlisted=True).manifest.name == "tiny-keywords"
    (package / "notes").symlink_to(outside / "secret")
    with pytest.raises(PackageError, match="notes is a symbolic link"):
        load_package(package, allow_unlisted=True)
