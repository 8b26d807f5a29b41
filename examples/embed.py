"""Embedding decide in another program: start it once, wait for "ready", then one line per request.

    python3 examples/embed.py "Who won the world cup?" "Is coffee bad for you?"
    python3 examples/embed.py --decide dist/decide/decide "..."     # the frozen binary instead

The child keeps its model loaded between requests; each response is flushed as soon as it is
ready, so a request → response round trip needs no batching or timeouts on this side.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path


class Decide:
    """A running `decide --ready` child process."""

    def __init__(self, command: list[str]):
        self.proc = subprocess.Popen([*command, "--ready", "--quiet"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, cwd=Path(__file__).resolve().parent.parent)
        ready = json.loads(self.proc.stdout.readline() or b"null")
        if not ready or ready.get("event") != "ready":
            raise RuntimeError(f"decide did not start (exit code {self.proc.wait()})")
        self.labels = ready["model"]["labels"]

    def classify(self, text: str) -> dict:
        """One request, one response."""
        self.proc.stdin.write(json.dumps({"text": text}, ensure_ascii=False).encode("utf-8") + b"\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> int:
        """Close stdin: decide answers what it has read and exits 0."""
        self.proc.stdin.close()
        return self.proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description="Classify texts through a long-running decide process.")
    parser.add_argument("texts", nargs="+")
    parser.add_argument("--decide", default=f"{shlex.quote(sys.executable)} -m runtime",
                        help="command that starts decide (default: python -m runtime)")
    parser.add_argument("--model", default=None, help="model package directory")
    args = parser.parse_args()
    command = shlex.split(args.decide) + (["--model", args.model] if args.model else [])
    decide = Decide(command)
    for text in args.texts:
        response = decide.classify(text)
        print(f"{response['label']:<12} {response['score']:.3f}  {text}")
    return decide.close()


if __name__ == "__main__":
    sys.exit(main())
