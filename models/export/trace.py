"""The one tracer call every student export goes through (fp32.py, hybrid_export.py): the opset and
the input and output names the runtime feeds and reads."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

OPSET = 17


def trace_to_onnx(module: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, path: Path) -> None:
    """The legacy tracer's ONNX graph of `module(ids, mask) -> logits`, batch and sequence axes
    dynamic (the callers check first that the traced module computes what the model does)."""
    with warnings.catch_warnings():  # tracer notes on Python branches; the callers' drift checks count
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module, (ids, mask), str(path), dynamo=False, opset_version=OPSET,
            input_names=["input_ids", "attention_mask"], output_names=["logits"],
            dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
                          "logits": {0: "batch"}},
            do_constant_folding=True,
        )
