"""The PyTorch contender's model, rebuilt from a package's own FP32 graph: the same weights as decide.

The package stores no PyTorch checkpoint, and retraining one (`python -m models train --recipe`) is slow
and need not reproduce the published weights bit for bit. Its FP32 graph holds every weight
(fp16-stored, cast to FP32 at load, as ORT does), so models.training.classifier's student architecture
(BertModel + pooled or mean-feature head + block-quantized word table) is filled from it: PyTorch then computes
what the ONNX graph computes, and any speed difference is the runtime's, not the weights'.

Fused contrib ops map back to the modules they replaced: Attention's packed QKV weight
[hidden, 3·hidden] splits into query/key/value, each MatMul weight [in, out] is a transposed
nn.Linear weight, SkipLayerNormalization/BiasGelu carry the LayerNorm parameters and biases.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
from transformers import BertConfig, BertModel

from models.training.classifier import BlockQuantizedEmbedding, MeanFeatureHead, TextClassifier
from runtime.package.load import Package

if TYPE_CHECKING:  # onnx is imported only to rebuild a model, not by the benchmark's torch worker
    import onnx

FP16_SUFFIX = "__fp16"  # models.export.fp32.store_weights_fp16's initializer names


def _weights(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """Initializers by the name the graph uses them under (fp16-stored ones cast back to float32)."""
    from onnx import numpy_helper

    out = {}
    for init in graph.initializer:
        value = numpy_helper.to_array(init)
        if init.name.endswith(FP16_SUFFIX):
            out[init.name[: -len(FP16_SUFFIX)]] = value.astype(np.float32)
        else:
            out[init.name] = value
    return out


def _attribute(node: onnx.NodeProto, name: str) -> float | int:
    import onnx

    return next(onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name)


def torch_classifier(package: Package, variant: str = "fp32") -> TextClassifier:
    """models.training.classifier.TextClassifier (eval mode) holding the weights of the package's FP32 graph."""
    import onnx

    path = package.path(package.manifest.variants[variant].file)
    graph = onnx.load(str(path)).graph  # resolves embeddings.bin next to it
    weights = _weights(graph)
    from models.publish.novelty import (
        PREFIX,  # the novelty score's part of the graph is not the model
    )

    nodes = [n for n in graph.node if n.op_type in ("Attention", "MatMul", "SkipLayerNormalization", "BiasGelu")
             and not any(out.startswith(PREFIX) for out in n.output)]
    attention = [n for n in nodes if n.op_type == "Attention"]
    matmuls = [n for n in nodes if n.op_type == "MatMul"]
    norms = [n for n in nodes if n.op_type == "SkipLayerNormalization"]
    gelus = [n for n in nodes if n.op_type == "BiasGelu"]
    layers = len(attention)
    if not layers or len(matmuls) != 3 * layers or len(norms) != 2 * layers or len(gelus) != layers:
        raise ValueError(f"{path.name}: not the fused 4-op-per-layer BERT graph models/export/fp32.py writes")

    prefix = "model.encoder.embeddings."
    hidden = weights[f"{prefix}LayerNorm.weight"].shape[0]
    config = BertConfig(
        vocab_size=package.manifest.pad_id + 1,  # word rows come from the block-quantized table
        hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=int(_attribute(attention[0], "num_heads")),
        intermediate_size=weights[matmuls[1].input[1]].shape[1],
        max_position_embeddings=weights[f"{prefix}position_embeddings.weight"].shape[0],
        type_vocab_size=weights[f"{prefix}token_type_embeddings.weight"].shape[0],
        layer_norm_eps=float(_attribute(norms[0], "epsilon")), hidden_act="gelu",
        pad_token_id=package.manifest.pad_id,
    )
    encoder = BertModel(config, add_pooling_layer=False)
    state = {f"embeddings.{k[len(prefix):]}": v for k, v in weights.items() if k.startswith(prefix)}
    state["embeddings.word_embeddings.weight"] = np.zeros((config.vocab_size, hidden), np.float32)
    for i in range(layers):
        layer = f"encoder.layer.{i}."
        qkv_w, qkv_b = weights[attention[i].input[1]], weights[attention[i].input[2]]
        for j, name in enumerate(("query", "key", "value")):
            state[f"{layer}attention.self.{name}.weight"] = qkv_w[:, j * hidden:(j + 1) * hidden].T
            state[f"{layer}attention.self.{name}.bias"] = qkv_b[j * hidden:(j + 1) * hidden]
        for matmul, norm, target in ((matmuls[3 * i], norms[2 * i], "attention.output"),
                                     (matmuls[3 * i + 2], norms[2 * i + 1], "output")):
            state[f"{layer}{target}.dense.weight"] = weights[matmul.input[1]].T
            state[f"{layer}{target}.LayerNorm.weight"] = weights[norm.input[2]]
            state[f"{layer}{target}.LayerNorm.bias"] = weights[norm.input[3]]
            state[f"{layer}{target}.dense.bias"] = weights[norm.input[4]]
        state[f"{layer}intermediate.dense.weight"] = weights[matmuls[3 * i + 1].input[1]].T
        state[f"{layer}intermediate.dense.bias"] = weights[gelus[i].input[1]]
    encoder.load_state_dict({k: torch.tensor(v) for k, v in state.items()}, strict=True)

    model = TextClassifier(encoder, len(package.manifest.labels), _word_table(weights))
    if "model.head.linear.weight" in weights:  # feature-distilled: mean(layer tap) ⊕ mean(last) → linear
        model.head = MeanFeatureHead(hidden, len(package.manifest.labels), _tap(graph, norms))
    head = {k[len("model.head."):]: torch.tensor(v)
            for k, v in weights.items() if k.startswith("model.head.")}
    model.head.load_state_dict(head, strict=True)
    return model.eval()


def _word_table(weights: dict[str, np.ndarray]) -> torch.nn.Module:
    """The frozen word table: block-quantized (one int8 code a value, or two 4-bit codes a byte:
    models.training.classifier.PackedBlockEmbedding, low nibble = even code + 8, high = odd code + 8), or
    tiered (those exact rows + a product-quantized tail, models/training/word_table.py)."""
    if "word_table.exact.packed" in weights:
        from models.training.word_table import ProductQuantizedRows, TieredEmbedding

        exact = _block_table(weights, "word_table.exact.")
        offsets = weights["word_table.tail.offsets"]
        books = weights["word_table.tail.books"].reshape(len(offsets), -1, weights["word_table.tail.books"].shape[1])
        tail = ProductQuantizedRows(torch.tensor(weights["word_table.tail.codes"]), torch.tensor(books))
        return TieredEmbedding(exact, tail, len(exact.codes))
    if "word_table.packed" in weights:
        return _block_table(weights, "word_table.")
    return BlockQuantizedEmbedding(torch.tensor(weights["model.word_embedding.codes"]),
                                   torch.tensor(weights["model.word_embedding.scales"]))


def _block_table(weights: dict[str, np.ndarray], prefix: str) -> BlockQuantizedEmbedding:
    packed = weights[f"{prefix}packed"].astype(np.int16)
    codes = np.empty((packed.shape[0], 2 * packed.shape[1]), np.int16)
    codes[:, 0::2], codes[:, 1::2] = (packed & 15) - 8, (packed >> 4) - 8
    return BlockQuantizedEmbedding(torch.tensor(codes), torch.tensor(weights[f"{prefix}scales"]))


def _tap(graph: onnx.GraphProto, norms: list) -> int:
    """How many layers the head's first mean is taken after: the layer whose output (its second
    SkipLayerNormalization) also feeds the head's masked mean, not only the next layer."""
    consumers: dict[str, set[str]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, set()).add(node.op_type)
    for i in range(len(norms) // 2 - 1):
        if consumers.get(norms[2 * i + 1].output[0], set()) - {"Attention", "SkipLayerNormalization", "MatMul"}:
            return i + 1
    raise ValueError("a mean-feature head, but no layer output feeds it before the last")


def dynamic_int8(model: TextClassifier) -> torch.nn.Module:
    """PyTorch's own int8 for CPU inference: `torch.ao.quantization.quantize_dynamic` on every
    nn.Linear, qint8 weights per output channel (as decide's int8 variants), uint8 activations
    with scales computed per call. Per channel rather than the per-tensor default: on the default
    model's held-out texts it agrees with FP32 on 1775 vs 1758 of 1895 labels at the same speed."""
    import warnings

    from torch.ao.quantization import per_channel_dynamic_qconfig

    with warnings.catch_warnings():  # torch 2.13 flags torch.ao.quantization as deprecated (→ torchao)
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear: per_channel_dynamic_qconfig},
                                                      dtype=torch.qint8)


@torch.inference_mode()
def torch_logits(model: torch.nn.Module, sequences: list[list[int]], pad_id: int, batch_size: int = 32) -> np.ndarray:
    """Logits for every token sequence (batched by length, padded to the longest), in input order."""
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    out = np.zeros((len(sequences), 0), dtype=np.float32)
    for start in range(0, len(order), batch_size):
        index = order[start:start + batch_size]
        width = max(len(sequences[i]) for i in index)
        ids = torch.full((len(index), width), pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, i in enumerate(index):
            ids[row, :len(sequences[i])] = torch.tensor(sequences[i])
            mask[row, :len(sequences[i])] = 1
        logits = model(ids, mask).numpy()
        if out.shape[1] == 0:
            out = np.zeros((len(sequences), logits.shape[1]), dtype=np.float32)
        out[index] = logits
    return out
