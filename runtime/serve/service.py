"""The one request core: lines → requests → one engine call → responses, for every transport.

Transports (runtime/serve/stdio.py, runtime/serve/server.py) only move bytes: they split lines
(runtime/serve/framing.py) and hand each line to a `Service`:

- `triage(line)` parses and validates one line and answers at once what needs no model (errors,
  health/info/stats); a classify request comes back for the engine. Whatever goes wrong while
  handling one line becomes an error answer for that line, never an exception.
- `classify(requests)` answers classify requests with one engine call (per-request errors if the
  model fails).
- `answer_lines(lines)` does both for a batch of lines, in order (the stdio path).
- `wire_line(response)` makes the wire line; an answer that cannot be encoded becomes internal_error.

The socket server adds its own state, info and stats through `TransportHooks`; the ops and the
error codes themselves live only here and in runtime/protocol.py.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runtime.engine.classifier import answer
from runtime.package.abstain import REASONS, AbstentionPolicy
from runtime.protocol import (
    FORBIDDEN,
    INTERNAL_ERROR,
    SWAP_OPS,
    ClassifyRequest,
    ControlRequest,
    ErrorReply,
    Limits,
    LineTooLong,
    encode_line,
    parse_line,
)
from runtime.version import __version__

if TYPE_CHECKING:  # the engine imports numpy; the socket server builds a Service before it loads
    from runtime.engine.engine import Classification, Engine

Response = dict[str, Any]
Triaged = Response | ClassifyRequest | None  # answered now / for the engine / blank line
MAX_MESSAGE_CHARS = 300  # an exception's text in an internal_error message is cut to this


def percentile(sorted_values: Sequence[float], fraction: float) -> float | None:
    """Nearest-rank percentile of already sorted values (None when empty)."""
    if not sorted_values:
        return None
    rank = max(1, -(-round(fraction * 1000) * len(sorted_values) // 1000))  # ceil(fraction·n)
    return sorted_values[min(rank, len(sorted_values)) - 1]


@dataclass
class Stats:
    """Counters reported by the stats op. Updated from the transport's thread and the engine's,
    so every update and the snapshot hold the lock."""

    started: float = field(default_factory=time.time)
    requests: int = 0
    texts: int = 0
    engine_calls: int = 0
    engine_ms: float = 0.0
    errors: Counter[str] = field(default_factory=Counter)
    abstained: Counter[str] = field(default_factory=lambda: Counter({reason: 0 for reason in REASONS}))
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, requests: int = 0, texts: int = 0, engine_calls: int = 0, engine_ms: float = 0.0,
            error: str | None = None, abstained: Counter[str] | None = None) -> None:
        """Count some work (thread-safe)."""
        with self.lock:
            self.requests += requests
            self.texts += texts
            self.engine_calls += engine_calls
            self.engine_ms += engine_ms
            if error is not None:
                self.errors[error] += 1
            if abstained:
                self.abstained.update(abstained)

    def to_json(self) -> dict[str, Any]:
        """JSON form for the stats op."""
        with self.lock:
            return {
                "uptime_s": round(time.time() - self.started, 3),
                "requests": self.requests,
                "texts": self.texts,
                "engine_calls": self.engine_calls,
                "engine_ms": round(self.engine_ms, 3),
                "errors": dict(self.errors),
                "abstained": dict(self.abstained),
            }


@dataclass(frozen=True)
class TransportHooks:
    """What a transport adds to the control ops. stdio: nothing ("ok"); the socket server: its
    state (loading/ready/draining), a `server` object in info, queue and latency in stats."""

    status: Callable[[], str] = lambda: "ok"
    info: Callable[[], dict[str, Any]] = dict
    stats: Callable[[], dict[str, Any]] = dict
    swap_ops: bool = False  # True: triage hands reload/rollback back (the socket server answers them)


def _describe(exc: BaseException) -> str:
    """`Type: message`, cut to a readable length."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS] + "…"


@dataclass(frozen=True)
class Served:
    """One model as the Service answers with it. A batch takes one `Served` at its start and uses
    only that, so a live swap (`attach` while batches run) never mixes two models in one answer."""

    engine: Engine
    variant: str
    policy: AbstentionPolicy
    info: dict[str, Any]
    model: str  # "name@version": every answer's "model" field


class Service:
    """The request → response core shared by every transport.

    `triage` and `wire_line` run on the transport's thread, `classify` on the transport's batch
    threads, several at once (the engine only reads its state after load; ORT sessions and the
    tokenizer take concurrent calls); stats are shared under a lock. A service may start without an
    engine (the socket server answers health "loading") and get it with `attach`, which also swaps
    one model for another while serving (runtime/serve/swap.py).
    """

    def __init__(self, engine: Engine | None = None, limits: Limits | None = None,
                 info: dict[str, Any] | None = None, hooks: TransportHooks = TransportHooks(),
                 max_text_chars: int | None = None, min_score: float | None = None):
        self.limits = limits or Limits()
        self.min_score = min_score  # below it an answer abstains (label null); None = never
        self.hooks = hooks
        self.stats = Stats()
        self.extra_info = dict(info or {})
        self.max_text_chars = max_text_chars
        self.served: Served | None = None
        if engine is not None:
            self.attach(engine)

    @property
    def engine(self) -> Engine | None:
        return self.served.engine if self.served is not None else None

    @property
    def variant(self) -> str | None:
        return self.served.variant if self.served is not None else None

    @property
    def policy(self) -> AbstentionPolicy | None:
        return self.served.policy if self.served is not None else None

    @property
    def info(self) -> dict[str, Any]:
        return self.served.info if self.served is not None else {"version": __version__}

    def attach(self, engine: Engine, model_details: dict[str, Any] | None = None) -> None:
        """Serve with `engine` from now on (the model is loaded and warm); `model_details` (e.g.
        the package's path and signer) join info's "model" object."""
        manifest = engine.package.manifest
        variant = engine.variant.name
        policy = manifest.abstention_policy(variant, self.min_score)
        max_text_chars = engine.encoder.max_chars
        info = {
            "version": __version__,
            "model": {"name": manifest.name, "version": manifest.version, "labels": list(manifest.labels),
                      "max_length": manifest.max_length, "max_text_chars": max_text_chars, **(model_details or {})},
            "variant": variant,
            "min_score": self.min_score,
            "abstention": policy.to_json(),
            "temperature": engine.temperature,
            "limits": self.limits.to_json(),
            "buckets": list(engine.buckets),
            "threads": engine.settings.threads,
            "workers": engine.settings.workers,
            **self.extra_info,
        }
        self.max_text_chars = max_text_chars
        self.served = Served(engine, variant, policy, info, f"{manifest.name}@{manifest.version}")

    # -- one line -------------------------------------------------------------------------------

    def triage(self, line: bytes | LineTooLong, answer_control: bool = True) -> Triaged | ControlRequest:
        """One line: None if blank; a response if it needs no model (errors, control ops); else the
        classify request for `classify`, its texts already cut to the character budget.
        answer_control=False hands control ops back (answered later with `control`)."""
        try:
            request = parse_line(line, self.limits)
            if request is None:
                return None
            self.stats.add(requests=1)
            if isinstance(request, ErrorReply):
                return self.error(request.id, request.code, request.message)
            if isinstance(request, ControlRequest):
                if request.op in SWAP_OPS and self.hooks.swap_ops:
                    return request
                return self.control(request) if answer_control else request
            return self._clip(request)
        except Exception as exc:  # noqa: BLE001 — one bad line must never end the process
            return self.error(None, INTERNAL_ERROR, f"cannot handle this line: {_describe(exc)}")

    def _clip(self, request: ClassifyRequest) -> ClassifyRequest:
        """Cut over-long texts now: only the first max_text_chars characters can reach the model,
        and a queued 1 MiB text would hold memory for nothing."""
        limit = self.max_text_chars
        if limit is None or all(len(text) <= limit for text in request.texts):
            return request
        return dataclasses.replace(request, texts=tuple(text[:limit] for text in request.texts),
                                   clipped=tuple(len(text) > limit for text in request.texts))

    def error(self, request_id: Any, code: str, message: str) -> Response:
        """An error answer, counted in stats (also for transport errors such as busy)."""
        self.stats.add(error=code)
        return ErrorReply(request_id, code, message).to_json()

    def control(self, request: ControlRequest) -> Response:
        """health / info / stats, with what the transport adds; reload/rollback are refused here
        (only the socket server, which checks who asks, answers them)."""
        try:
            if request.op in SWAP_OPS:
                return self.error(request.id, FORBIDDEN, f"{request.op} is an op of the socket service (Unix socket, "
                                                         "same user); here send SIGHUP or use --watch DIR")
            if request.op == "health":
                return {"id": request.id, "op": "health", "status": self.hooks.status()}
            if request.op == "info":
                body = self.info if self.engine is not None else {**self.info, "status": self.hooks.status()}
                return {"id": request.id, "op": "info", **body, **self.hooks.info()}
            return {"id": request.id, "op": "stats", **self.stats.to_json(), **self.hooks.stats()}
        except Exception as exc:  # noqa: BLE001 — a broken hook answers this op, nothing else
            return self.error(request.id, INTERNAL_ERROR, f"cannot answer {request.op}: {_describe(exc)}")

    # -- the model ------------------------------------------------------------------------------

    def classify(self, requests: Sequence[ClassifyRequest]) -> list[Response]:
        """One response per request, in order; all texts go through one engine call."""
        if not requests:
            return []
        start = time.perf_counter()
        served = self.served  # this batch's model, whatever a swap does meanwhile
        try:
            outcomes = self._run(served, requests)
        except Exception as exc:  # noqa: BLE001 — e.g. no engine: answer, do not die
            outcomes = [_describe(exc)] * len(requests)
        elapsed_ms = round((time.perf_counter() - start) * 1000, 3)
        self.stats.add(engine_ms=elapsed_ms)
        responses: list[Response] = []
        abstained: Counter[str] = Counter()
        for request, outcome in zip(requests, outcomes):
            if isinstance(outcome, str):
                responses.append(self.error(request.id, INTERNAL_ERROR, outcome))
                continue
            clipped = request.clipped or (False,) * len(outcome)
            items = []
            for result, cut in zip(outcome, clipped):
                item = answer(result, served.policy, served.engine.labels, cut)  # the library's one path
                abstained[item.reason] += item.abstained
                items.append(item.to_json())
            body = items[0] if request.single else {"results": items}
            responses.append({"id": request.id, **body, "variant": served.variant, "model": served.model,
                              "ms": elapsed_ms})
        self.stats.add(abstained=+abstained)
        return responses

    def _run(self, served: Served | None, requests: Sequence[ClassifyRequest]) -> list[list[Classification] | str]:
        """Results per request from one engine call; if it fails, retry one request at a time so
        only the request that breaks the model gets an error (its message as str)."""
        if served is None:
            raise RuntimeError("the model is not loaded")
        texts = [text for r in requests for text in r.texts]
        self.stats.add(texts=len(texts), engine_calls=1)
        try:
            flat = served.engine.classify(texts)
        except Exception:  # noqa: BLE001 — isolate the failing request below
            return [self._run_one(served.engine, r) for r in requests]
        outcomes: list[list[Classification] | str] = []
        cursor = 0
        for request in requests:
            outcomes.append(flat[cursor:cursor + len(request.texts)])
            cursor += len(request.texts)
        return outcomes

    def _run_one(self, engine: Engine, request: ClassifyRequest) -> list[Classification] | str:
        """One request alone; the error message if the model fails on it."""
        self.stats.add(engine_calls=1)
        try:
            return engine.classify(request.texts)
        except Exception as exc:  # noqa: BLE001 — a model failure must not stop the server
            return _describe(exc)

    # -- lines in, lines out --------------------------------------------------------------------

    def wire_line(self, response: Response) -> bytes:
        """The wire line of one response; internal_error (same id) if it cannot be encoded."""
        try:
            return encode_line(response)
        except Exception as exc:  # noqa: BLE001 — e.g. an id that cannot be written back
            error = self.error(response.get("id"), INTERNAL_ERROR, f"cannot encode the answer: {_describe(exc)}")
        try:
            return encode_line(error)
        except Exception:  # noqa: BLE001 — then the id itself is the problem: answer without it
            return encode_line({**error, "id": None})

    def answer_lines(self, lines: Sequence[bytes | LineTooLong]) -> list[bytes]:
        """Every non-blank line's response line, in input order; classify requests in one call."""
        # Control ops are answered after the batch's model call, so stats include this batch.
        triaged = [answer for line in lines if (answer := self.triage(line, answer_control=False)) is not None]
        answers = iter(self.classify([item for item in triaged if isinstance(item, ClassifyRequest)]))
        responses = [next(answers) if isinstance(item, ClassifyRequest)
                     else self.control(item) if isinstance(item, ControlRequest) else item for item in triaged]
        return [self.wire_line(response) for response in responses]

    def ready_event(self) -> dict[str, Any]:
        """The optional first line for embedding apps: version, model, variant, limits."""
        warm_up_ms = self.engine.warm_up_ms if self.engine is not None else 0.0
        return {"event": "ready", **self.info, "warm_up_ms": round(warm_up_ms, 3)}
