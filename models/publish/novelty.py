"""The novelty score: how far a text's features are from every case the model was fitted on.

Mahalanobis distance (Lee et al. 2018) in the space the classifier's last linear layer reads:
class means of the training cases and their shared covariance (shrunk towards a multiple of the
identity, so ~400 texts a class give a stable inverse), novelty = the squared distance to the
nearest case centroid. A hex dump, a text in a script the model never saw, or a topic far from
every case lands far from all centroids even when the softmax is confident.

It ships inside each variant's graph as one more output, `novelty` (float32 [batch]), so the
runtime stays generic: z = f·P (P whitens the covariance), novelty = min_c ‖z − m_c‖², written as
‖z‖² − 2·z·mᵀ + ‖m‖² (two MatMuls, a ReduceSum, a ReduceMin). P is stored fp16 (+ Cast): half
the bytes, and the threshold is chosen on the graph as shipped, so fp16 rounding is accounted for.
The graph part is added after quantization, so the quantizer never touches it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OUTPUT = "novelty"
PREFIX = "novelty__"  # every tensor the novelty part adds to a graph starts with this
SHRINK = 0.1  # covariance shrinkage towards trace/D · I


@dataclass(frozen=True)
class NoveltyModel:
    """Case centroids and the whitening projection of their shared covariance."""

    means: np.ndarray  # [cases, dim]
    projection: np.ndarray  # [dim, dim]

    def scores(self, features: np.ndarray) -> np.ndarray:
        """The novelty of each row of `features` (numpy reference of the graph part)."""
        z, m = features @ self.projection, self.means @ self.projection
        return ((z[:, None, :] - m[None]) ** 2).sum(-1).min(1)


def fit_novelty(features: np.ndarray, labels: np.ndarray, case_classes: list[int], shrink: float = SHRINK) -> NoveltyModel:
    """Fit on the training rows of the case classes (a negative class is not a centroid: a text
    near it is flagged by the classifier itself)."""
    rows = [features[labels == c] for c in case_classes if (labels == c).any()]
    if not rows:
        raise ValueError("no training rows of a case class to fit the novelty score on")
    means = np.stack([r.mean(0) for r in rows])
    centred = np.concatenate([r - mean for r, mean in zip(rows, means)]).astype(np.float64)
    cov = centred.T @ centred / max(1, len(centred) - len(rows))
    cov = (1 - shrink) * cov + shrink * np.eye(cov.shape[0]) * np.trace(cov) / cov.shape[0]
    values, vectors = np.linalg.eigh(cov)
    return NoveltyModel(means.astype(np.float32), (vectors / np.sqrt(values)).astype(np.float32))


def logits_input(model: onnx.ModelProto) -> str:
    """The tensor the last linear layer reads: input of the MatMul/Gemm that makes `logits`
    (through an optional Add of the bias)."""
    producers = {out: node for node in model.graph.node for out in node.output}
    node = producers.get("logits")
    if node is not None and node.op_type == "Add":
        node = next((producers[i] for i in node.input if i in producers
                     and producers[i].op_type in ("MatMul", "Gemm")), None)
    if node is None or node.op_type not in ("MatMul", "Gemm"):
        raise ValueError("logits are not made by a MatMul/Gemm (+ Add): cannot find the features")
    return node.input[0]


def add_novelty_output(model: onnx.ModelProto, novelty: NoveltyModel, features: str | None = None) -> onnx.ModelProto:
    """A copy of `model` with the output `novelty` computed from its `features` tensor."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    features = features or logits_input(model)
    centroids = novelty.means @ novelty.projection
    graph = model.graph
    name = PREFIX
    graph.initializer.extend([
        numpy_helper.from_array(novelty.projection.astype(np.float16), f"{name}projection_fp16"),
        numpy_helper.from_array(np.ascontiguousarray(centroids.T, dtype=np.float32), f"{name}centroids_t"),
        numpy_helper.from_array((centroids.astype(np.float64) ** 2).sum(1).astype(np.float32), f"{name}centroid_norms"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), f"{name}axis1"),
        numpy_helper.from_array(np.array(-2.0, dtype=np.float32), f"{name}minus_two"),
    ])
    graph.node.extend([
        helper.make_node("Cast", [f"{name}projection_fp16"], [f"{name}projection"], to=TensorProto.FLOAT),
        helper.make_node("MatMul", [features, f"{name}projection"], [f"{name}z"]),
        helper.make_node("Mul", [f"{name}z", f"{name}z"], [f"{name}z2"]),
        helper.make_node("ReduceSum", [f"{name}z2", f"{name}axis1"], [f"{name}zz"], keepdims=1),
        helper.make_node("MatMul", [f"{name}z", f"{name}centroids_t"], [f"{name}zm"]),
        helper.make_node("Mul", [f"{name}zm", f"{name}minus_two"], [f"{name}zm2"]),
        helper.make_node("Add", [f"{name}zz", f"{name}zm2"], [f"{name}partial"]),
        helper.make_node("Add", [f"{name}partial", f"{name}centroid_norms"], [f"{name}distances"]),
        helper.make_node("ReduceMin", [f"{name}distances"], [OUTPUT], axes=[1], keepdims=0),
    ])
    graph.output.append(helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["batch"]))
    return model


def strip_novelty(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` without the novelty part (to re-quantize a published graph and fit the
    score again: the quantizer must never see it, and it is added once)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    added = [n for n in graph.node if any(o == OUTPUT or o.startswith(PREFIX) for o in n.output)]
    for node in added:
        graph.node.remove(node)
    for init in [i for i in graph.initializer if i.name.startswith(PREFIX)]:
        graph.initializer.remove(init)
    for output in [o for o in graph.output if o.name == OUTPUT]:
        graph.output.remove(output)
    return model


def threshold_for(scores: np.ndarray, flag_rate: float) -> float:
    """The novelty above which `flag_rate` of these (held-out case) scores lie."""
    if not len(scores):
        raise ValueError("no held-out cases to choose the novelty threshold on")
    return float(np.quantile(scores.astype(np.float64), 1.0 - flag_rate))
