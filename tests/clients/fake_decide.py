"""Stand-ins for a decide child that misbehaves, for the client conformance suite (tests/test_clients.py).

    python3 tests/clients/fake_decide.py MODE [decide's arguments, ignored]

never-ready    reads nothing, prints nothing (until killed)
exit-at-start  one stderr line like a damaged package's, exit code 4, no ready line
stall          ready line, then reads every request and answers none; ignores EOF (only a
               signal ends it): a stuck engine
echo           ready line, then each request answered with label = leaning = its text; a text
               starting with "slow" is answered after 1.2 s
stderr-flood   echo, but 1 MiB on stderr before the ready line and 64 KiB before each answer (a
               client that does not drain stderr makes it block)
"""

from __future__ import annotations

import json
import os
import sys
import time

READY = {"event": "ready", "version": "fake", "model": {"name": "fake", "version": "0", "labels": ["a", "b"]},
         "limits": {"max_line_bytes": 1 << 20, "max_texts": 256}}
SLOW_S = 1.2  # the client times out at 1 s; its next call then waits ~0.2 s of its 1 s


def write(fd: int, data: bytes) -> None:
    """The whole buffer, however many writes it takes."""
    while data:
        data = data[os.write(fd, data):]


def answer(line: bytes) -> bytes:
    """label = leaning = the request's text (so a mismatched answer shows)."""
    request = json.loads(line)
    text = request.get("text", "")
    if text.startswith("slow"):
        time.sleep(SLOW_S)
    response = {"id": request.get("id"), "label": text, "leaning": text, "score": 1.0, "scores": {text: 1.0},
                "abstained": False, "reason": None, "truncated": False}
    return json.dumps(response, ensure_ascii=False).encode("utf-8") + b"\n"


def main(mode: str) -> int:
    if mode == "never-ready":
        time.sleep(600)
        return 0
    if mode == "exit-at-start":
        write(2, b"decide: model package error: manifest.json: missing (fake)\n")
        return 4
    flood = mode == "stderr-flood"
    if flood:
        write(2, (b"y" * 1023 + b"\n") * 1024)
    write(1, json.dumps(READY).encode("utf-8") + b"\n")
    pending = b""
    while True:
        chunk = os.read(0, 1 << 16)
        if not chunk:
            if mode == "stall":
                time.sleep(600)
            return 0
        *lines, pending = (pending + chunk).split(b"\n")
        if mode == "stall":
            continue
        for line in lines:
            if line.strip():
                if flood:
                    write(2, (b"z" * 1023 + b"\n") * 64)
                write(1, answer(line))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
