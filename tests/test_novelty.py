"""models/novelty: the Mahalanobis novelty score, fitted in numpy and shipped as a graph output."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from models.publish.novelty import add_novelty_output, fit_novelty, logits_input, threshold_for
from runtime.platform.offline import import_onnxruntime

ort = import_onnxruntime()  # decide's import: telemetry off even when this module is imported outside pytest


def linear_graph(weight: np.ndarray, bias: np.ndarray) -> onnx.ModelProto:
    """features [batch, dim] → Relu → MatMul + Add → logits: a stand-in for a classifier's head."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["features"]),
         helper.make_node("MatMul", ["features", "w"], ["scores"]),
         helper.make_node("Add", ["scores", "b"], ["logits"])],
        "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", weight.shape[0]])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", weight.shape[1]])],
        initializer=[numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def test_the_graph_output_is_the_numpy_score_and_far_texts_score_high():
    rng = np.random.default_rng(3)
    centres = rng.normal(3, 1, size=(3, 16)).astype(np.float32)
    labels = np.repeat(np.arange(4), 200)  # class 3 plays the negative label: not a centroid
    features = (np.concatenate([centres, rng.normal(3, 1, size=(1, 16))])[labels]
                + rng.normal(0, 0.3, size=(800, 16))).clip(min=0).astype(np.float32)
    novelty = fit_novelty(features, labels, case_classes=[0, 1, 2])
    assert novelty.means.shape == (3, 16)
    model = linear_graph(rng.normal(size=(16, 4)).astype(np.float32), np.zeros(4, np.float32))
    assert logits_input(model) == "features"
    onnx.checker.check_model(add_novelty_output(model, novelty))
    session = ort.InferenceSession(add_novelty_output(model, novelty).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    probe = np.concatenate([features[:5], np.full((2, 16), 20.0, np.float32)])
    logits, scores = session.run(["logits", "novelty"], {"x": probe})
    assert logits.shape == (7, 4) and scores.shape == (7,)
    assert np.allclose(scores, novelty.scores(probe), rtol=2e-3, atol=1e-2)  # fp16-stored projection
    threshold = threshold_for(novelty.scores(features[labels < 3]), flag_rate=0.01)
    assert (scores[:5] < threshold).all() and (scores[5:] > 10 * threshold).all()


def test_no_case_rows_and_no_linear_logits_are_errors():
    with pytest.raises(ValueError, match="no training rows"):
        fit_novelty(np.zeros((4, 3), np.float32), np.zeros(4, dtype=int), case_classes=[1])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["logits"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])])
    with pytest.raises(ValueError, match="MatMul/Gemm"):
        logits_input(helper.make_model(graph))
