"""Requests → responses, for any transport (stdio now, a socket server later).

`Service.answer_lines` takes the lines a transport read (in order) and returns one encoded
response per non-blank line, in the same order. All classify requests of one call go through one
engine call, so a transport that reads ahead gets batch speed without knowing about batching.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime import __version__
from runtime.engine import Classification, Engine
from runtime.protocol import (
    INTERNAL_ERROR,
    ClassifyRequest,
    ControlRequest,
    ErrorReply,
    Limits,
    LineTooLong,
    Request,
    encode_line,
    parse_line,
    result_json,
)


@dataclass
class Stats:
    """Counters reported by the stats op."""

    started: float = field(default_factory=time.time)
    requests: int = 0
    texts: int = 0
    engine_calls: int = 0
    engine_ms: float = 0.0
    errors: Counter[str] = field(default_factory=Counter)

    def to_json(self) -> dict[str, Any]:
        """JSON form for the stats op."""
        return {
            "uptime_s": round(time.time() - self.started, 3),
            "requests": self.requests,
            "texts": self.texts,
            "engine_calls": self.engine_calls,
            "engine_ms": round(self.engine_ms, 3),
            "errors": dict(self.errors),
        }


class Service:
    """The request → response core shared by every transport. Not thread-safe: one caller at a time."""

    def __init__(self, engine: Engine, limits: Limits = Limits(), info: dict[str, Any] | None = None):
        self.engine = engine
        self.limits = limits
        self.variant = engine.variant.name
        self.stats = Stats()
        manifest = engine.package.manifest
        self.info = {
            "version": __version__,
            "model": {"name": manifest.name, "version": manifest.version, "labels": list(manifest.labels),
                      "max_length": manifest.max_length},
            "variant": self.variant,
            "limits": limits.to_json(),
            "buckets": list(engine.buckets),
            "threads": engine.settings.threads,
            **(info or {}),
        }

    def answer_lines(self, lines: Sequence[bytes | LineTooLong]) -> list[bytes]:
        """Parse, answer and encode; blank lines get no response."""
        requests = [r for r in (parse_line(line, self.limits) for line in lines) if r is not None]
        return [encode_line(response) for response in self.answer(requests)]

    def answer(self, requests: Sequence[Request]) -> list[dict[str, Any]]:
        """One response object per request, in order; all texts run in one engine call."""
        start = time.perf_counter()
        self.stats.requests += len(requests)
        classify = [r for r in requests if isinstance(r, ClassifyRequest)]
        outcomes = self._classify(classify)
        elapsed_ms = round((time.perf_counter() - start) * 1000, 3)
        if classify:
            self.stats.engine_ms += elapsed_ms

        responses: list[dict[str, Any]] = []
        labels = self.engine.labels
        pending = iter(outcomes)
        for request in requests:
            if isinstance(request, ErrorReply):
                self.stats.errors[request.code] += 1
                responses.append(request.to_json())
            elif isinstance(request, ControlRequest):
                responses.append(self._control(request))
            else:
                outcome = next(pending)
                if isinstance(outcome, str):
                    self.stats.errors[INTERNAL_ERROR] += 1
                    responses.append(ErrorReply(request.id, INTERNAL_ERROR, outcome).to_json())
                    continue
                items = [result_json(c.label, c.score, c.probs, labels, c.truncated) for c in outcome]
                body = items[0] if request.single else {"results": items}
                responses.append({"id": request.id, **body, "variant": self.variant, "ms": elapsed_ms})
        return responses

    def _classify(self, requests: Sequence[ClassifyRequest]) -> list[list[Classification] | str]:
        """Results per request from one engine call; if it fails, retry one request at a time so
        only the request that breaks the model gets an error (message as str)."""
        texts = [text for r in requests for text in r.texts]
        if not texts:
            return []
        self.stats.texts += len(texts)
        try:
            self.stats.engine_calls += 1
            flat = self.engine.classify(texts)
        except Exception:  # noqa: BLE001 — isolate the failing request below
            return [self._classify_one(r) for r in requests]
        outcomes: list[list[Classification] | str] = []
        cursor = 0
        for request in requests:
            outcomes.append(flat[cursor:cursor + len(request.texts)])
            cursor += len(request.texts)
        return outcomes

    def _classify_one(self, request: ClassifyRequest) -> list[Classification] | str:
        """One request alone; the error message if the model fails on it."""
        try:
            self.stats.engine_calls += 1
            return self.engine.classify(request.texts)
        except Exception as exc:  # noqa: BLE001 — a model failure must not stop the server
            return f"{type(exc).__name__}: {exc}"

    def _control(self, request: ControlRequest) -> dict[str, Any]:
        """Answer health/info/stats."""
        if request.op == "health":
            return {"id": request.id, "op": "health", "status": "ok"}
        if request.op == "info":
            return {"id": request.id, "op": "info", **self.info}
        return {"id": request.id, "op": "stats", **self.stats.to_json()}

    def ready_event(self) -> dict[str, Any]:
        """The optional first line for embedding apps: version, model, variant, limits."""
        return {"event": "ready", **self.info, "warm_up_ms": round(self.engine.warm_up_ms, 3)}
