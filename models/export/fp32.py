"""ONNX export (fused BERT ops) of the FP32 variant (fp16 storage); models/quantize/int8.py makes the int8 ones from it.

All graphs keep ORT's portable form (no ALL-level/layout optimization, which ties a graph to the
CPU it was made on; the runtime optimizes at session creation). The frozen word-embedding table
(int8 codes + fp16 block scales) is moved into one external-data file that every variant of the
package references, so it is stored once.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from models.export.graph_data import SHARED_DATA_FILE, point_to_shared_data, write_shared_data
from models.export.hybrid_export import export_hybrid, fuse_hybrid_ops
from models.export.trace import trace_to_onnx
from models.training.classifier import MeanFeatureHead, TextClassifier, additive_mask
from models.training.word_table import graph_form

FP32_GRAPH = "model-fp32.onnx"


class _ExportWrapper(torch.nn.Module):
    """Positional (input_ids, attention_mask) → logits, for the tracer.

    The encoder layers are spelled out in the classic BERT form (additive mask, view + permute
    per head, Div by sqrt(d)) instead of calling transformers' forward: that is the pattern ONNX
    Runtime's fusion recognises as one Attention op per layer, and it does not change when a
    transformers release rewrites its attention code. The weights are the model's own modules.
    """

    def __init__(self, model: TextClassifier) -> None:
        super().__init__()
        self.model = model
        # the graph stores the frozen word table packed two codes a byte (models/training/word_table.py graph_form)
        self.word_table = graph_form(model.word_embedding) if model.word_embedding is not None else None
        # Python ints, not traced sizes: they become constants in the graph
        self.hidden = model.encoder.config.hidden_size
        self.num_heads = model.encoder.config.num_attention_heads
        self.head_size = self.hidden // self.num_heads

    def layer(self, layer: torch.nn.Module, states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """One BertLayer: self-attention, add & norm, feed-forward, add & norm."""
        attention = layer.attention.self

        def heads(x: torch.Tensor) -> torch.Tensor:
            return x.view(x.size()[:-1] + (self.num_heads, self.head_size)).permute(0, 2, 1, 3)

        query, key, value = heads(attention.query(states)), heads(attention.key(states)), heads(attention.value(states))
        scores = torch.matmul(query, key.transpose(-1, -2)) / math.sqrt(self.head_size)
        context = torch.matmul(torch.softmax(scores + mask, dim=-1), value).permute(0, 2, 1, 3).contiguous()
        context = context.view(context.size()[:-2] + (self.hidden,))
        attended = layer.attention.output.LayerNorm(layer.attention.output.dense(context) + states)
        inner = layer.intermediate.intermediate_act_fn(layer.intermediate.dense(attended))
        return layer.output.LayerNorm(layer.output.dense(inner) + attended)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        model = self.model
        if self.word_table is not None:
            states = model.encoder.embeddings(inputs_embeds=self.word_table(input_ids))
        else:
            states = model.encoder.embeddings(input_ids=input_ids)
        mask = additive_mask(attention_mask, states.dtype)
        tapped = states
        for index, layer in enumerate(model.encoder.encoder.layer):
            if isinstance(model.head, MeanFeatureHead) and index == model.head.tap:
                tapped = states
            states = self.layer(layer, states, mask)
        if isinstance(model.head, MeanFeatureHead):
            return model.head(states, attention_mask, tapped)
        return model.head(states, attention_mask)


def export_fp32(model: TextClassifier, path: Path, pad_id: int) -> None:
    """Trace the classifier to one self-contained ONNX file with dynamic batch and sequence axes."""
    wrapper = _ExportWrapper(model).eval()  # eval() on the wrapper too: dropout off in the trace
    ids = torch.tensor([[0, 5, 6, 7, 2], [0, 8, 2, pad_id, pad_id]], dtype=torch.long)
    mask = (ids != pad_id).long()
    with torch.no_grad():
        drift = (wrapper(ids, mask) - model.eval()(ids, mask)).abs().max().item()
    if drift > 1e-4:  # the spelled-out layers must compute what the trained model computes
        raise RuntimeError(f"export wrapper differs from the model by {drift:.2e}")
    trace_to_onnx(wrapper, ids, mask, path)


def fuse_transformer_ops(plain_path: Path, fused_path: Path, num_heads: int, hidden: int, layers: int) -> dict:
    """ONNX Runtime's BERT fusion: Attention, SkipLayerNormalization and BiasGelu contrib ops.

    Only the Python pattern fusion runs (opt_level 0), no session-level optimization, so the
    graph stays portable; the contrib ops have CPU kernels on every architecture ORT supports.
    One Attention op replaces ~100 shape/reshape/transpose nodes per layer, which is most of the
    per-call overhead for short texts. Returns the fused-operator counts.
    """
    from runtime.platform.offline import import_onnxruntime

    import_onnxruntime()  # telemetry off before the submodule loads onnxruntime
    from onnxruntime.transformers.optimizer import optimize_model

    fused = optimize_model(str(plain_path), model_type="bert", num_heads=num_heads, hidden_size=hidden,
                           opt_level=0)
    counts = {op: n for op, n in fused.get_fused_operator_statistics().items() if n}
    if counts.get("Attention", 0) != layers:
        raise RuntimeError(f"attention fusion found {counts.get('Attention', 0)} of {layers} layers: {counts}")
    fused.save_model_to_file(str(fused_path))
    return counts


def store_weights_fp16(model: onnx.ModelProto, min_elements: int = 1024) -> int:
    """Store large float32 initializers as float16 followed by a Cast to float32; returns how many.

    ORT folds the Cast into a float32 constant at session creation, so the graph still computes in
    FP32; only the file holds half-precision weights.
    """
    graph = model.graph
    converted = 0
    casts = []
    for init in list(graph.initializer):
        if init.data_type != TensorProto.FLOAT or int(np.prod(init.dims)) < min_elements:
            continue
        value = numpy_helper.to_array(init)
        half_name = f"{init.name}__fp16"
        graph.initializer.remove(init)
        graph.initializer.append(numpy_helper.from_array(value.astype(np.float16), half_name))
        casts.append(helper.make_node("Cast", [half_name], [init.name], to=TensorProto.FLOAT,
                                      name=f"{init.name}__cast"))
        converted += 1
    for node in reversed(casts):  # Casts first: inputs must precede their consumers
        graph.node.insert(0, node)
    return converted


def shared_tensors(model: onnx.ModelProto) -> list[str]:
    """Names of the initializers that make the frozen word table (packed 4-bit codes and fp16 scales;
    a tiered table's product-quantized codes and codebooks too): the exporters name it `word_table`."""
    names = []
    for init in model.graph.initializer:
        if init.name.startswith("word_table."):
            names.append(init.name)
    return sorted(names)


def export_fp32_graph(model: torch.nn.Module, out_dir: Path, pad_id: int) -> Path:
    """Export the FP32 graph into out_dir as model-fp32.onnx (fp16 storage); returns its path.

    A TextClassifier is traced by `export_fp32`; the conv-attention hybrid (models/training/hybrid.py) by
    models/export/hybrid_export.py; both are fused the same way and stored in the same form. A
    block-quantized word table goes to SHARED_DATA_FILE beside it (the int8 graphs
    models/quantize/int8.py makes from this one reference the same file).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        traced = Path(tmp) / "traced-fp32.onnx"
        plain = Path(tmp) / "plain-fp32.onnx"
        if isinstance(model, TextClassifier):
            export_fp32(model, traced, pad_id)
            config = model.encoder.config
            fuse_transformer_ops(traced, plain, config.num_attention_heads, config.hidden_size,
                                 config.num_hidden_layers)
        else:
            export_hybrid(model, traced, pad_id)
            fuse_hybrid_ops(traced, plain, model)
        graph = onnx.load(str(plain))
    store_weights_fp16(graph)
    names = shared_tensors(graph)
    if names:
        layout = write_shared_data(graph, names, out_dir / SHARED_DATA_FILE)
        point_to_shared_data(graph, layout, SHARED_DATA_FILE)
    path = out_dir / FP32_GRAPH
    onnx.save(graph, str(path))
    return path
