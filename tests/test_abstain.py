"""Abstention: an answer the model cannot stand behind says so, with its reason (runtime/package/abstain.py).

Requests go in through the Service as a transport hands them over; the tiny scoped package has
a negative label `other` and a novelty output, the plain one has neither.
"""

from __future__ import annotations

import json
import shutil

import pytest
from fixtures import tiny_package

from runtime.engine.engine import Engine
from runtime.engine.text import unknown_share
from runtime.package.abstain import AbstentionPolicy, decide
from runtime.package.load import MANIFEST_NAME, PackageError, load_package
from runtime.serve.service import Service


def answers(package_dir, *texts, min_score=None, variant="fp32"):
    service = Service(Engine(load_package(package_dir), variant), min_score=min_score)
    lines = [json.dumps({"id": i, "text": text}).encode() for i, text in enumerate(texts)]
    return [json.loads(line) for line in service.answer_lines(lines)], service


@pytest.mark.parametrize("variant", ["fp32", "int8-u8u8"])
def test_each_reason_comes_back_with_what_the_model_leaned_to(tiny_scoped_package_dir, variant):
    (case, negative, novel, unreadable, low), service = answers(
        tiny_scoped_package_dir, "rain and wind", "hello and thanks for the lunch", "the a is and",
        "rain zzkq wqxx qqqq", "rain goal", min_score=0.9, variant=variant)
    assert (case["label"], case["leaning"], case["abstained"], case["reason"]) == ("weather", "weather", False, None)
    assert (negative["label"], negative["reason"]) == (None, "out_of_scope")
    assert negative["scores"]["other"] > 0.9 and negative["leaning"] in tiny_package.LABELS
    assert (novel["label"], novel["reason"]) == (None, "out_of_scope")  # no word it knows: novelty -0.1 > -1
    assert (unreadable["label"], unreadable["leaning"], unreadable["reason"]) == (None, "weather", "unreadable")
    assert (low["label"], low["reason"]) == (None, "low_score") and low["score"] < 0.9
    assert all(a["abstained"] == (a["reason"] is not None) for a in (case, negative, novel, unreadable, low))
    assert json.loads(service.answer_lines([b'{"op": "stats"}'])[0])["abstained"] == {
        "unreadable": 1, "out_of_scope": 2, "low_score": 1}


def test_info_shows_the_policy(tiny_scoped_package_dir):
    _, service = answers(tiny_scoped_package_dir, "rain", min_score=0.6)
    info = json.loads(service.answer_lines([b'{"op": "info"}'])[0])
    assert info["abstention"] == {"negative_labels": ["other"], "max_unknown_share": 0.5,
                                  "novelty_threshold": tiny_package.NOVELTY_THRESHOLD, "min_score": 0.6,
                                  "negative_margin": 0.0, "reasons": ["unreadable", "out_of_scope", "low_score"]}


def test_a_package_without_the_section_still_flags_unreadable_text(tiny_package_dir):
    (readable, unreadable, nothing), _ = answers(tiny_package_dir, "rain and sun", "sun qqqq wwww zzzz", "\u200b")
    assert (readable["label"], readable["reason"]) == ("weather", None)
    assert (unreadable["label"], unreadable["leaning"], unreadable["reason"]) == (None, "weather", "unreadable")
    assert nothing["reason"] == "unreadable"  # nothing the tokenizer could read at all


def test_the_unknown_share_counts_characters_not_tokens():
    text = "pump ᏣᎳᎩᎦᏬᏂᎯᏍᏗ"  # 4 known characters, 9 unknown in one unknown token
    ids, offsets, special = [7, 1], [(0, 4), (5, 14)], [0, 0]
    assert unknown_share(text, ids, offsets, special, unk_id=1) == pytest.approx(9 / 13)
    assert unknown_share(text, ids, offsets, special, unk_id=None) == 0.0
    assert unknown_share("", [2, 3], [(0, 0), (0, 0)], [1, 1], unk_id=1) == 1.0


def test_decide_orders_the_reasons():
    policy = AbstentionPolicy(labels=("a", "b", "none"), negative_labels=frozenset({"none"}),
                              max_unknown_share=0.5, novelty_threshold=2.0, min_score=0.8)
    assert decide([0.1, 0.2, 0.7], policy, unknown_share=0.9).reason == "unreadable"
    assert decide([0.1, 0.2, 0.7], policy).reason == "out_of_scope"
    negative = decide([0.1, 0.2, 0.7], policy)
    assert (negative.leaning, negative.score) == ("b", 0.2)
    assert decide([0.9, 0.05, 0.05], policy, novelty=2.5).reason == "out_of_scope"
    assert decide([0.7, 0.25, 0.05], policy, novelty=1.0).reason == "low_score"
    assert decide([0.9, 0.05, 0.05], policy, novelty=1.0).label == "a"


def test_a_negative_margin_lets_a_case_through_that_leans_to_not_a_case_only_a_little():
    # log p(none) − log p(best case) must exceed the margin for the negative label to flag
    policy = AbstentionPolicy(labels=("a", "b", "none"), negative_labels=frozenset({"none"}), negative_margin=1.0)
    slight = decide([0.35, 0.05, 0.6], policy)  # log(0.6 / 0.35) = 0.54 ≤ 1
    assert (slight.label, slight.reason) == ("a", None)
    clear = decide([0.1, 0.05, 0.85], policy)  # log(8.5) = 2.14 > 1
    assert (clear.label, clear.leaning, clear.reason) == (None, "a", "out_of_scope")
    stricter = AbstentionPolicy(labels=("a", "b", "none"), negative_labels=frozenset({"none"}), negative_margin=-1.0)
    assert decide([0.6, 0.05, 0.35], stricter).reason == "out_of_scope"  # log(0.35 / 0.6) = −0.54 > −1
    argmax = AbstentionPolicy(labels=("a", "b", "none"), negative_labels=frozenset({"none"}))
    assert decide([0.35, 0.05, 0.6], argmax).reason == "out_of_scope"  # margin 0: the top class decides


def test_the_margin_is_read_from_the_manifest(tiny_scoped_package_dir, tmp_path):
    manifest = json.loads((tiny_scoped_package_dir / MANIFEST_NAME).read_text())
    package = load_package(_with_abstention(tiny_scoped_package_dir, tmp_path,
                                            {**manifest["abstention"], "negative_margin": 1.5}))
    assert package.manifest.abstention_policy("fp32").negative_margin == 1.5


def _with_abstention(source, tmp_path, section):
    copy = tmp_path / "package"
    shutil.copytree(source, copy)
    path = copy / MANIFEST_NAME
    data = json.loads(path.read_text())
    data["abstention"] = section
    path.write_text(json.dumps(data))
    return copy


@pytest.mark.parametrize("section, field", [
    ({"negative_labels": ["nope"]}, "abstention.negative_labels"),
    ({"negative_labels": ["weather", "sports", "tech"]}, "abstention.negative_labels"),
    ({"max_unknown_share": 0}, "abstention.max_unknown_share"),
    ({"max_unknown_share": "0.5"}, "abstention.max_unknown_share"),
    ({"negative_margin": "1"}, "abstention.negative_margin"),
    ({"negative_margin": 50}, "abstention.negative_margin"),
    ({"novelty": {"output": "logits", "thresholds": {}}}, "abstention.novelty.output"),
    ({"novelty": {"output": "novelty", "thresholds": {"fp32": 1.0}}}, "abstention.novelty.thresholds"),
    ("all", "abstention"),
])
def test_a_malformed_abstention_section_is_a_package_error(tiny_package_dir, tmp_path, section, field):
    with pytest.raises(PackageError, match=field.replace(".", r"\.")):
        load_package(_with_abstention(tiny_package_dir, tmp_path, section))


def test_a_novelty_output_the_graph_lacks_is_refused(tiny_package_dir, tmp_path):
    copy = _with_abstention(tiny_package_dir, tmp_path,
                            {"novelty": {"output": "novelty", "thresholds": {"fp32": 1.0, "int8-u8u8": 1.0}}})
    with pytest.raises(PackageError, match="not an output of the graph"):
        Engine(load_package(copy), "fp32")
