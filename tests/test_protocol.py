"""The JSON-lines protocol: every error code as a value, and the Service answering in order."""

import json

import pytest

from runtime.engine.engine import Engine
from runtime.package.load import load_package
from runtime.protocol import (
    ClassifyRequest,
    ControlRequest,
    ErrorReply,
    Limits,
    LineTooLong,
    encode_line,
    parse_line,
)
from runtime.serve.service import Service


@pytest.mark.parametrize(
    "line, code",
    [
        (b"{not json", "invalid_json"),
        (b'{"id": 1, "text": NaN}', "invalid_json"),
        (b'\xff\xfe{"text": "x"}', "invalid_utf8"),
        (b'["text"]', "invalid_request"),
        (b'{"id": [1], "text": "x"}', "invalid_request"),
        (b'{"id": 1, "text": 5}', "invalid_request"),
        (b'{"id": 1, "text": "a", "texts": ["b"]}', "invalid_request"),
        (b'{"id": 1, "texts": "abc"}', "invalid_request"),
        (b'{"id": 1, "texts": ["ok", 3]}', "invalid_request"),
        (b'{"id": 1, "text": "\\ud800"}', "invalid_request"),
        (b'{"id": 1}', "missing_text"),
        (b'{"id": 1, "text": "   "}', "empty_text"),
        (b'{"id": 1, "texts": []}', "empty_text"),
        (b'{"id": 1, "texts": ["a", ""]}', "empty_text"),
        (b'{"id": 1, "texts": ["a", "b", "c", "d"]}', "too_many_texts"),
        (b'{"id": 1, "text": "' + b"x" * 200 + b'"}', "line_too_long"),
        (b'{"id": 1, "op": "reboot"}', "unknown_op"),
    ],
)
def test_bad_lines_become_error_values(line, code):
    reply = parse_line(line, Limits(max_line_bytes=100, max_texts=3))
    assert isinstance(reply, ErrorReply) and reply.code == code and reply.message


def test_error_echoes_id_when_it_can_be_read():
    assert parse_line(b'{"id": "abc", "text": ""}').id == "abc"
    assert parse_line(b"{broken").id is None


def test_transport_marker_for_overlong_line():
    reply = parse_line(LineTooLong(5_000_000))
    assert reply.code == "line_too_long" and "5000000" in reply.message


def test_valid_requests_parse():
    assert parse_line('{"id": 7, "text": "Pumpe über"}'.encode()) == ClassifyRequest(7, ("Pumpe über",), True)
    assert parse_line(b'{"texts": ["a", "b"]}') == ClassifyRequest(None, ("a", "b"), False)
    assert parse_line(b'{"id": true, "op": "stats"}') == ControlRequest(True, "stats")
    assert parse_line(b"   ") is None  # blank lines are skipped
    assert parse_line('\ufeff{"id": 1, "text": "x"}'.encode()) == ClassifyRequest(1, ("x",), True)  # BOM


def test_encode_line_is_one_utf8_line():
    line = encode_line({"id": 1, "text": "über\nzeile 雨"})
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line.decode("utf-8"))["text"] == "über\nzeile 雨"


@pytest.fixture(scope="module")
def service(tiny_package_dir):
    engine = Engine(load_package(tiny_package_dir), "fp32")
    engine.warm_up()
    return Service(engine, Limits(max_line_bytes=4096, max_texts=4))


def answer(service, *lines):
    return [json.loads(r) for r in service.answer_lines([l.encode("utf-8") if isinstance(l, str) else l for l in lines])]


def test_service_answers_each_line_in_order_with_ids(service):
    responses = answer(
        service,
        '{"id": "a", "text": "rain and sun"}',
        '{"id": 2, "texts": ["goal", "server pump"]}',
        "{oops",
        '{"id": 4.5, "text": "Pumpe 3: Vibration über Grenzwert"}',
        '{"op": "health", "id": "h"}',
    )
    assert [r["id"] for r in responses] == ["a", 2, None, 4.5, "h"]
    assert responses[0]["label"] == "weather" and responses[0]["variant"] == "fp32"
    assert set(responses[0]["scores"]) == {"weather", "sports", "tech"}
    assert abs(sum(responses[0]["scores"].values()) - 1) < 1e-4
    assert [r["label"] for r in responses[1]["results"]] == ["sports", "tech"]
    assert responses[2]["error"]["code"] == "invalid_json"
    assert responses[3]["label"] == "tech" and responses[3]["truncated"] is False
    assert responses[4] == {"id": "h", "op": "health", "status": "ok"}
    assert all(r["ms"] >= 0 for r in (responses[0], responses[1], responses[3]))


def test_service_keeps_answering_after_each_error_code(service):
    bad = [b"{x", b"\xc3\x28", b"[1]", b'{"id": 1}', b'{"text": ""}', b"{" + b" " * 5000 + b"}",
           b'{"texts": ["a","b","c","d","e"]}', b'{"op": "nope"}']
    for line in bad:
        error, ok = answer(service, line, '{"id": "next", "text": "goal"}')
        assert "error" in error
        assert ok["id"] == "next" and ok["label"] == "sports"


def test_truncated_flag_reaches_the_wire(service):
    (response,) = answer(service, json.dumps({"id": 1, "text": "rain " * 50}))
    assert response["truncated"] is True and response["label"] == "weather"


def test_info_and_stats_ops(service):
    info, stats = answer(service, '{"op": "info"}', '{"op": "stats"}')
    assert info["model"]["labels"] == ["weather", "sports", "tech"]
    assert info["limits"] == {"max_line_bytes": 4096, "max_texts": 4}
    assert stats["requests"] >= 2 and stats["texts"] >= 0 and "errors" in stats


def test_model_failure_is_isolated_to_its_request(service, monkeypatch):
    real_classify = service.engine.classify

    def fragile(texts):
        if any("boom" in t for t in texts):
            raise RuntimeError("model exploded")
        return real_classify(texts)

    monkeypatch.setattr(service.engine, "classify", fragile)
    first, broken, last = answer(service, '{"id": 1, "text": "rain"}', '{"id": 2, "text": "boom"}',
                                 '{"id": 3, "text": "goal"}')
    assert first["label"] == "weather" and last["label"] == "sports"
    assert broken["error"]["code"] == "internal_error" and "model exploded" in broken["error"]["message"]


# -- one bad line, one error line (issue 15) -----------------------------------------------------


def test_any_exception_while_parsing_a_line_becomes_that_lines_error(service, monkeypatch):
    import runtime.serve.service as service_module

    real_parse = service_module.parse_line

    def fragile_parse(line, limits):
        if line == b"explode":
            raise MemoryError("parser ran out of memory")
        if line == b"recurse":
            raise RecursionError("maximum recursion depth exceeded")
        return real_parse(line, limits)

    monkeypatch.setattr(service_module, "parse_line", fragile_parse)
    first, boom, deep, last = answer(service, '{"id": 1, "text": "rain"}', b"explode", b"recurse",
                                     '{"id": 4, "text": "goal"}')
    assert (first["label"], last["label"]) == ("weather", "sports")
    assert boom["error"]["code"] == deep["error"]["code"] == "internal_error"
    assert "MemoryError" in boom["error"]["message"] and "RecursionError" in deep["error"]["message"]


def test_an_answer_that_cannot_be_encoded_becomes_internal_error(service, monkeypatch):
    import runtime.serve.service as service_module

    real_encode = service_module.encode_line

    def fragile_encode(response):
        if response.get("id") == "unwritable":
            raise ValueError("cannot encode")
        return real_encode(response)

    monkeypatch.setattr(service_module, "encode_line", fragile_encode)
    bad, good = answer(service, '{"id": "unwritable", "text": "rain"}', '{"id": 2, "text": "goal"}')
    assert bad["error"]["code"] == "internal_error" and "cannot encode" in bad["error"]["message"]
    assert good["label"] == "sports"


@pytest.mark.parametrize("line, message", [
    (b"[" * 3000, "nested too deeply"),
    (b'{"id": ' + b"1" * 4301 + b"}", "4301 digits is too large (at most 4300 digits)"),
    (b'{"id": -' + b"1" * 5000 + b', "text": "x"}', "5000 digits"),
])
def test_parser_limits_have_plain_messages(line, message):
    reply = parse_line(line)
    assert reply.code == "invalid_json" and message in reply.message


def test_integers_up_to_the_limit_are_fine_ids():
    request = parse_line(b'{"id": ' + b"9" * 4300 + b', "text": "x"}')
    assert isinstance(request, ClassifyRequest) and request.id == int("9" * 4300)


@pytest.mark.parametrize("line, blank", [
    (b"", True), (b"   ", True), (b"\t \r", True), ("\ufeff ".encode(), True),
    ("\u3000".encode(), False), (b"\x1c", False), (b"\x0b", False), ("\u00a0".encode(), False),
    ("\u2028".encode(), False), (b"\x00", False),
])
def test_blank_means_empty_or_json_whitespace_only(line, blank):
    assert (parse_line(line) is None) == blank


def test_over_long_texts_are_cut_before_the_tokenizer_and_say_truncated(service):
    budget = service.max_text_chars
    assert budget == 24 * 32  # max_length × CHARS_PER_TOKEN
    one_long_word = "rain " + "x" * budget  # 2 tokens after the cut: only the cut makes it truncated
    short, cut, many = answer(service, json.dumps({"id": 1, "text": "rain " + "x" * (budget - 5)}),
                              json.dumps({"id": 2, "text": one_long_word}),
                              json.dumps({"id": 3, "texts": ["goal", "y" * 3_000]}))
    # "x…x" is one unknown word: the model still leans to weather, but most of the text is
    # unreadable to it, so it abstains (runtime/package/abstain.py).
    assert (short["truncated"], short["leaning"], short["reason"]) == (False, "weather", "unreadable")
    assert (cut["truncated"], cut["leaning"], cut["reason"]) == (True, "weather", "unreadable")
    assert [r["truncated"] for r in many["results"]] == [False, True]


def test_the_engine_cuts_too_when_called_directly(service):
    (result,) = service.engine.classify(["rain " + "x" * 10_000])
    assert result.truncated and result.label == "weather"
