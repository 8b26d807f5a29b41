"""A transformers classifier → the package's FP32 ONNX graph (float32 weights, word table shared).

The graph is traced as it is (transformers' own forward), fused into ONNX Runtime's BERT ops
when every layer fuses (a speed-up; the unfused graph is kept otherwise), and its word table
moves to the shared external-data file so the int8 variants reference it instead of holding a
copy (a 250k-piece table is 384 MB in float32).
"""

from __future__ import annotations

import gc
import shutil
import tempfile
import warnings
from pathlib import Path

import onnx
import torch

from models.export import FP32_GRAPH, OPSET
from models.graph_data import SHARED_DATA_FILE, point_to_shared_data, write_shared_data
from models.hf_folder import HfFolder
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


def _fuse(traced: Path, fused: Path, folder: HfFolder) -> dict:
    """ORT's BERT fusion when it matches every layer; {} (and the plain graph kept) otherwise."""
    from onnxruntime.transformers.optimizer import optimize_model

    layers = folder.size("num_hidden_layers", "n_layers")
    try:
        optimized = optimize_model(str(traced), model_type="bert", num_heads=folder.size("num_attention_heads", "n_heads"),
                                   hidden_size=folder.size("hidden_size", "dim"), opt_level=0)
    except Exception as exc:  # noqa: BLE001 — fusion is a speed-up; the plain graph is correct
        log(f"import: fusion skipped ({type(exc).__name__}: {exc})")
        return {}
    counts = {op: n for op, n in optimized.get_fused_operator_statistics().items() if n}
    if counts.get("Attention", 0) != layers:
        log(f"import: attention fusion matched {counts.get('Attention', 0)} of {layers} layers; keeping the unfused graph")
        return {}
    optimized.save_model_to_file(str(fused))
    return counts


def share_word_table(path: Path, vocab_rows: int) -> tuple[str, ...]:
    """Move the word-embedding table (the one [vocab_size, hidden] initializer) out of the graph into
    SHARED_DATA_FILE beside it, float32 as it was; returns the data files (none if not found)."""
    model = onnx.load(str(path))
    names = [init.name for init in model.graph.initializer
             if len(init.dims) == 2 and vocab_rows and init.dims[0] == vocab_rows]
    if len(names) != 1:
        log(f"import: word table not found among the initializers ({len(names)} candidates); kept inline")
        return ()
    layout = write_shared_data(model, names, path.parent / SHARED_DATA_FILE)
    point_to_shared_data(model, layout, SHARED_DATA_FILE)
    onnx.save(model, str(path))
    return (SHARED_DATA_FILE,)


def export_hf_fp32(holder: list, folder: HfFolder, out_dir: Path) -> tuple[str, tuple[str, ...], dict]:
    """model-fp32.onnx (+ the shared word table) in out_dir from the torch model in `holder` (taken
    out and freed once traced: fusion and the table move need the memory); returns the graph's file
    name, its data files and the fused-operator counts."""
    with tempfile.TemporaryDirectory(prefix="decide-import-") as tmp:
        traced = Path(tmp) / "traced.onnx"
        model = holder.pop()
        _trace(model, traced, int(model.config.pad_token_id if model.config.pad_token_id is not None else 0))
        del model
        gc.collect()
        onnx.checker.check_model(str(traced))
        fusion = _fuse(traced, out_dir / FP32_GRAPH, folder)
        if not fusion:
            shutil.copyfile(traced, out_dir / FP32_GRAPH)
    shared = share_word_table(out_dir / FP32_GRAPH, folder.size("vocab_size"))
    return FP32_GRAPH, shared, fusion
