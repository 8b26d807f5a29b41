"""models/quantize: int8 graphs whose answer for a row does not depend on the other rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from models.quantize.int8 import (
    VARIANTS_BY_NAME,
    fp32_without_fp16_storage,
    quantize_dynamic_graph,
    quantize_variants,
    uint8_scale,
)
from runtime.platform.offline import import_onnxruntime

ort = import_onnxruntime()  # decide's import: telemetry off even when this module is imported outside pytest

VOCAB, HIDDEN, CLASSES = 40, 16, 4


def _toy_graph(fp16_storage: bool) -> onnx.ModelProto:
    """logits = ReduceMean(Gather(table, input_ids) @ W, seq); W optionally stored as fp16 + Cast."""
    rng = np.random.default_rng(0)
    table = rng.normal(size=(VOCAB, HIDDEN)).astype(np.float32)
    table[7] *= 40  # one token with large activations: a per-batch scale would follow it
    weight = rng.normal(size=(HIDDEN, CLASSES)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["table", "input_ids"], ["states"]),
             helper.make_node("MatMul", ["states", "weight"], ["scores"]),
             helper.make_node("ReduceMean", ["scores"], ["logits"], axes=[1], keepdims=0)]
    inits = [numpy_helper.from_array(table, "table")]
    if fp16_storage:
        inits.append(numpy_helper.from_array(weight.astype(np.float16), "weight__fp16"))
        nodes.insert(0, helper.make_node("Cast", ["weight__fp16"], ["weight"], to=TensorProto.FLOAT))
    else:
        inits.append(numpy_helper.from_array(weight, "weight"))
    graph = helper.make_graph(
        nodes, "toy",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["b", "s"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", CLASSES])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _run(path: Path, ids: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(["logits"], {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0]


def _feeds() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    ids = rng.integers(0, VOCAB, size=(64, 6)).astype(np.int64)
    return [{"input_ids": ids[i:i + 16], "attention_mask": np.ones_like(ids[i:i + 16])} for i in range(0, 64, 16)]


def test_fp16_storage_is_undone_exactly():
    plain = fp32_without_fp16_storage(_toy_graph(fp16_storage=True))
    assert not [n for n in plain.graph.node if n.op_type == "Cast"]
    weight = next(i for i in plain.graph.initializer if i.name == "weight")
    assert weight.data_type == TensorProto.FLOAT


def test_uint8_scale_matches_dynamic_quantize_linear():
    assert uint8_scale(-1.0, 3.0) == (pytest.approx(4.0 / 255), 64)
    assert uint8_scale(0.5, 2.0)[1] == 0  # the range always includes 0, as ORT's DynamicQuantizeLinear


@pytest.mark.parametrize("name", ["int8-u8s8", "int8-u8u8"])
def test_row_output_does_not_depend_on_batch_mates(tmp_path, name):
    fp32 = tmp_path / "fp32.onnx"
    onnx.save(_toy_graph(fp16_storage=True), str(fp32))
    paths = quantize_variants(fp32, tmp_path, _feeds(), [name])
    model = onnx.load(str(paths[name]))
    assert not [n for n in model.graph.node if n.op_type == "DynamicQuantizeLinear"]
    row = np.array([[1, 2, 3, 4, 5, 6]], dtype=np.int64)
    loud = np.array([[7, 7, 7, 7, 7, 7]], dtype=np.int64)  # large activations in the other row
    alone = _run(paths[name], row)[0]
    batched = _run(paths[name], np.concatenate([loud, row]))[1]
    assert np.abs(alone - batched).max() <= 1e-6  # float rounding of the batched reduction only
    reference = _run(fp32, row)[0]
    assert np.abs(alone - reference).max() < 0.1 * np.abs(reference).max()


def test_the_batch_check_fails_for_per_call_scales(tmp_path):
    # Guard for the test above: ORT's dynamic quantization does depend on batch-mates here.
    plain = tmp_path / "plain.onnx"
    onnx.save(fp32_without_fp16_storage(_toy_graph(fp16_storage=True)), str(plain))
    dynamic = tmp_path / "dynamic.onnx"
    quantize_dynamic_graph(plain, dynamic, VARIANTS_BY_NAME["int8-u8s8"])
    row = np.array([[1, 2, 3, 4, 5, 6]], dtype=np.int64)
    loud = np.array([[7, 7, 7, 7, 7, 7]], dtype=np.int64)
    assert np.abs(_run(dynamic, row)[0] - _run(dynamic, np.concatenate([loud, row]))[1]).max() > 1e-3


def test_real_model_int8_answers_do_not_depend_on_batch_mates(real_model_dir):
    from runtime.engine.engine import Engine
    from runtime.package.load import load_package, read_golden

    package = load_package(real_model_dir)
    texts = [g["text"] for g in read_golden(package)]
    long_text = " ".join(texts)
    for name in package.manifest.variants:
        engine = Engine(package, name)
        alone = [engine.classify([t])[0].probs for t in texts]
        mixed = engine.classify([long_text, *reversed(texts), long_text])[1:-1][::-1]
        worst = max(abs(p - q) for a, m in zip(alone, mixed) for p, q in zip(a, m.probs))
        assert worst <= 1e-5, (name, worst)


@pytest.mark.parametrize("name", ["int8-u8s8", "int8-u8u8", "int8-u8s7"])
def test_shared_weights_compute_exactly_what_the_stored_int8_weights_did(tmp_path, name):
    # models/export/shared_weights.py: the int8 graph quantizes the FP32 graph's fp16 weights at load.
    import shutil

    from models.export.shared_weights import WEIGHTS_FILE, share_weights

    alone, shared = tmp_path / "alone", tmp_path / "shared"
    for folder in (alone, shared):
        folder.mkdir()
        onnx.save(_toy_graph(fp16_storage=True), str(folder / "fp32.onnx"))
    stored = quantize_variants(alone / "fp32.onnx", alone, _feeds(), [name])[name]
    smoothing: dict = {}
    paths = quantize_variants(shared / "fp32.onnx", shared, _feeds(), [name], smoothing=smoothing)
    assert smoothing == {"weight": [("rows", pytest.approx(smoothing["weight"][0][1]))]}  # SmoothQuant's rows
    record = share_weights(shared / "fp32.onnx", [paths[name]], smoothing)
    assert record["variants"][paths[name].name] == {"quantized_at_load": 1, "stored_int8": 0}
    int8 = onnx.load(str(paths[name]), load_external_data=False)
    assert not [i.name for i in int8.graph.initializer if i.name.endswith("_quantized")]
    # quantized per channel by Div → QuantizeLinear(scale 1), not the per-axis QuantizeLinear ORT folds slowly
    assert not [n.name for n in int8.graph.node if n.op_type == "QuantizeLinear" and n.attribute]
    assert [n for n in int8.graph.node if n.name == "weight__per_channel"]
    # u8u8's zero points differ per channel: rounded first, then added (exact), clipped and cast
    assert bool([n for n in int8.graph.node if n.name == "weight__round"]) == (name == "int8-u8u8")
    assert (shared / WEIGHTS_FILE).stat().st_size > 0
    ids = np.random.default_rng(2).integers(0, VOCAB, size=(8, 6)).astype(np.int64)
    assert np.array_equal(_run(paths[name], ids), _run(stored, ids))
    assert np.array_equal(_run(shared / "fp32.onnx", ids), _run(alone / "fp32.onnx", ids))
    # re-quantizing a package whose weights are shared already reads them from weights.bin
    again = tmp_path / "again"
    shutil.copytree(shared, again)
    assert np.array_equal(_run(quantize_variants(again / "fp32.onnx", again, _feeds(), [name])[name], ids),
                          _run(stored, ids))
