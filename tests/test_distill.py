"""Feature distillation (models/training/distill.py): the MeanFeatureHead classifier trains, exports and caches as claimed."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from transformers import BertConfig, BertModel

from models.data.recipes import DistillConfig
from models.training.classifier import MeanFeatureHead, TextClassifier
from models.training.distill import cached_teacher_features, distill, fit_linear, student_features

PAD = 1


def tiny_student(seed: int = 0) -> TextClassifier:
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, pad_token_id=PAD)
    config._attn_implementation = "eager"
    model = TextClassifier(BertModel(config, add_pooling_layer=False), 3)
    model.head = MeanFeatureHead(32, 3, tap=1)
    return model.eval()


def sequences(count: int, rng: np.random.Generator) -> list[list[int]]:
    return [[0] + rng.integers(5, 50, size=rng.integers(2, 9)).tolist() + [2] for _ in range(count)]


def test_features_are_two_unit_halves_and_logits_are_the_linear_of_them():
    model = tiny_student()
    seqs = sequences(5, np.random.default_rng(0))
    feats = student_features(model, seqs, PAD)
    assert feats.shape == (5, 64)
    assert np.allclose(np.linalg.norm(feats[:, :32], axis=1), 1 / np.sqrt(2), atol=1e-5)
    assert np.allclose(np.linalg.norm(feats, axis=1), 1.0, atol=1e-5)
    ids = torch.tensor([seqs[0]])
    logits = model(ids, torch.ones_like(ids)).detach().numpy()
    w, b = model.head.linear.weight.detach().numpy(), model.head.linear.bias.detach().numpy()
    assert np.allclose(logits, feats[:1] @ w.T + b, atol=1e-5)


def test_distillation_moves_student_features_towards_the_teacher():
    rng = np.random.default_rng(1)
    model = tiny_student()
    seqs = sequences(64, rng)
    target = student_features(tiny_student(seed=7), seqs, PAD)  # another network's features: reachable
    labels = target[:, :3].argmax(1)
    head = fit_linear(target, labels, 3, 1e-4)
    before = (student_features(model, seqs, PAD) * target).sum(1).mean()
    labelled = {"train": seqs, "y_train": labels, "val": [], "y_val": np.array([])}
    distill(model, seqs, target, head, labelled, 3, DistillConfig(epochs=6, batch_size=16, lr=3e-3), PAD)
    after = (student_features(model, seqs, PAD) * target).sum(1).mean()
    assert after > before + 0.05


def test_exported_graph_computes_what_torch_does(tmp_path):
    import onnxruntime as ort

    from models.export.fp32 import export_fp32_graph

    model = tiny_student()
    seqs = sequences(6, np.random.default_rng(2))
    session = ort.InferenceSession(str(export_fp32_graph(model, tmp_path, PAD)), providers=["CPUExecutionProvider"])
    onnx_logits = np.concatenate([session.run(["logits"], {"input_ids": np.array([s]),
                                                           "attention_mask": np.ones((1, len(s)), dtype=np.int64)})[0]
                                  for s in seqs])
    torch_logits = np.stack([model(torch.tensor([s]), torch.ones(1, len(s), dtype=torch.long))[0].detach().numpy()
                             for s in seqs])
    assert np.abs(onnx_logits - torch_logits).max() < 1e-2  # weights stored fp16


def test_teacher_features_are_cached_per_text(tmp_path, monkeypatch):
    monkeypatch.setenv("DECIDE_FACTORY_CACHE", str(tmp_path))
    import models.training.distill as distill_module

    calls = []

    def fake_features(encoder, tokenizer, texts, pad_id, batch_size=64, name=""):
        calls.append(list(texts))
        return np.array([[len(t), 1.0] for t in texts], dtype=np.float32)

    monkeypatch.setattr(distill_module, "teacher_features", fake_features)
    first = cached_teacher_features(lambda: None, None, ["ab", "abc"], PAD)
    second = cached_teacher_features(lambda: None, None, ["abc", "x", "ab"], PAD)
    assert calls == [["ab", "abc"], ["x"]]  # only the new text is computed
    assert first[:, 0].tolist() == [2, 3] and second[:, 0].tolist() == [3, 1, 2]


def test_a_student_with_a_narrower_feed_forward_keeps_its_strongest_neurons_and_exports(tmp_path):
    import onnxruntime as ort

    from models.export.fp32 import export_fp32_graph
    from models.training.classifier import prune_ffn

    model = tiny_student()
    layer = model.encoder.encoder.layer[0]
    importance = layer.intermediate.dense.weight.norm(dim=1) * layer.output.dense.weight.norm(dim=0)
    strongest = sorted(torch.topk(importance, 16).indices.tolist())
    expected = layer.intermediate.dense.weight.detach()[strongest].clone()
    prune_ffn(model, 16)
    kept = model.encoder.encoder.layer[0].intermediate.dense.weight.detach()
    assert kept.shape == (16, 32) and model.encoder.encoder.layer[1].output.dense.weight.shape == (32, 16)
    assert torch.equal(kept, expected)
    seqs = sequences(4, np.random.default_rng(3))
    session = ort.InferenceSession(str(export_fp32_graph(model, tmp_path, PAD)), providers=["CPUExecutionProvider"])
    for s in seqs:
        ids = np.array([s])
        theirs = session.run(["logits"], {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0]
        ours = model(torch.tensor(ids), torch.ones(1, len(s), dtype=torch.long)).detach().numpy()
        assert np.abs(theirs - ours).max() < 1e-2
