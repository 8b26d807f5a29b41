"""ONNX export of the hybrid student (models/training/hybrid.py): tracing and fusion, for models/export/fp32.py's
`export_fp32_graph`, which stores the result in the package's usual form.

Same contract as models/export/fp32.py: inputs input_ids + attention_mask (int64 [batch, seq]), output
`logits`, opset 17, dynamic batch and sequence axes, weights stored fp16 + Cast, the frozen word
table packed 4-bit in the shared embeddings.bin, no session-level optimization baked in. The int8
variants come from this graph through models/quantize/int8.py like any other.

Operators: the depthwise convolutions are ONNX Conv with group = channels (between two
Transposes: the rest of the graph is [batch, seq, hidden]); pointwise projections, gates and
feed-forward layers are MatMul (+ Add), which int8 quantizes; ONNX Runtime's BERT pattern fusion
(`onnxruntime.transformers.optimizer`, opt_level 0) turns every attention block into one
Attention contrib op (the export fails if one does not fuse), LayerNorm after an Add into
SkipLayerNormalization, and MatMul + bias + GELU into BiasGelu.
"""

from __future__ import annotations

from pathlib import Path

import torch

from models.export.trace import trace_to_onnx
from models.training.hybrid import HybridClassifier
from models.training.word_table import graph_form


class _HybridGraph(torch.nn.Module):
    """Positional (input_ids, attention_mask) → logits with the word table packed two codes a byte."""

    def __init__(self, model: HybridClassifier) -> None:
        super().__init__()
        self.model = model
        # named word_table: models.export.fp32.shared_tensors moves `*word_table.packed/scales` to embeddings.bin
        self.word_table = graph_form(model.word_embedding)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model.logits_embedded(self.word_table(input_ids), attention_mask)


def export_hybrid(model: HybridClassifier, path: Path, pad_id: int) -> None:
    """Trace the hybrid to one ONNX file; fails if the traced form differs from the model."""
    graph = _HybridGraph(model).eval()
    model.eval()
    ids = torch.tensor([[0, 5, 6, 7, 2], [0, 8, 2, pad_id, pad_id]], dtype=torch.long)
    mask = (ids != pad_id).long()
    with torch.no_grad():
        drift = (graph(ids, mask) - model(ids, mask)).abs().max().item()
    if drift > 1e-4:
        raise RuntimeError(f"hybrid export wrapper differs from the model by {drift:.2e}")
    trace_to_onnx(graph, ids, mask, path)


def fuse_hybrid_ops(plain_path: Path, fused_path: Path, model: HybridClassifier) -> dict[str, int]:
    """ORT's BERT pattern fusion (portable, opt_level 0); every attention block must become Attention."""
    from runtime.platform.offline import import_onnxruntime

    import_onnxruntime()  # telemetry off before the submodule loads onnxruntime
    from onnxruntime.transformers.optimizer import optimize_model

    hidden = model.embeddings.position_embeddings.embedding_dim
    heads = model.attention_layers[0].attention.self.num_attention_heads  # BertLayer and GatedLayer alike
    fused = optimize_model(str(plain_path), model_type="bert", num_heads=heads, hidden_size=hidden, opt_level=0)
    counts = {op: n for op, n in fused.get_fused_operator_statistics().items() if n}
    if counts.get("Attention", 0) != model.shape.attention_layers:
        raise RuntimeError(f"attention fusion found {counts.get('Attention', 0)} of {model.shape.attention_layers} "
                           f"attention layers: {counts}")
    fused.save_model_to_file(str(fused_path))
    return counts
