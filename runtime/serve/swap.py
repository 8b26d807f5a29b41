"""Live model swaps: a new package is made ready in the background while the old one answers.

`Swapper.reload(path)` starts a background thread that runs the transport's `build(path)` (the
command line's: load the package, check its signature against the trusted keys, hash every file,
choose tier and variant with the same CPU probe and overrides, size threads and workers, build
and warm the engine, run the golden selftest) and, only if all of that passed, `Service.attach`es
the new engine. A batch takes its model when it starts (runtime/service.Served), so the switch
falls between batches: no answer is lost, none is made by half of each model, and every answer
names the model that made it ("model": "name@version"). Anything that fails leaves the old model
serving; the failure is logged as one line and kept for `info`/`stats`.

The model served before the last switch stays loaded (warm), so `rollback` is instant and does
not depend on its directory still being there. Memory: two models while serving, three during a
reload. One reload at a time: another one asked for meanwhile is refused (`busy`).

Triggers (the transports call in): SIGHUP (re-read the package directory served now — e.g. a
symlink that was re-pointed), the socket ops reload/rollback (runtime/serve/server.py), and a watched
directory (runtime/package/watch.py). Stdlib only at import; the engine comes from `build`.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runtime.engine.engine import Engine
    from runtime.package.signing import Signer
    from runtime.serve.service import Service

log = logging.getLogger("decide")

MAX_MESSAGE_CHARS = 500
# While a candidate loads, the interpreter hands its lock over every 0.5 ms instead of 5: the
# candidate's Python work (hashing loops, selftest, JSON) would otherwise make each of the serving
# threads' many small lock acquisitions per request wait up to 5 ms (a convoy).
SWAP_SWITCH_INTERVAL_S = 0.0005


@dataclass(frozen=True)
class Loaded:
    """A package ready to serve: its warm engine and what `info` tells about it."""

    engine: Engine
    path: Path
    signer: Signer | None = None
    selftest: str = ""
    loaded_at: float = field(default_factory=time.time)

    @property
    def model(self) -> str:
        manifest = self.engine.package.manifest
        return f"{manifest.name}@{manifest.version}"

    def details(self) -> dict[str, Any]:
        """What joins info's "model" object: where it came from and who signed it."""
        return {"path": str(self.path), "signature": self.signer.to_json() if self.signer else None,
                "loaded_at": round(self.loaded_at, 3)}

    def summary(self) -> dict[str, Any]:
        return {"model": self.model, "variant": self.engine.variant.name, "path": str(self.path),
                "signed_by": self.signer.key_id if self.signer and self.signer.verified else None}


@dataclass(frozen=True)
class Outcome:
    """What one reload or rollback did (the op's answer, a log line, `info`'s history)."""

    op: str  # reload | rollback
    cause: str  # op | SIGHUP | watch
    ok: bool
    serving: str  # the model that serves after it
    at: float = field(default_factory=time.time)
    path: str | None = None
    previous: str | None = None
    error: str | None = None
    ms: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {key: value for key, value in self.__dict__.items() if value is not None}


def _message(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS] + "…"


class Swapper:
    """The model a Service answers with, the one before it, and the background reloads."""

    def __init__(self, service: Service, build: Callable[[Path], Loaded] | None, current: Loaded):
        self.service = service
        self.build = build  # None: this transport cannot reload
        self.lock = threading.Lock()
        self.current = current
        self.previous: Loaded | None = None
        self.loading: str | None = None  # the directory being made ready
        self.counts = {"reloads": 0, "failed": 0, "rollbacks": 0}
        self.last: Outcome | None = None
        self.last_failure: Outcome | None = None
        service.attach(current.engine, current.details())

    @property
    def busy(self) -> bool:
        return self.loading is not None

    def reload(self, path: Path | None, cause: str, done: Callable[[Outcome], None] | None = None) -> str | None:
        """Make the package at `path` (None: the directory served now) ready in the background and
        switch to it; `done(outcome)` is called from that thread. Returns None when started, or
        why not (a reload is already under way, or this transport cannot reload)."""
        target = Path(path) if path is not None else self.current.path
        with self.lock:
            if self.build is None:
                return "this service cannot reload models"
            if self.loading is not None:
                return f"a reload of {self.loading} is already under way"
            self.loading = str(target)
        log.info("%s: reloading %s in the background; %s answers meanwhile", cause, target, self.current.model)
        threading.Thread(target=self._load, args=(target, cause, done), name="swap", daemon=True).start()
        return None

    def _load(self, path: Path, cause: str, done: Callable[[Outcome], None] | None) -> None:
        started = time.perf_counter()
        outcome: Outcome
        interval = sys.getswitchinterval()  # one reload at a time: restored by the one that set it
        sys.setswitchinterval(min(interval, SWAP_SWITCH_INTERVAL_S))
        try:
            assert self.build is not None
            loaded = self.build(path)
        except BaseException as exc:  # noqa: BLE001 — any failure keeps the old model; reported, not raised
            outcome = self._record(Outcome("reload", cause, False, self.current.model, path=str(path),
                                           error=_message(exc), ms=_ms(started)))
        else:
            with self.lock:
                self.previous, self.current = self.current, loaded
                self.service.attach(loaded.engine, loaded.details())
            outcome = self._record(Outcome("reload", cause, True, loaded.model, path=str(path),
                                           previous=self.previous.model if self.previous else None, ms=_ms(started)))
        finally:
            sys.setswitchinterval(interval)
            with self.lock:
                self.loading = None
        if done is not None:
            done(outcome)

    def rollback(self, cause: str) -> Outcome:
        """Serve the previous model again (the current one becomes the previous: a second rollback
        undoes the first)."""
        started = time.perf_counter()
        with self.lock:
            if self.loading is not None:
                error = f"a reload of {self.loading} is under way; roll back after it"
            elif self.previous is None:
                error = "there is no previous model to return to (nothing was swapped since the start)"
            else:
                error = None
                self.previous, self.current = self.current, self.previous
                self.service.attach(self.current.engine, self.current.details())
            serving, previous = self.current.model, self.previous.model if self.previous else None
        return self._record(Outcome("rollback", cause, error is None, serving, path=str(self.current.path),
                                    previous=previous if error is None else None, error=error, ms=_ms(started)))

    def _record(self, outcome: Outcome) -> Outcome:
        with self.lock:
            self.last = outcome
            if outcome.ok:
                self.counts["rollbacks" if outcome.op == "rollback" else "reloads"] += 1
            else:
                self.counts["failed"] += 1
                self.last_failure = outcome
        if outcome.ok:
            log.info("%s (%s): now serving %s from %s, previous %s (%.0f ms)", outcome.op, outcome.cause,
                     outcome.serving, outcome.path, outcome.previous, outcome.ms)
        else:
            log.warning("%s (%s) failed, still serving %s: %s", outcome.op, outcome.cause, outcome.serving,
                        outcome.error)
        return outcome

    def to_json(self) -> dict[str, Any]:
        """For `info`: what serves, what rollback returns to, what is loading, the last outcomes."""
        with self.lock:
            return {"serving": self.current.summary(),
                    "previous": self.previous.summary() if self.previous else None,
                    "loading": self.loading, **self.counts,
                    "last": self.last.to_json() if self.last else None,
                    "last_failure": self.last_failure.to_json() if self.last_failure else None}

    def stats_json(self) -> dict[str, Any]:
        """For `stats`: the counters and the last failure."""
        with self.lock:
            return {"model": self.current.model, "loading": self.loading is not None, **self.counts,
                    "last_failure": self.last_failure.to_json() if self.last_failure else None}


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 1)
