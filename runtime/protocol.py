"""The JSON-lines protocol, independent of any transport.

A request line (bytes) becomes a typed request or an `ErrorReply` value; responses are dicts that
`encode_line` turns into one UTF-8 line. Stdlib only, so it is testable without a model.

Requests:  {"id": <scalar, optional>, "text": "..."}  or  {"id": …, "texts": ["...", …]}
Control:   {"id": …, "op": "health" | "info" | "stats"}
Swap:      {"id": …, "op": "reload", "model": "/absolute/package/dir" (optional)}, {"op": "rollback"}
           (socket service, owner uid only: runtime/serve/swap.py)
Errors:    {"id": …, "error": {"code": "<one of ERROR_CODES>", "message": "..."}}
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runtime.package.abstain import Decision

JsonScalar = str | int | float | bool | None

INVALID_UTF8 = "invalid_utf8"
INVALID_JSON = "invalid_json"
INVALID_REQUEST = "invalid_request"  # not an object, or a field of the wrong type
MISSING_TEXT = "missing_text"
EMPTY_TEXT = "empty_text"
LINE_TOO_LONG = "line_too_long"
TOO_MANY_TEXTS = "too_many_texts"
UNKNOWN_OP = "unknown_op"
INTERNAL_ERROR = "internal_error"  # the model failed on this request; the process keeps serving
BUSY = "busy"  # socket server: request queue or connection limit full; retry later (nothing was run)
FORBIDDEN = "forbidden"  # reload/rollback from a peer that is not the owner, over TCP, or on stdio
SWAP_FAILED = "swap_failed"  # reload/rollback did not happen; the model that served still serves
ERROR_CODES = (
    INVALID_UTF8, INVALID_JSON, INVALID_REQUEST, MISSING_TEXT, EMPTY_TEXT,
    LINE_TOO_LONG, TOO_MANY_TEXTS, UNKNOWN_OP, INTERNAL_ERROR, BUSY, FORBIDDEN, SWAP_FAILED,
)
SWAP_OPS = ("reload", "rollback")
CONTROL_OPS = ("health", "info", "stats", *SWAP_OPS)
MAX_MODEL_PATH_CHARS = 4096

DEFAULT_MAX_LINE_BYTES = 1 << 20
DEFAULT_MAX_TEXTS = 256
DEFAULT_MAX_BATCH = 32  # texts per model call (engine, stdio and socket share it)
MAX_INT_DIGITS = 4300  # Python's own int/str conversion limit (sys.get_int_max_str_digits)

# The one definition of a blank line (no answer): empty, or only the whitespace JSON itself
# allows between tokens (space, tab, CR; LF ends the line). Any other line gets exactly one
# answer: a line of U+3000 or U+001C is not JSON, so it is answered invalid_json, never
# skipped (a client waiting for its answer would wait forever).
JSON_WHITESPACE = " \t\r"


def is_blank(text: str) -> bool:
    """True for a line that gets no answer (see JSON_WHITESPACE)."""
    return not text.strip(JSON_WHITESPACE)


@dataclass(frozen=True)
class Limits:
    """Per-line limits the protocol enforces."""

    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    max_texts: int = DEFAULT_MAX_TEXTS  # per {"texts": [...]} request

    def to_json(self) -> dict[str, int]:
        """JSON form for the ready event and the info op."""
        return {"max_line_bytes": self.max_line_bytes, "max_texts": self.max_texts}


@dataclass(frozen=True)
class LineTooLong:
    """What a transport hands over instead of a line longer than the limit (already discarded)."""

    length: int


@dataclass(frozen=True)
class ClassifyRequest:
    """Texts to classify; `single` = sent as "text" (answer with one result, not a list).
    `clipped[i]` is True when the Service cut texts[i] to the model's character budget on
    arrival (runtime.engine.text.max_text_chars); empty = nothing was cut."""

    id: JsonScalar
    texts: tuple[str, ...]
    single: bool
    clipped: tuple[bool, ...] = ()


@dataclass(frozen=True)
class ControlRequest:
    """A control operation: health, info, stats, or a swap op (reload, rollback)."""

    id: JsonScalar
    op: str
    model: str | None = None  # reload: the package directory (absolute); None = the one served


@dataclass(frozen=True)
class ErrorReply:
    """A request that cannot be served; answered as an error line."""

    id: JsonScalar
    code: str
    message: str

    def to_json(self) -> dict[str, Any]:
        """The error response object."""
        return {"id": self.id, "error": {"code": self.code, "message": self.message}}


Request = ClassifyRequest | ControlRequest | ErrorReply


def _is_scalar(value: Any) -> bool:
    """JSON scalars allowed as ids (finite numbers only: NaN is not JSON; no lone surrogates)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str):
        return _encodable(value)
    return value is None or isinstance(value, (int, bool))


def _encodable(text: str) -> bool:
    """False for strings with lone surrogates ("\\ud800" is valid JSON but not valid Unicode text)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse_line(line: bytes | LineTooLong, limits: Limits = Limits()) -> Request | None:
    """Turn one request line into a request or an ErrorReply; None for a blank line (skipped)."""
    if isinstance(line, LineTooLong):
        return ErrorReply(
            None, LINE_TOO_LONG, f"line of {line.length} bytes exceeds the limit of {limits.max_line_bytes}"
        )
    if len(line) > limits.max_line_bytes:
        return ErrorReply(
            None, LINE_TOO_LONG, f"line of {len(line)} bytes exceeds the limit of {limits.max_line_bytes}"
        )
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return ErrorReply(None, INVALID_UTF8, f"line is not valid UTF-8 (byte {exc.start})")
    text = text.removeprefix("\ufeff")  # a UTF-8 byte order mark (files saved by some Windows editors) is not data
    if is_blank(text):
        return None
    try:
        data = json.loads(text, parse_constant=_reject_constant, parse_int=_parse_int)
    except RecursionError:  # json's C scanner recurses per nesting level (~1,000 levels)
        return ErrorReply(None, INVALID_JSON, "JSON nested too deeply for this parser")
    except ValueError as exc:  # JSONDecodeError, NaN/Infinity, integers too long
        return ErrorReply(None, INVALID_JSON, f"invalid JSON: {exc}")
    if not isinstance(data, dict):
        return ErrorReply(None, INVALID_REQUEST, "a request must be a JSON object")
    request_id = data.get("id")
    if not _is_scalar(request_id):
        return ErrorReply(None, INVALID_REQUEST, "id must be a JSON scalar (string, number, bool, null)")
    return _parse_object(data, request_id, limits)


def _parse_int(digits: str) -> int:
    """int() with a plain message for integers beyond Python's conversion limit."""
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"integer of {len(digits.lstrip('-'))} digits is too large "
                         f"(at most {MAX_INT_DIGITS} digits)")
    return int(digits)


def _reject_constant(name: str) -> Any:
    """json.loads accepts NaN/Infinity by default; they are not JSON."""
    raise ValueError(f"{name} is not valid JSON")


def _parse_object(data: dict[str, Any], request_id: JsonScalar, limits: Limits) -> Request:
    """Validate the fields of a request object."""
    if "op" in data:
        op = data["op"]
        if not isinstance(op, str):
            return ErrorReply(request_id, INVALID_REQUEST, "op must be a string")
        if op not in CONTROL_OPS:
            return ErrorReply(request_id, UNKNOWN_OP, f"unknown op {op!r} (ops: {', '.join(CONTROL_OPS)})")
        model = data.get("model") if op == "reload" else None
        if model is not None and not (isinstance(model, str) and model.startswith("/") and "\0" not in model
                                      and len(model) <= MAX_MODEL_PATH_CHARS and _encodable(model)):
            return ErrorReply(request_id, INVALID_REQUEST, "model must be an absolute path to a package directory")
        return ControlRequest(request_id, op, model)
    has_text, has_texts = "text" in data, "texts" in data
    if has_text and has_texts:
        return ErrorReply(request_id, INVALID_REQUEST, 'send either "text" or "texts", not both')
    if not has_text and not has_texts:
        return ErrorReply(request_id, MISSING_TEXT, 'request has no "text" (or "texts")')
    if has_text:
        text = data["text"]
        if not isinstance(text, str) or not _encodable(text):
            return ErrorReply(request_id, INVALID_REQUEST, "text must be a string of valid Unicode")
        if not text.strip():
            return ErrorReply(request_id, EMPTY_TEXT, "text is empty")
        return ClassifyRequest(request_id, (text,), single=True)
    texts = data["texts"]
    if not isinstance(texts, list):
        return ErrorReply(request_id, INVALID_REQUEST, "texts must be a list of strings")
    if not texts:
        return ErrorReply(request_id, EMPTY_TEXT, "texts is an empty list")
    if len(texts) > limits.max_texts:
        return ErrorReply(
            request_id, TOO_MANY_TEXTS, f"{len(texts)} texts exceed the limit of {limits.max_texts} per request"
        )
    for index, text in enumerate(texts):
        if not isinstance(text, str) or not _encodable(text):
            return ErrorReply(request_id, INVALID_REQUEST, f"texts[{index}] must be a string of valid Unicode")
        if not text.strip():
            return ErrorReply(request_id, EMPTY_TEXT, f"texts[{index}] is empty")
    return ClassifyRequest(request_id, tuple(texts), single=False)


def result_json(decision: Decision, probs: tuple[float, ...], labels: tuple[str, ...],
                truncated: bool) -> dict[str, Any]:
    """One text's result: the decision (label, null when abstained), the case label the model
    leans to and its calibrated score, every class probability, why it abstained, truncation."""
    return {
        "label": decision.label,
        "leaning": decision.leaning,
        "score": round(decision.score, 6),
        "scores": {name: round(p, 6) for name, p in zip(labels, probs)},
        "abstained": decision.abstained,
        "reason": decision.reason,
        "truncated": truncated,
    }


_RESPONSE_ENCODER = json.JSONEncoder(ensure_ascii=False)  # one instance: json.dumps builds one per call


def encode_line(response: dict[str, Any]) -> bytes:
    """One response as a UTF-8 JSON line (non-ASCII kept as is, newline-terminated)."""
    return _RESPONSE_ENCODER.encode(response).encode("utf-8") + b"\n"
