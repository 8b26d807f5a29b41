"""`python -m models export --triton DIR`: a model repository Triton can load (Triton itself is not
installable here, so: the config parses as Triton's ModelConfig, matches the graph, and the graph
in the repository answers like decide's engine)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from runtime.platform.offline import import_onnxruntime

ort = import_onnxruntime()  # decide's import: telemetry off even when this module is imported outside pytest
REPO = Path(__file__).resolve().parent.parent
text_format = pytest.importorskip("google.protobuf.text_format", reason="protobuf (comes with onnx) parses the config")
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

# A subset of Triton's model_config.proto (triton-inference-server/common, protobuf/model_config.proto):
# the same message, field and enum names and numbers, so a field Triton does not know fails to parse.
DATA_TYPES = ["TYPE_INVALID", "TYPE_BOOL", "TYPE_UINT8", "TYPE_UINT16", "TYPE_UINT32", "TYPE_UINT64", "TYPE_INT8",
              "TYPE_INT16", "TYPE_INT32", "TYPE_INT64", "TYPE_FP16", "TYPE_FP32", "TYPE_FP64", "TYPE_STRING", "TYPE_BF16"]
MESSAGES = {
    "ModelTensorReshape": [("shape", 1, "int64", True)],
    "ModelInput": [("name", 1, "string", False), ("data_type", 2, ".inference.DataType", False),
                   ("dims", 4, "int64", True), ("reshape", 5, ".inference.ModelTensorReshape", False),
                   ("allow_ragged_batch", 7, "bool", False), ("optional", 8, "bool", False)],
    "ModelOutput": [("name", 1, "string", False), ("data_type", 2, ".inference.DataType", False),
                    ("dims", 3, "int64", True), ("label_filename", 4, "string", False),
                    ("reshape", 5, ".inference.ModelTensorReshape", False)],
    "ModelDynamicBatching": [("preferred_batch_size", 1, "int32", True), ("max_queue_delay_microseconds", 2, "uint64", False),
                             ("preserve_ordering", 3, "bool", False)],
    "ModelInstanceGroup": [("name", 1, "string", False), ("count", 2, "int32", False),
                           ("kind", 4, ".inference.ModelInstanceGroup.Kind", False)],
    "ModelOptimizationPolicy": [("graph", 1, ".inference.ModelOptimizationPolicy.Graph", False)],
    "ModelParameter": [("string_value", 1, "string", False)],
    "ModelConfig": [("name", 1, "string", False), ("platform", 2, "string", False), ("max_batch_size", 4, "int32", False),
                    ("input", 5, ".inference.ModelInput", True), ("output", 6, ".inference.ModelOutput", True),
                    ("instance_group", 7, ".inference.ModelInstanceGroup", True),
                    ("default_model_filename", 8, "string", False),
                    ("dynamic_batching", 11, ".inference.ModelDynamicBatching", False),
                    ("optimization", 12, ".inference.ModelOptimizationPolicy", False),
                    ("parameters", 14, ".inference.ModelConfig.ParametersEntry", True), ("backend", 17, "string", False)],
}
SCALARS = {"string": 9, "int64": 3, "int32": 5, "uint64": 4, "bool": 8}


def model_config_class():
    """ModelConfig as a protobuf message class built from the descriptor subset above."""
    fd = descriptor_pb2.FileDescriptorProto(name="model_config_subset.proto", package="inference", syntax="proto3")
    enum = fd.enum_type.add(name="DataType")
    for number, name in enumerate(DATA_TYPES):
        enum.value.add(name=name, number=number)
    for name, fields in MESSAGES.items():
        message = fd.message_type.add(name=name)
        for field_name, number, kind, repeated in fields:
            field = message.field.add(name=field_name, number=number,
                                      label=3 if repeated else 1)  # LABEL_REPEATED / LABEL_OPTIONAL
            if kind in SCALARS:
                field.type = SCALARS[kind]
            else:
                field.type = 14 if kind.endswith(("DataType", "Kind")) else 11  # TYPE_ENUM / TYPE_MESSAGE
                field.type_name = kind
        if name == "ModelInstanceGroup":
            kind_enum = message.enum_type.add(name="Kind")
            for number, value in enumerate(["KIND_AUTO", "KIND_GPU", "KIND_CPU", "KIND_MODEL"]):
                kind_enum.value.add(name=value, number=number)
        if name == "ModelOptimizationPolicy":
            message.nested_type.add(name="Graph").field.add(name="level", number=1, type=5, label=1)
        if name == "ModelConfig":
            entry = message.nested_type.add(name="ParametersEntry")
            entry.options.map_entry = True
            entry.field.add(name="key", number=1, type=9, label=1)
            entry.field.add(name="value", number=2, type=11, label=1, type_name=".inference.ModelParameter")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("inference.ModelConfig"))


def export(package: Path, out: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "models", "export", "--triton", str(out), "--model", str(package),
                           *flags], cwd=REPO, capture_output=True, text=True, timeout=120, check=False)


def test_the_config_parses_as_triton_model_config_and_matches_the_graph(tiny_scoped_package_dir, tmp_path):
    done = export(tiny_scoped_package_dir, tmp_path / "repo", "--variant", "fp32")
    assert done.returncode == 0, done.stderr
    entry = tmp_path / "repo" / "tiny-scoped"
    config = text_format.Parse((entry / "config.pbtxt").read_text(), model_config_class()())
    graph = onnx.load(str(entry / "1" / "model.onnx"))  # also loads fp32.data: the external file is there
    assert (config.name, config.platform, config.max_batch_size) == ("tiny-scoped", "onnxruntime_onnx", 32)
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        (v.name, 9, [-1]) for v in graph.graph.input]  # TYPE_INT64, [batch, seq] without the batch
    outputs = {o.name: o for o in config.output}
    assert sorted(outputs) == sorted(v.name for v in graph.graph.output) == ["logits", "novelty"]
    assert (outputs["logits"].data_type, list(outputs["logits"].dims)) == (11, [4])  # TYPE_FP32, one per label
    assert list(outputs["novelty"].dims) == [1] and outputs["novelty"].HasField("reshape")  # [batch] → [1] → []
    assert (entry / outputs["logits"].label_filename).read_text().split() == ["weather", "sports", "tech", "other"]
    assert list(config.dynamic_batching.preferred_batch_size) == [8, 16, 32]
    assert config.instance_group[0].kind == 2 and config.optimization.graph.level == 1
    assert config.parameters["intra_op_thread_count"].string_value == "1"


def test_the_exported_graph_answers_like_decide_and_the_contract_says_how(tiny_scoped_package_dir, tmp_path):
    from runtime import Classifier
    from runtime.engine.batching import bucket_for, pad_batch
    from runtime.engine.text import TextEncoder

    assert export(tiny_scoped_package_dir, tmp_path / "repo", "--variant", "int8-u8u8").returncode == 0
    entry = tmp_path / "repo" / "tiny-scoped"
    contract = json.loads((entry / "decide.json").read_text())
    assert contract["variant"] == "int8-u8u8" and contract["abstention"]["negative_labels"] == ["other"]
    texts = ["rain and wind", "Tor Spiel Team", "le serveur"]
    encoder = TextEncoder((entry / "tokenizer.json").read_text(encoding="utf-8"), contract["max_length"], contract["pad_id"])
    items = encoder.tokenize(texts)
    length = bucket_for(max(len(i.ids) for i in items), contract["buckets"])
    ids, mask = pad_batch(items, length, contract["pad_id"])
    session = ort.InferenceSession(str(entry / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    logits = session.run(["logits"], {"input_ids": ids, "attention_mask": mask})[0] / contract["temperature"]
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    answers = Classifier.load(tiny_scoped_package_dir, variant="int8-u8u8", threads=1).classify(texts)
    assert np.abs(probs - np.array([list(a.scores.values()) for a in answers])).max() < 1e-6
    assert "tritonserver --model-repository" in (entry / "README.md").read_text()


def test_an_existing_entry_is_refused(tiny_package_dir, tmp_path):
    assert export(tiny_package_dir, tmp_path / "repo").returncode == 0
    again = export(tiny_package_dir, tmp_path / "repo")
    assert again.returncode == 2 and again.stderr.startswith("error:") and "exists" in again.stderr
    assert export(tiny_package_dir, tmp_path / "other", "--variant", "int4").returncode == 2
