"""Embedding decide in another program, through the Python client (clients/python/decide_client.py).

    python3 examples/embed.py "Who won the world cup?" "Is coffee bad for you?"
    python3 examples/embed.py --decide dist/decide/decide "..."     # the frozen binary instead

The client starts one `decide --ready` child and keeps it (and its loaded model) for every request:
it waits for the ready line, pipelines the texts, matches each answer to its text, times calls
out, restarts a child that died and drains its stderr. In your own program, copy
decide_client.py next to your code and `from decide_client import DecideClient`; the other
languages' clients: docs/embedding.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent


def load_client() -> ModuleType:
    """clients/python/decide_client.py, imported from its path (this example is not installed)."""
    spec = importlib.util.spec_from_file_location("decide_client", REPO / "clients" / "python" / "decide_client.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (dataclasses look their module up there)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description="Classify texts through a long-running decide process.")
    parser.add_argument("texts", nargs="+")
    parser.add_argument("--decide", default=f"{shlex.quote(sys.executable)} -m runtime",
                        help="command that starts decide (default: python -m runtime)")
    parser.add_argument("--model", default=None, help="model package directory")
    args = parser.parse_args()
    command = shlex.split(args.decide) + (["--model", args.model] if args.model else []) + ["--quiet"]
    decide_client = load_client()
    try:
        with decide_client.DecideClient.spawn(command, cwd=str(REPO)) as client:
            for text, answer in zip(args.texts, client.classify_many(args.texts)):
                print(f"{answer.label or '(' + answer.reason + ')':<12} {answer.score:.3f}  {text}")
    except decide_client.DecideError as exc:
        print(f"embed.py: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
