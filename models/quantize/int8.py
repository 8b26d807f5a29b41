"""int8 variants whose answer for a text does not depend on its batch-mates.

ORT's dynamic quantization (`quantize_dynamic`) computes each activation's scale and zero point
per call (DynamicQuantizeLinear), over the whole input tensor: a text's int8 output then depends
on the other rows of its batch, on their order and on padding (15 of 320 texts changed label,
issue 13). Static QDQ/QOperator graphs are deterministic but slower here (the fused contrib
Attention stays FP32, FACTS "int8 lab"). So: quantize dynamically, then replace every
DynamicQuantizeLinear by a QuantizeLinear with a fixed scale and zero point calibrated on the
training split ("pinned" scales). The graph keeps ORT's fast integer kernels (QAttention,
MatMulIntegerToFloat) and each row's output depends on that row only. One scale fixed for
every call is coarser than a per-call one, which cost accuracy (held-out: 2306 of 2383 labels
equal to FP32, macro-F1 −1.3 points); SmoothQuant first moves the LayerNorm/GELU outlier
channels into the weights (2360 of 2383, −0.3 points).

The factory's publish step calls `quantize_variants` (FP32 graph + calibration feeds → int8
graphs); `python -m models.quantize PACKAGE` re-quantizes an existing package from its own FP32
graph through the same publish path (models/requantize.py, models/quantize/__main__.py).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from models.export.graph_data import shared_data_layout

if TYPE_CHECKING:
    from runtime.engine.text import TextEncoder

QUANTIZED_OPS = ("MatMul", "Attention")  # Attention becomes QAttention (int8 QKV projection)
METHOD = "onnxruntime.quantization.quantize_dynamic + calibrated fixed activation scales"
# SmoothQuant migration strength: on the default model (held-out, vs ORT FP32) alpha 0.5 / 0.7 / 0.9
# gave 2254 / 2347 / 2360 of 2383 int8-u8s8 labels equal to FP32 (no smoothing: 2306)
SMOOTHING_ALPHA = 0.9


@dataclass(frozen=True)
class Int8Variant:
    """One int8 variant: how its weights are quantized, and why (which CPUs pick it is platforms/ data)."""

    name: str
    weight_type: str  # "QInt8" (u8s8: signed weights) or "QUInt8" (u8u8)
    per_channel: bool
    reduce_range: bool  # 7-bit weights: no VPMADDUBSW saturation on x86 without VNNI
    why: str
    # Its integer products are exact on every kernel ORT has (no int16 saturation anywhere), so what
    # the factory measures on one CPU is what every tier computes: it can be made on any machine.
    exact_everywhere: bool = True

    def settings(self, calibration: dict) -> dict:
        """What the manifest records about this quantization (`Variant.quantization`)."""
        return {"method": METHOD, "activation_type": "QUInt8", "activation_scales": "fixed (calibrated)",
                "weight_type": self.weight_type, "per_channel": self.per_channel,
                "reduce_range": self.reduce_range, "op_types": list(QUANTIZED_OPS),
                "calibration": calibration}


INT8_VARIANTS = (
    Int8Variant(
        "int8-u8s8", "QInt8", per_channel=True, reduce_range=False,
        why="u8×s8 is what VNNI's vpdpbusd and ARM's sdot/usdot/smmla compute natively, without "
            "saturation; on x86 without VNNI it would saturate in VPMADDUBSW (ORT docs)",
        exact_everywhere=False),
    Int8Variant(
        "int8-u8u8", "QUInt8", per_channel=True, reduce_range=False,
        why="x86 without VNNI: unsigned weights cannot saturate the int16 pair sums, and the "
            "SSE/AVX2/AVX-512 U8U8 kernels agree to float rounding (FACTS)"),
    Int8Variant(
        "int8-u8s7", "QInt8", per_channel=True, reduce_range=True,
        why="x86 without VNNI, fast: signed 7-bit weights (reduce_range) keep VPMADDUBSW's pair sums "
            "within int16 (2 x 255 x 63 < 32767), so AVX2 runs the u8s8 kernel without saturating; "
            "issue 27; made by default since the weights are shared (issue 34)"),
)
VARIANTS_BY_NAME = {v.name: v for v in INT8_VARIANTS}
# what a package gets when nobody names its int8 variants (import, re-quantization): with the weights
# shared (models/export/shared_weights.py) a variant costs only its graph
DEFAULT_INT8 = ("int8-u8s8", "int8-u8u8", "int8-u8s7")


# -- the FP32 graph ---------------------------------------------------------------------------

def fp32_without_fp16_storage(model: onnx.ModelProto) -> onnx.ModelProto:
    """Undo `models.export.fp32.store_weights_fp16`: each `X__fp16` initializer + Cast becomes a float32 `X`.

    fp16 → fp32 is exact, so the result computes bit for bit what ORT computes from the stored
    graph (it folds the Casts at load); the quantizer needs float32 initializers to see weights.
    """
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    halves = {init.name: init for init in graph.initializer if init.name.endswith("__fp16")}
    casts = [n for n in graph.node if n.op_type == "Cast" and len(n.input) == 1 and n.input[0] in halves]
    for node in casts:
        half = halves[node.input[0]]
        value = numpy_helper.to_array(half).astype(np.float32)
        graph.initializer.remove(half)
        graph.initializer.append(numpy_helper.from_array(value, node.output[0]))
        graph.node.remove(node)
    return model


def load_graph(path: Path) -> onnx.ModelProto:
    """The graph without its external data (the shared embeddings file stays where it is)."""
    return onnx.load(str(path), load_external_data=False)


# -- calibration --------------------------------------------------------------------------------

@dataclass(frozen=True)
class TensorStats:
    """Calibration statistics of one float tensor over the real (unpadded) tokens."""

    low: float
    high: float
    channel_absmax: np.ndarray  # max |value| per channel of the last axis


def smoothing_targets(model: onnx.ModelProto) -> dict[str, tuple[onnx.NodeProto, str]]:
    """Float activations that feed a quantized op with a constant weight: tensor → (op, weight name)."""
    initializers = {init.name for init in model.graph.initializer}
    targets = {}
    for node in model.graph.node:
        if node.op_type in QUANTIZED_OPS and len(node.input) > 1 and node.input[1] in initializers:
            targets.setdefault(node.input[0], (node, node.input[1]))
    return targets


def smooth_activation_outliers(model: onnx.ModelProto, stats: dict[str, TensorStats],
                               alpha: float = SMOOTHING_ALPHA, history: dict[str, list] | None = None) -> int:
    """SmoothQuant (Xiao et al. 2023): move per-channel activation outliers into the weights.

    X·W = (X / s)·(s W) per input channel k, s_k = max|X_k|^alpha / max|W_k|^(1 - alpha).
    A transformer's LayerNorm and GELU outputs have a few channels 10–40× larger than the rest;
    one per-tensor uint8 scale fixed for every call then leaves the typical channels a handful
    of steps. A Mul by 1/s before the quantized op (cheap, elementwise) and rows of W scaled by s
    flatten them. Changes the graph in place; returns how many activations were smoothed.
    `history` (weight name → steps) receives each weight's factors in the order applied, so the
    same float32 products can be made again from its stored fp16 copy (models/export/shared_weights.py).
    """
    history = {} if history is None else history
    graph = model.graph
    weights = {init.name: init for init in graph.initializer}
    producers = {out: node for node in graph.node for out in node.output}
    done = 0
    for tensor, (node, weight_name) in smoothing_targets(model).items():
        if tensor not in stats:
            continue
        weight = numpy_helper.to_array(weights[weight_name]).astype(np.float32)
        act = np.maximum(stats[tensor].channel_absmax.astype(np.float64), 1e-5)
        wmax = np.maximum(np.abs(weight).max(axis=1).astype(np.float64), 1e-5)
        scale = np.clip(act ** alpha / wmax ** (1 - alpha), 1e-2, 1e2)
        consumers = [n for n in graph.node if tensor in n.input and n.op_type in QUANTIZED_OPS]
        producer = producers.get(tensor)
        if producer is not None and _fold_into_attention_values(producer, weights, graph, 1.0 / scale, history):
            smoothed = tensor  # the attention context is already divided by s: no Mul op
        else:
            smoothed = f"{tensor}__smoothed"
            inverse = f"{tensor}__smooth_inverse"
            graph.initializer.append(numpy_helper.from_array((1.0 / scale).astype(np.float32), inverse))
            position = min(list(graph.node).index(n) for n in consumers)
            graph.node.insert(position, helper.make_node("Mul", [tensor, inverse], [smoothed],
                                                         name=f"{tensor}__smooth"))
        for consumer in consumers:
            scaled_name = consumer.input[1]
            scaled = numpy_helper.to_array(weights[scaled_name]).astype(np.float32) * scale[:, None].astype(np.float32)
            history.setdefault(scaled_name, []).append(("rows", scale.astype(np.float32)))
            graph.initializer.remove(weights[scaled_name])
            weights[scaled_name] = numpy_helper.from_array(scaled, scaled_name)
            graph.initializer.append(weights[scaled_name])
            consumer.input[0] = smoothed
        done += 1
    return done


def _fold_into_attention_values(attention: onnx.NodeProto, weights: dict, graph: onnx.GraphProto,
                                factor: np.ndarray, history: dict[str, list]) -> bool:
    """Scale the V columns (and bias) of a fused Attention's QKV projection by `factor` per channel.

    The context is softmax-weighted sums of V rows, so its channel c scales with V's column c:
    the smoothing division costs no op. Only when the Attention's consumers are all quantized
    ops being smoothed (its output feeds just the output projection here).
    """
    if attention.op_type != "Attention" or len(attention.input) < 3:
        return False
    weight, bias = weights.get(attention.input[1]), weights.get(attention.input[2])
    if weight is None or bias is None:
        return False
    w, b = numpy_helper.to_array(weight).astype(np.float32), numpy_helper.to_array(bias).astype(np.float32)
    hidden = w.shape[1] // 3
    if w.shape[1] != 3 * hidden or factor.shape != (hidden,):
        return False
    w[:, 2 * hidden:] *= factor.astype(np.float32)
    b[2 * hidden:] *= factor.astype(np.float32)
    history.setdefault(weight.name, []).append(("columns", 2 * hidden, factor.astype(np.float32), w.shape[1]))
    for old, new in ((weight, numpy_helper.from_array(w, weight.name)), (bias, numpy_helper.from_array(b, bias.name))):
        graph.initializer.remove(old)
        graph.initializer.append(new)
        weights[new.name] = new
    return True


def dynamic_inputs(quantized: onnx.ModelProto) -> list[str]:
    """The float tensors a dynamically quantized graph quantizes per call."""
    return [n.input[0] for n in quantized.graph.node if n.op_type == "DynamicQuantizeLinear"]


def activation_stats(fp32_path: Path, tensors: Sequence[str],
                     feeds: Iterable[dict[str, np.ndarray]]) -> dict[str, TensorStats]:
    """Range and per-channel max |value| of each named tensor over the calibration feeds (FP32 graph).

    Padded positions are left out: attention and pooling mask them, so their values must not
    widen the scale every real token is quantized with.
    """
    from runtime.platform.offline import import_onnxruntime

    ort = import_onnxruntime()

    model = onnx.load(str(fp32_path), load_external_data=False)
    known = {o.name for o in model.graph.output}
    for name in tensors:
        if name not in known:
            model.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep every tensor
    options.log_severity_level = 3
    session = _session_beside(model, fp32_path, options)
    lows = {name: np.inf for name in tensors}
    highs = {name: -np.inf for name in tensors}
    absmax: dict[str, np.ndarray] = {}
    for feed in feeds:
        keep = feed["attention_mask"].astype(bool)
        for name, value in zip(tensors, session.run(list(tensors), feed)):
            rows = value[keep] if value.ndim == 3 and value.shape[:2] == keep.shape else value
            rows = rows.reshape(-1, rows.shape[-1])
            lows[name] = min(lows[name], float(rows.min()))
            highs[name] = max(highs[name], float(rows.max()))
            peak = np.abs(rows).max(axis=0)
            absmax[name] = np.maximum(absmax[name], peak) if name in absmax else peak
    return {name: TensorStats(lows[name], highs[name], absmax[name]) for name in tensors}


def _session_beside(model: onnx.ModelProto, original: Path, options):
    """An ORT session for an in-memory graph whose external data lives next to `original`."""
    from runtime.platform.offline import import_onnxruntime

    ort = import_onnxruntime()

    probe = original.parent / f".{original.stem}.calibrate.onnx"
    onnx.save(model, str(probe))
    try:
        return ort.InferenceSession(str(probe), options, providers=["CPUExecutionProvider"])
    finally:
        probe.unlink()


def uint8_scale(low: float, high: float) -> tuple[float, int]:
    """Scale and zero point as DynamicQuantizeLinear computes them, for a fixed range."""
    low, high = min(low, 0.0), max(high, 0.0)
    scale = (high - low) / 255.0 if high > low else 1.0
    zero_point = int(np.clip(np.round(-low / scale), 0, 255))
    return float(np.float32(scale)), zero_point


def pin_activation_scales(quantized: onnx.ModelProto, ranges: dict[str, tuple[float, float]]) -> int:
    """Replace each DynamicQuantizeLinear by QuantizeLinear with a fixed scale/zero point; returns how many."""
    graph = quantized.graph
    dynamic = [n for n in graph.node if n.op_type == "DynamicQuantizeLinear"]
    for node in dynamic:
        scale, zero_point = uint8_scale(*ranges[node.input[0]])
        out, scale_name, zp_name = node.output
        graph.initializer.append(numpy_helper.from_array(np.array(scale, dtype=np.float32), scale_name))
        graph.initializer.append(numpy_helper.from_array(np.array(zero_point, dtype=np.uint8), zp_name))
        position = list(graph.node).index(node)
        graph.node.remove(node)
        graph.node.insert(position, helper.make_node(
            "QuantizeLinear", [node.input[0], scale_name, zp_name], [out], name=f"{node.name}__fixed"))
    return len(dynamic)


def fuse_integer_matmuls(quantized: onnx.ModelProto) -> int:
    """MatMulInteger → Cast → Mul(a_scale·b_scale) becomes one MatMulIntegerToFloat; returns how many.

    ORT fuses this pattern itself only while the scale product is still a Mul node; with fixed
    activation scales, constant folding turns that product into a constant first and the
    fusion no longer matches, leaving three ops (and an int32 → float pass) per MatMul.
    MatMulIntegerToFloat is a com.microsoft CPU kernel on every architecture ORT supports.
    """
    graph = quantized.graph
    producers = {out: node for node in graph.node for out in node.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    fused = 0
    for matmul in [n for n in graph.node if n.op_type == "MatMulInteger"]:
        after = consumers.get(matmul.output[0], [])
        if len(after) != 1 or after[0].op_type != "Cast":
            continue
        cast = after[0]
        after = consumers.get(cast.output[0], [])
        if len(after) != 1 or after[0].op_type != "Mul":
            continue
        mul = after[0]
        scales = producers.get(next(i for i in mul.input if i != cast.output[0]))
        if scales is None or scales.op_type != "Mul" or len(consumers[scales.output[0]]) != 1:
            continue
        a, b, a_zero, b_zero = (list(matmul.input) + ["", "", ""])[:4]
        a_scale, b_scale = scales.input
        position = list(graph.node).index(matmul)
        for node in (matmul, cast, mul, scales):
            graph.node.remove(node)
        graph.node.insert(position, helper.make_node(
            "MatMulIntegerToFloat", [a, b, a_scale, b_scale, a_zero, b_zero], [mul.output[0]],
            name=f"{matmul.name}__to_float", domain="com.microsoft"))
        fused += 1
    return fused


# -- variants -----------------------------------------------------------------------------------

def quantize_dynamic_graph(fp32_path: Path, out_path: Path, variant: Int8Variant) -> None:
    """ORT's dynamic quantization of the MatMul and Attention weights (embeddings untouched)."""
    import logging

    from runtime.platform.offline import import_onnxruntime

    import_onnxruntime()  # telemetry off before the submodule loads onnxruntime
    from onnxruntime.quantization import QuantType, quantize_dynamic

    logging.disable(logging.WARNING)  # its advice to run its pre-processing, on every call: not for these graphs
    try:
        quantize_dynamic(
            str(fp32_path), str(out_path), op_types_to_quantize=list(QUANTIZED_OPS),
            weight_type=getattr(QuantType, variant.weight_type), per_channel=variant.per_channel,
            reduce_range=variant.reduce_range,
            # Contrib ops defeat ONNX shape inference; every tensor in these graphs is float32.
            extra_options={"MatMulConstBOnly": True, "DefaultTensorType": TensorProto.FLOAT},
        )
    finally:
        logging.disable(logging.NOTSET)


def quantize_variants(fp32_graph: Path, out_dir: Path, calibration_feeds: Iterable[dict[str, np.ndarray]],
                      names: Sequence[str] = DEFAULT_INT8, alpha: float = SMOOTHING_ALPHA,
                      smoothing: dict[str, list] | None = None) -> dict[str, Path]:
    """Write `out_dir/model-<name>.onnx` for each int8 variant named; returns name → path.

    `fp32_graph` is the package's FP32 graph (fp16 storage allowed); its external-data files
    (the shared embeddings) sit in its folder, and the int8 graphs reference them by the same
    relative name, so `out_dir` must hold them too when the graphs are loaded.
    `calibration_feeds` are {input_ids, attention_mask} batches of training texts (`text_feeds`).
    Steps: FP32 graph without fp16 storage → SmoothQuant (alpha) → ORT dynamic quantization →
    every activation scale pinned to its calibrated range. `smoothing` receives each weight's
    SmoothQuant factors (for models/export/shared_weights.py).
    """
    from models.export.shared_weights import inline_fp16_weights

    out_dir.mkdir(parents=True, exist_ok=True)
    stored = load_graph(fp32_graph)
    inline_fp16_weights(stored, fp32_graph.parent)  # a package whose fp16 weights are shared already
    layout = shared_data_layout(stored)
    feeds = list(calibration_feeds)
    paths: dict[str, Path] = {}
    with tempfile.TemporaryDirectory(prefix="decide-quantize-") as tmp:
        work = Path(tmp)
        for entry in {v["location"] for v in layout.values()}:
            # a copy: onnx refuses external data behind symlinks and hard links
            shutil.copyfile(fp32_graph.parent / entry, work / entry)
        plain = fp32_without_fp16_storage(stored)
        plain_path = work / "fp32-plain.onnx"
        onnx.save(plain, str(plain_path))
        smooth_activation_outliers(plain, activation_stats(plain_path, list(smoothing_targets(plain)), feeds), alpha,
                                   smoothing)
        smoothed_path = work / "fp32-smoothed.onnx"
        onnx.save(plain, str(smoothed_path))
        originals = stub_external_data(plain)
        stubbed_path = work / "fp32-smoothed-stubbed.onnx"
        onnx.save(plain, str(stubbed_path))
        ranges: dict[str, tuple[float, float]] | None = None
        for name in names:
            variant = VARIANTS_BY_NAME[name]
            dynamic_path = work / f"{name}-dynamic.onnx"
            quantize_dynamic_graph(stubbed_path, dynamic_path, variant)
            quantized = onnx.load(str(dynamic_path), load_external_data=False)
            if ranges is None:  # every variant quantizes the same activations
                stats = activation_stats(smoothed_path, dynamic_inputs(quantized), feeds)
                ranges = {tensor: (s.low, s.high) for tensor, s in stats.items()}
            pin_activation_scales(quantized, ranges)
            fuse_integer_matmuls(quantized)
            restore_external_data(quantized, originals)
            path = out_dir / f"model-{name}.onnx"
            onnx.save(quantized, str(path))
            paths[name] = path
    return paths


def stub_external_data(model: onnx.ModelProto) -> dict[str, TensorProto]:
    """Replace each initializer kept in an external-data file (the word table) by a one-row
    stand-in of its type and width; returns name → the original reference. ORT's quantizer never
    changes the table (a Gather's), but it would load it and copy it several times: an imported
    250k-piece float32 table is 384 MB a copy."""
    originals = {}
    for init in model.graph.initializer:
        if init.data_location == TensorProto.EXTERNAL:
            original = TensorProto()
            original.CopyFrom(init)
            originals[init.name] = original
            dtype = helper.tensor_dtype_to_np_dtype(init.data_type)
            init.CopyFrom(numpy_helper.from_array(np.zeros([1, *init.dims[1:]], dtype=dtype), init.name))
    return originals


def restore_external_data(model: onnx.ModelProto, originals: dict[str, TensorProto]) -> None:
    """Put the original external-data references back in place of `stub_external_data`'s stand-ins."""
    for init in model.graph.initializer:
        if init.name in originals:
            init.CopyFrom(originals[init.name])


def calibration_record(feeds: Sequence[dict[str, np.ndarray]], source: str, alpha: float = SMOOTHING_ALPHA) -> dict:
    """What the manifest says about calibration (goes into `Int8Variant.settings`)."""
    tokens = int(sum(f["attention_mask"].sum() for f in feeds))
    return {"source": source, "texts": int(sum(len(f["input_ids"]) for f in feeds)), "tokens": tokens,
            "ranges": "min/max over unpadded tokens", "smoothing": {"method": "SmoothQuant", "alpha": alpha}}


def text_feeds(encoder: TextEncoder, texts: Sequence[str], batch_size: int = 32,
               batch_tokens: int = 2048) -> list[dict[str, np.ndarray]]:
    """{input_ids, attention_mask} batches of texts sorted by length (little padding), tokenized by
    the runtime's own `TextEncoder` for the package (the ids the model will be fed). A batch holds
    at most `batch_tokens` padded tokens: calibration fetches every quantized op's input, so a
    batch of 32 texts of 512 tokens would hold gigabytes of activations."""
    from runtime.engine.batching import pad_batch

    items = sorted(encoder.tokenize(list(texts)), key=lambda item: len(item.ids))
    feeds, start = [], 0
    while start < len(items):
        rows = max(1, min(batch_size, batch_tokens // len(items[min(start + batch_size, len(items)) - 1].ids)))
        batch = items[start:start + rows]
        ids, mask = pad_batch(batch, max(len(item.ids) for item in batch), encoder.pad_id)
        feeds.append({"input_ids": ids, "attention_mask": mask})
        start += len(batch)
    return feeds
