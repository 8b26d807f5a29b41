"""The conv-attention hybrid student (models/training/hybrid.py) and the pooled head (models/training/heads.py): padding never
changes an answer, the ONNX graph computes what torch does with the ops it should, int8 is deterministic."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from transformers import BertConfig

from models.data.student_arch import HybridShape, parse_student_arch, spread_layers
from models.training.classifier import BlockQuantizedEmbedding, MeanFeatureHead
from models.training.hybrid import HybridClassifier

PAD = 1
VOCAB = 60
HIDDEN = 32


def tiny_hybrid(fusion: str = "none", seed: int = 0, kernel: int = 3) -> HybridClassifier:
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=PAD + 1, hidden_size=HIDDEN, num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=32, pad_token_id=PAD)
    config._attn_implementation = "eager"
    table = BlockQuantizedEmbedding(torch.randint(-8, 8, (VOCAB, HIDDEN), dtype=torch.int8),
                                    (torch.rand(VOCAB, HIDDEN // 32) * 0.1 + 0.02).half())
    model = HybridClassifier(config, HybridShape(2, 1, kernel=kernel, conv_ffn=48, fusion=fusion), 3, table)
    for module in model.modules():  # a trained model's convolutions are not zero: give them weights
        if hasattr(module, "pointwise"):
            torch.nn.init.normal_(module.pointwise.weight, std=0.3)
        if hasattr(module, "gate"):
            torch.nn.init.normal_(module.gate.weight, std=0.3)
    return model.eval()


def sequences(count: int, rng: np.random.Generator, low: int = 2, high: int = 12) -> list[list[int]]:
    return [[0] + rng.integers(5, VOCAB, size=rng.integers(low, high)).tolist() + [2] for _ in range(count)]


def padded(seqs: list[list[int]]) -> dict[str, np.ndarray]:
    """The graph's feeds for a right-padded batch."""
    ids = np.full((len(seqs), max(map(len, seqs))), PAD, dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, seq in enumerate(seqs):
        ids[row, : len(seq)], mask[row, : len(seq)] = seq, 1
    return {"input_ids": ids, "attention_mask": mask}


def session_for(path):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def logits_alone_and_padded(model, seqs):
    from models.training.loops import pad_tensors

    alone = np.stack([model(torch.tensor([s]), torch.ones(1, len(s), dtype=torch.long))[0].detach().numpy()
                      for s in seqs])
    ids, mask = pad_tensors(seqs, PAD)
    return alone, model(ids, mask).detach().numpy()


@pytest.mark.parametrize("fusion", ["none", "gated"])
def test_padding_never_changes_the_logits(fusion):
    model = tiny_hybrid(fusion)
    seqs = sequences(6, np.random.default_rng(1)) + [[0] + list(range(5, 25)) + [2]]  # one long text pads the rest
    alone, batched = logits_alone_and_padded(model, seqs)
    assert np.abs(alone - batched).max() < 1e-5


def test_without_the_mask_before_the_convolution_padding_would_leak():
    # the same model with its conv input mask defeated: padded positions (non-zero after LayerNorm)
    # reach the real tokens through the kernel, so the padding test above is not vacuous
    model = tiny_hybrid()

    def unmasked(conv):
        return lambda normed, keep: type(conv).forward(conv, normed, torch.ones_like(keep))

    for layer in model.conv_layers:
        layer.conv.forward = unmasked(layer.conv)
    seqs = sequences(6, np.random.default_rng(1)) + [[0] + list(range(5, 25)) + [2]]
    alone, batched = logits_alone_and_padded(model, seqs)
    assert np.abs(alone - batched).max() > 1e-3


@pytest.mark.parametrize("fusion", ["none", "gated"])
def test_exported_graph_computes_what_torch_does_with_fused_attention_and_depthwise_conv(tmp_path, fusion):
    import onnx

    from models.export.fp32 import export_fp32_graph

    model = tiny_hybrid(fusion)
    seqs = sequences(8, np.random.default_rng(2))
    path = export_fp32_graph(model, tmp_path, PAD)  # the factory's one FP32 exporter dispatches on the student
    assert (tmp_path / "embeddings.bin").is_file()
    graph = onnx.load(str(path), load_external_data=False)
    ops = [n.op_type for n in graph.graph.node]
    assert ops.count("Attention") == 1 and "MultiHeadAttention" not in ops
    convs = [n for n in graph.graph.node if n.op_type == "Conv"]
    assert len(convs) == 2 + (fusion == "gated")
    assert all(next(a.i for a in n.attribute if a.name == "group") == HIDDEN for n in convs)  # depthwise
    alone, _ = logits_alone_and_padded(model, seqs)
    assert np.abs(session_for(path).run(["logits"], padded(seqs))[0] - alone).max() < 1e-2  # fp16 storage


def test_int8_answers_do_not_depend_on_batch_mates(tmp_path):
    import onnx

    from models.export.fp32 import export_fp32_graph
    from models.quantize.int8 import quantize_variants

    model = tiny_hybrid("gated")
    rng = np.random.default_rng(3)
    fp32 = export_fp32_graph(model, tmp_path, PAD)
    calibration = [padded(sequences(8, rng)) for _ in range(4)]
    int8 = quantize_variants(fp32, tmp_path, calibration, ["int8-u8u8", "int8-u8s7"])
    seqs = sequences(7, rng) + [[0] + list(range(5, 30)) + [2]]
    for name, path in int8.items():
        session = session_for(path)
        assert any(n.op_type == "MatMulIntegerToFloat" for n in onnx.load(str(path), load_external_data=False).graph.node)
        batched = session.run(["logits"], padded(seqs))[0]
        alone = np.stack([session.run(["logits"], padded([s]))[0][0] for s in seqs])
        assert np.abs(alone - batched).max() < 1e-4, name
        assert (alone.argmax(1) == batched.argmax(1)).all(), name


def test_pooled_head_learns_and_its_folded_standardisation_is_exact():
    from models.data.recipes import DistillConfig
    from models.training.heads import fit_pooled_head, pool, pooled_inputs

    model = tiny_hybrid()
    rng = np.random.default_rng(4)
    # label = which third of the vocabulary the text's words come from: learnable from pooled states
    seqs, labels = [], []
    for i in range(120):
        label = i % 3
        words = rng.integers(5 + 18 * label, 5 + 18 * (label + 1), size=rng.integers(3, 9)).tolist()
        seqs.append([0] + words + [2])
        labels.append(label)
    y = np.array(labels)
    features = np.eye(3, dtype=np.float32)[y] + rng.normal(0, 0.05, (len(y), 3)).astype(np.float32)
    report = fit_pooled_head(model, seqs[:90], features[:90], y[:90], seqs[90:], y[90:], 3,
                             DistillConfig(seed=13, head_reg=1e-4), PAD)
    assert report["val_accuracy"] > 0.8
    ids = torch.tensor([seqs[95]])
    mask = torch.ones_like(ids)
    pooled = pool(model.encode(ids, mask)[1], mask)
    assert np.allclose(model(ids, mask).detach().numpy(), model.head.mlp(pooled).detach().numpy(), atol=1e-5)
    assert pooled_inputs(model, [seqs[95]], PAD).shape == (1, 3 * HIDDEN)


def test_the_hybrid_trains_towards_teacher_features():
    from models.data.recipes import DistillConfig
    from models.training.distill import distill, fit_linear, student_features

    model = tiny_hybrid()
    assert isinstance(model.head, MeanFeatureHead) and model.head.tap == 2  # tapped after the conv stack
    seqs = sequences(64, np.random.default_rng(5))
    target = student_features(tiny_hybrid(seed=9), seqs, PAD)
    labels = target[:, :3].argmax(1)
    before = (student_features(model, seqs, PAD) * target).sum(1).mean()
    labelled = {"train": seqs, "y_train": labels, "val": [], "y_val": np.array([])}
    distill(model, seqs, target, fit_linear(target, labels, 3, 1e-4), labelled, 3,
            DistillConfig(epochs=6, batch_size=16, lr=3e-3), PAD)
    assert (student_features(model, seqs, PAD) * target).sum(1).mean() > before + 0.05


def test_student_arch_is_checked_and_defaults_spread_over_e5():
    assert spread_layers(4) == (0, 4, 8, 11)  # today's student's layers
    shape = parse_student_arch({"kind": "hybrid", "conv_layers": 3, "attention_layers": 1})
    assert (shape.conv_init, shape.attention_init, shape.kernel, shape.fusion) == ((0, 4, 8), (11,), 5, "none")
    assert parse_student_arch({}) is None and parse_student_arch({"kind": "transformer"}) is None
    bad = {
        "kind": {"kind": "cnn"},
        "conv_layers": {"kind": "hybrid", "conv_layers": 0, "attention_layers": 1},
        "kernel": {"kind": "hybrid", "conv_layers": 1, "attention_layers": 1, "kernel": 4},
        "conv_ffn": {"kind": "hybrid", "conv_layers": 1, "attention_layers": 1, "conv_ffn": 4096},
        "fusion": {"kind": "hybrid", "conv_layers": 1, "attention_layers": 1, "fusion": "sum"},
        "attention_init": {"kind": "hybrid", "conv_layers": 1, "attention_layers": 2, "attention_init": [11]},
        "colour": {"kind": "hybrid", "conv_layers": 1, "attention_layers": 1, "colour": "red"},
    }
    for key, value in bad.items():
        with pytest.raises(ValueError, match=key):
            parse_student_arch(value)


def test_recipes_refuse_a_hybrid_or_head_where_it_cannot_apply():
    from dataclasses import asdict

    from models.data.recipes import load_recipe, recipe_from_dict

    base = asdict(load_recipe("machine-alarms"))
    hybrid = {"kind": "hybrid", "conv_layers": 2, "attention_layers": 1}
    ok = recipe_from_dict({**base, "student_arch": hybrid, "student_layers": None, "head": "pooled-mlp"})
    assert ok.head == "pooled-mlp" and ok.student_arch == hybrid
    # the head is fitted after the cached stage: both heads share the student's checkpoint
    assert ok.fingerprint("student") == recipe_from_dict({**base, "student_arch": hybrid, "student_layers": None}).fingerprint("student")
    assert "student_arch" not in load_recipe("machine-alarms").fingerprint("student")  # old caches stay valid
    for change, words in (({"student_arch": hybrid}, "student_layers to null"),
                          ({"student_arch": hybrid, "student_layers": None, "feature_distill": None}, "feature_distill"),
                          ({"head": "pooled-mlp", "feature_distill": None}, "feature-distilled"),
                          ({"head": "cls"}, "head must be")):
        with pytest.raises(ValueError, match=words):
            recipe_from_dict({**base, **change})
