"""The model-package contract as the runtime reads it: manifest errors and file verification."""

import json
import shutil

import pytest

from runtime.package.load import PackageError, load_package, read_golden, verify_files


def test_tiny_package_round_trips_through_the_manifest(tiny_package_dir):
    package = load_package(tiny_package_dir)
    manifest = package.manifest
    assert manifest.labels == ("weather", "sports", "tech") and manifest.max_length == 24
    assert [e.file for e in manifest.variants["fp32"].files()] == ["fp32.onnx", "fp32.data"]
    verify_files(package, [manifest.tokenizer, *manifest.variants["fp32"].files()])
    assert len(read_golden(package)) == 8


def test_missing_manifest(tmp_path):
    with pytest.raises(PackageError, match="manifest.json missing"):
        load_package(tmp_path)


@pytest.mark.parametrize("change, message", [
    (lambda m: m.update(format=99), "format 99 is not supported"),
    (lambda m: m.pop("labels"), "malformed manifest"),
    (lambda m: m["variants"]["fp32"].pop("file"), "malformed manifest"),
])
def test_malformed_manifest_is_a_package_error(tiny_package_dir, tmp_path, change, message):
    copy = shutil.copytree(tiny_package_dir, tmp_path / "pkg")
    data = json.loads((copy / "manifest.json").read_text())
    change(data)
    (copy / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(PackageError, match=message):
        load_package(copy)


def test_truncated_file_is_caught_by_its_size(tiny_package_dir, tmp_path):
    copy = shutil.copytree(tiny_package_dir, tmp_path / "pkg")
    graph = copy / "int8-u8u8.onnx"
    graph.write_bytes(graph.read_bytes()[:-10])
    package = load_package(copy)
    with pytest.raises(PackageError, match=r"int8-u8u8\.onnx has \d+ bytes, manifest says"):
        verify_files(package, package.manifest.variants["int8-u8u8"].files())
