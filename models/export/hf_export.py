"""A transformers classifier → the package's FP32 ONNX graph (float32 weights, word table shared).

The graph is traced as it is (transformers' own forward), fused into ONNX Runtime's BERT ops
when every layer fuses (a speed-up; the unfused graph is kept otherwise), and its word table
moves to the shared external-data file so the int8 variants reference it instead of holding a
copy (a 250k-piece table is 384 MB in float32).
"""

from __future__ import annotations

import gc
import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from models.data.hf_folder import HfFolder
from models.export.fp32 import FP32_GRAPH
from models.export.graph_data import (
    SHARED_DATA_FILE,
    point_to_shared_data_tensor,
    write_shared_data,
)
from models.export.trace import OPSET
from models.progress import log


class _LogitsOnly(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if getattr(self.model.config, "type_vocab_size", 0):
            # explicit zeros: BERT's own buffered token type ids trace with the tracing batch size
            # baked in (an Expand that fails on any other batch size)
            return self.model(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=torch.zeros_like(input_ids)).logits
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits


def _trace(model: torch.nn.Module, path: Path, pad_id: int) -> None:
    ids = torch.tensor([[0, 5, 6, 7, 2], [0, 8, 2, pad_id, pad_id]], dtype=torch.long)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.long)
    # the tracer warns about every Python branch of transformers' forward; the graph is checked
    # against transformers' own outputs afterwards (publish.evaluate), which is what counts
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_LogitsOnly(model).eval(), (ids, mask), str(path), dynamo=False, opset_version=OPSET,
                          input_names=["input_ids", "attention_mask"], output_names=["logits"],
                          dynamic_axes={"input_ids": {0: "batch", 1: "seq"},
                                        "attention_mask": {0: "batch", 1: "seq"}, "logits": {0: "batch"}},
                          do_constant_folding=True)


def _word_table_out(model: onnx.ModelProto, vocab_rows: int, data_file: Path) -> tuple[str, onnx.TensorProto] | None:
    """Move the word-embedding table (the one [vocab_rows, hidden] initializer) into `data_file` and
    leave a small zero stand-in of the same width in the graph; returns (name, the reference to put
    back), or None (table kept inline) when it is not found."""
    names = [init.name for init in model.graph.initializer
             if len(init.dims) == 2 and vocab_rows and init.dims[0] == vocab_rows]
    if len(names) != 1:
        log(f"import: word table not found among the initializers ({len(names)} candidates); kept inline")
        return None
    layout = write_shared_data(model, names, data_file)
    table = next(init for init in model.graph.initializer if init.name == names[0])
    reference = onnx.TensorProto()
    reference.CopyFrom(table)
    point_to_shared_data_tensor(reference, layout[names[0]], data_file.name)
    # ORT's fusion reads the table only for its shape checks; what it copies (several times: the
    # model, its shape-inference copy, the serialised result) is then ~90 MB instead of ~470 MB
    stand_in = numpy_helper.from_array(np.zeros((2, table.dims[1]), dtype=np.float32), names[0])
    table.CopyFrom(stand_in)
    return names[0], reference


def _put_back(model: onnx.ModelProto, moved: tuple[str, onnx.TensorProto] | None) -> None:
    if moved is not None:
        name, reference = moved
        next(init for init in model.graph.initializer if init.name == name).CopyFrom(reference)


def _fuse(model: onnx.ModelProto, folder: HfFolder) -> tuple[onnx.ModelProto, dict]:
    """ORT's BERT fusion when it matches every layer; (model, {}) unchanged otherwise."""
    from runtime.platform.offline import import_onnxruntime

    import_onnxruntime()  # telemetry off before the submodule loads onnxruntime
    from onnxruntime.transformers.optimizer import optimize_model

    layers = folder.size("num_hidden_layers", "n_layers")
    try:
        optimized = optimize_model(model, model_type="bert", num_heads=folder.size("num_attention_heads", "n_heads"),
                                   hidden_size=folder.size("hidden_size", "dim"), opt_level=0)
    except Exception as exc:  # noqa: BLE001 — fusion is a speed-up; the plain graph is correct
        log(f"import: fusion skipped ({type(exc).__name__}: {exc})")
        return model, {}
    counts = {op: n for op, n in optimized.get_fused_operator_statistics().items() if n}
    if counts.get("Attention", 0) != layers:
        log(f"import: attention fusion matched {counts.get('Attention', 0)} of {layers} layers; keeping the unfused graph")
        return model, {}
    optimized.topological_sort()
    fused = optimized.model
    if not any(opset.domain == "com.microsoft" for opset in fused.opset_import):  # what its own save adds
        fused.opset_import.add(domain="com.microsoft", version=1)
    return fused, counts


def export_hf_fp32(holder: list, folder: HfFolder, out_dir: Path) -> tuple[str, tuple[str, ...], dict]:
    """model-fp32.onnx (+ the shared word table) in out_dir from the torch model in `holder` (taken
    out and freed once traced: fusion and the table move need the memory); returns the graph's file
    name, its data files and the fused-operator counts. The word table (float32, as it was) goes
    to SHARED_DATA_FILE before the fusion, so no step after the trace holds a copy of it."""
    with tempfile.TemporaryDirectory(prefix="decide-import-") as tmp:
        traced = Path(tmp) / "traced.onnx"
        model = holder.pop()
        _trace(model, traced, int(model.config.pad_token_id if model.config.pad_token_id is not None else 0))
        del model
        gc.collect()
        onnx.checker.check_model(str(traced))
        graph = onnx.load(str(traced))
    moved = _word_table_out(graph, folder.size("vocab_size"), out_dir / SHARED_DATA_FILE)
    graph, fusion = _fuse(graph, folder)
    _put_back(graph, moved)
    onnx.save(graph, str(out_dir / FP32_GRAPH))
    return FP32_GRAPH, (SHARED_DATA_FILE,) if moved is not None else (), fusion
