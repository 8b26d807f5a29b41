"""decide with its engine artificially slowed: a test and soak hook, not part of the shipped program.

    python3 -m benchmarks.slow_engine PER_CALL_MS PER_TEXT_MS [decide arguments…]

Every engine call sleeps PER_CALL_MS + PER_TEXT_MS × texts before it runs (time.sleep releases the
GIL as ORT does), so a fast tiny model behaves like a big one on a loaded box: the request queue
fills, backpressure holds connections back, and the server's rules for slow engines get exercised
(issue 23). Nothing in runtime/ reads this; a user can only get it by running this file.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from runtime import cli
from runtime.engine import classifier


def slowed(load_engine: Callable[..., Any], per_call_ms: float, per_text_ms: float) -> Callable[..., Any]:
    """`classifier.load_engine` whose engines sleep before each classify call."""
    def load(*args: Any, **kwargs: Any) -> Any:
        engine = load_engine(*args, **kwargs)
        run = engine.classify_encoded

        def slow(items: Sequence[Any]) -> Any:
            time.sleep((per_call_ms + per_text_ms * len(items)) / 1000)
            return run(items)

        engine.classify_encoded = slow
        return engine
    return load


def command(per_call_ms: float, per_text_ms: float) -> list[str]:
    """The argv prefix that starts a slowed decide (append decide's own arguments)."""
    return [sys.executable, "-m", "benchmarks.slow_engine", str(per_call_ms), str(per_text_ms)]


def main(argv: list[str]) -> int:
    per_call_ms, per_text_ms = float(argv[0]), float(argv[1])
    # every command loads its engine here (cli.load_engine, decide score's in-process workers)
    classifier.load_engine = slowed(classifier.load_engine, per_call_ms, per_text_ms)
    return cli.main(argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
