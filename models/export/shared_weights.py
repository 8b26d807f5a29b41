"""One copy of the weights for every variant (issue 34: a deeper default in zips under 100 MB).

The FP32 graph stores its large weights as float16 + Cast (models/export/fp32.py). This publish step
moves those float16 tensors into one external-data file, `weights.bin`, and rewrites every int8
graph so that it no longer carries its own int8 weights: each `<W>_quantized` initializer
becomes `QuantizeLinear(Div(Mul…(Cast(<W>__fp16)), <W>_scale), 1, zero point)` (Round → Add of
the zero points → Clip → Cast where they differ per channel), the same float32 operations, in the same order, that
made it in the factory (fp16 → fp32 is exact; SmoothQuant's row and column factors are plain
float32 products; quantization is round(x / scale) + zero point, as ORT's quantizer computes it;
not ORT's per-axis QuantizeLinear, which folds ~12× slower). ORT folds those constant nodes into int8 initializers
when it loads the graph, so each variant computes what the gate measured; the package holds the
weights once however many variants it has (a 6-layer student: 21 MB of fp16 weights instead of
21 MB + 11.6 MB per int8 variant).

Every rewritten weight is checked here: the folded values must equal the int8 tensor the
quantizer wrote, bit for bit, else that weight keeps its stored int8 copy (logged). onnx + ORT.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import load_external_data_for_tensor

from models.export.graph_data import point_to_shared_data, write_shared_data
from models.progress import log

WEIGHTS_FILE = "weights.bin"
FP16_SUFFIX = "__fp16"  # models.export.fp32.store_weights_fp16's name for a stored half-precision weight
QUANTIZED_SUFFIX = "_quantized"  # ORT's quantizer: <W>_quantized, <W>_scale, <W>_zero_point

# A weight's SmoothQuant history, in the order applied (models.quantize.int8.smooth_activation_outliers):
# ("rows", factors[K]) multiplies row k by factors[k]; ("columns", start, factors[M]) multiplies
# columns start … start+M-1.
Steps = list[tuple]


def inline_fp16_weights(model: onnx.ModelProto, folder: Path) -> None:
    """Load the bytes of every fp16 weight that lives in an external-data file (a package whose
    weights are shared already, e.g. when it is re-quantized)."""
    for init in model.graph.initializer:
        if init.name.endswith(FP16_SUFFIX) and init.data_location == TensorProto.EXTERNAL:
            load_external_data_for_tensor(init, str(folder))
            init.data_location = TensorProto.DEFAULT
            del init.external_data[:]


def share_fp32_weights(fp32_path: Path) -> dict[str, tuple[int, int]]:
    """Move the FP32 graph's fp16 weights into WEIGHTS_FILE beside it; returns their layout."""
    model = onnx.load(str(fp32_path), load_external_data=False)
    inline_fp16_weights(model, fp32_path.parent)
    names = [init.name for init in model.graph.initializer if init.name.endswith(FP16_SUFFIX)]
    layout = write_shared_data(model, names, fp32_path.parent / WEIGHTS_FILE)
    point_to_shared_data(model, layout, WEIGHTS_FILE)
    onnx.save(model, str(fp32_path))
    return layout


def quantize_at_load(int8_path: Path, fp16: dict[str, TensorProto], layout: dict[str, tuple[int, int]],
                     smoothing: dict[str, Steps]) -> tuple[int, int]:
    """Rewrite one int8 graph's weights as folded quantization of the shared fp16 ones; returns
    (weights rewritten, weights kept as stored int8 because the fold would not match)."""
    model = onnx.load(str(int8_path), load_external_data=False)
    graph = model.graph
    inits = {init.name: init for init in graph.initializer}
    candidates = [name for name in inits if name.endswith(QUANTIZED_SUFFIX)
                  and name.removesuffix(QUANTIZED_SUFFIX) + FP16_SUFFIX in fp16
                  and name.removesuffix(QUANTIZED_SUFFIX) + "_scale" in inits]
    steps = {name: smoothing.get(name.removesuffix(QUANTIZED_SUFFIX), []) for name in candidates}
    # the fast chain where it folds to the very same int8 values, else the per-channel QuantizeLinear
    nodes = {name: _fold_nodes(name.removesuffix(QUANTIZED_SUFFIX), steps[name], inits) for name in candidates}
    matching = _matching(int8_path.parent, inits, fp16, layout, nodes, quiet=True)
    slow = {name: _fold_nodes(name.removesuffix(QUANTIZED_SUFFIX), steps[name]) for name in candidates
            if name not in matching}
    nodes.update(slow)
    matching += _matching(int8_path.parent, inits, fp16, layout, slow)
    if slow:
        log(f"shared weights: {int8_path.name}: {len(slow)} weights quantize per channel at load (slower start)")
    for name in matching:
        base = name.removesuffix(QUANTIZED_SUFFIX)
        graph.initializer.remove(inits[name])
        factor_inits, chain = nodes[name]
        graph.initializer.extend(factor_inits)
        graph.initializer.append(_external_fp16(fp16[base + FP16_SUFFIX], layout))
        for node in reversed(chain):  # producers first: before every consumer
            graph.node.insert(0, node)
    onnx.save(model, str(int8_path))
    return len(matching), len(candidates) - len(matching)


def _fold_nodes(base: str, steps: Steps, inits: dict[str, TensorProto] | None = None
                ) -> tuple[list[TensorProto], list[onnx.NodeProto]]:
    """The factor initializers and the Cast → Mul… → quantization chain that makes <base>_quantized.

    With `inits` (the graph's <base>_scale and <base>_zero_point), the per-channel quantization is
    spelled Div by the channel scales → QuantizeLinear with scale 1 (or Round → Add → Clip → Cast): ORT's
    per-axis QuantizeLinear folds an element at a time (0.25 s at every start for a six-layer
    student's weights, against 0.02 s for this chain). round(x / scale) + zero point is the same
    computation; `_matching` checks the folded bits before a chain is used."""
    factors, chain = [], [helper.make_node("Cast", [base + FP16_SUFFIX], [f"{base}__w0"], to=TensorProto.FLOAT,
                                           name=f"{base}__load")]
    for i, step in enumerate(steps, 1):
        name = f"{base}__factor{i}"
        if step[0] == "rows":
            factors.append(numpy_helper.from_array(np.asarray(step[1], np.float32)[:, None], name))
        else:  # ("columns", start, values, width): ones elsewhere (x · 1.0 is exact)
            _, start, values, width = step
            row = np.ones((1, width), np.float32)
            row[0, start:start + len(values)] = np.asarray(values, np.float32)
            factors.append(numpy_helper.from_array(row, name))
        chain.append(helper.make_node("Mul", [f"{base}__w{i - 1}", name], [f"{base}__w{i}"], name=f"{base}__smooth{i}"))
    weights = f"{base}__w{len(steps)}"
    if inits is None:
        chain.append(helper.make_node("QuantizeLinear", [weights, f"{base}_scale", f"{base}_zero_point"],
                                      [base + QUANTIZED_SUFFIX], axis=1, name=f"{base}__quantize"))
        return factors, chain
    tail_factors, tail = _channel_quantize_nodes(base, weights, inits)
    return factors + tail_factors, chain + tail


def _channel_quantize_nodes(base: str, weights: str, inits: dict[str, TensorProto]
                            ) -> tuple[list[TensorProto], list[onnx.NodeProto]]:
    """`weights` quantized per channel into <base>_quantized: Div by the channel scales, then
    QuantizeLinear with scale 1 (one zero point) or Round → Add zero points → Clip → Cast."""
    scale = numpy_helper.to_array(inits[f"{base}_scale"]).astype(np.float32)
    zero = numpy_helper.to_array(inits[f"{base}_zero_point"])
    factors = [numpy_helper.from_array(scale.reshape(1, -1), f"{base}__channel_scale"),
               numpy_helper.from_array(np.ones((), np.float32), f"{base}__unit_scale")]
    nodes = [helper.make_node("Div", [weights, f"{base}__channel_scale"], [f"{base}__scaled"],
                              name=f"{base}__per_channel")]
    if np.all(zero == zero.flat[0]):
        factors.append(numpy_helper.from_array(zero.flat[0:1].reshape(()).copy(), f"{base}__unit_zero"))
        nodes.append(helper.make_node("QuantizeLinear", [f"{base}__scaled", f"{base}__unit_scale",
                                                         f"{base}__unit_zero"],
                                      [base + QUANTIZED_SUFFIX], name=f"{base}__quantize"))
        return factors, nodes
    # zero points per channel: round half to even first, then add them (integers: exact in float32), clip, cast;
    # adding them before rounding (x / scale + zero point) would round some halves the other way
    limits = np.iinfo(zero.dtype)
    factors += [numpy_helper.from_array(zero.astype(np.float32).reshape(1, -1), f"{base}__channel_zero"),
                numpy_helper.from_array(np.array(limits.min, np.float32), f"{base}__low"),
                numpy_helper.from_array(np.array(limits.max, np.float32), f"{base}__high")]
    nodes += [helper.make_node("Round", [f"{base}__scaled"], [f"{base}__rounded"], name=f"{base}__round"),
              helper.make_node("Add", [f"{base}__rounded", f"{base}__channel_zero"], [f"{base}__shifted"],
                               name=f"{base}__zero_points"),
              helper.make_node("Clip", [f"{base}__shifted", f"{base}__low", f"{base}__high"], [f"{base}__clipped"],
                               name=f"{base}__saturate"),
              helper.make_node("Cast", [f"{base}__clipped"], [base + QUANTIZED_SUFFIX],
                               to=onnx.helper.np_dtype_to_tensor_dtype(zero.dtype), name=f"{base}__quantize")]
    return factors, nodes


def _external_fp16(init: TensorProto, layout: dict[str, tuple[int, int]]) -> TensorProto:
    """A reference to the shared fp16 tensor (dims and type, bytes in WEIGHTS_FILE)."""
    offset, length = layout[init.name]
    ref = TensorProto(name=init.name, data_type=init.data_type, dims=list(init.dims))
    ref.data_location = TensorProto.EXTERNAL
    for key, value in (("location", WEIGHTS_FILE), ("offset", str(offset)), ("length", str(length))):
        entry = ref.external_data.add()
        entry.key, entry.value = key, value
    return ref


def _matching(folder: Path, inits: dict[str, TensorProto], fp16: dict[str, TensorProto],
              layout: dict[str, tuple[int, int]], nodes: dict, quiet: bool = False) -> list[str]:
    """The quantized weights whose fold, run by ORT, equals the stored int8 tensor exactly
    (`quiet`: a mismatch is not logged — a fallback chain is tried next)."""
    from runtime.platform.offline import import_onnxruntime

    if not nodes:
        return []
    ort = import_onnxruntime()
    graph_inits, graph_nodes, outputs = [], [], []
    for name, (factors, chain) in nodes.items():
        base = name.removesuffix(QUANTIZED_SUFFIX)
        graph_inits += [*factors, _external_fp16(fp16[base + FP16_SUFFIX], layout), inits[base + "_scale"],
                        inits[base + "_zero_point"]]
        graph_nodes += chain
        outputs.append(helper.make_tensor_value_info(name, inits[name].data_type, None))
    check = helper.make_model(helper.make_graph(graph_nodes, "fold-check", [], outputs, graph_inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    check.ir_version = 8
    with tempfile.NamedTemporaryFile(suffix=".onnx", dir=folder, prefix=".fold-check-") as handle:
        onnx.save(check, handle.name)  # beside the weights file: its location resolves
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        values = ort.InferenceSession(handle.name, options, providers=["CPUExecutionProvider"]).run(None, {})
    matching = []
    for name, value in zip(nodes, values):
        if np.array_equal(value, numpy_helper.to_array(inits[name])):
            matching.append(name)
        elif not quiet:
            log(f"shared weights: {name} folds to other values than the quantizer wrote; kept as stored int8")
    return matching


def share_weights(fp32_path: Path, int8_paths: list[Path], smoothing: dict[str, Steps]) -> dict:
    """The publish step: fp16 weights into WEIGHTS_FILE, every int8 graph quantizing them at load.
    Returns what the manifest's provenance records."""
    layout = share_fp32_weights(fp32_path)
    model = onnx.load(str(fp32_path), load_external_data=False)
    fp16 = {init.name: init for init in model.graph.initializer if init.name in layout}
    record = {"file": WEIGHTS_FILE, "tensors": len(layout), "variants": {}}
    for path in int8_paths:
        rewritten, kept = quantize_at_load(path, fp16, layout, smoothing)
        record["variants"][path.name] = {"quantized_at_load": rewritten, "stored_int8": kept}
        log(f"shared weights: {path.name} quantizes {rewritten} weights from {WEIGHTS_FILE} at load"
            + (f", keeps {kept} as int8" if kept else ""))
    return record
