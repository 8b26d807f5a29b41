"""`decide reload --socket PATH [--model DIR]` and `decide rollback --socket PATH`: ask a running
socket service to swap its model, wait for the answer, print it.

The ops go over the Unix socket only: the service checks with SO_PEERCRED that the peer runs as
its own user (a TCP peer cannot prove who it is, so the service refuses swaps over TCP). Exit 0:
the service now serves the model it names; 4: the package was refused (the one before still
serves; the message says why); 2: bad arguments, no service at PATH, or not allowed.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from pathlib import Path

EXIT_OK, EXIT_USAGE, EXIT_REFUSED = 0, 2, 4
DEFAULT_TIMEOUT_S = 600.0  # hashing, warming and self-testing a large package takes a while
MAX_ANSWER_BYTES = 1 << 20


def build_parser(command: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"decide {command}",
        description={"reload": "Make a running `decide serve --socket` check, warm and self-test a package, then "
                               "switch to it without dropping a request.",
                     "rollback": "Make a running `decide serve --socket` serve its previous model again."}[command],
        epilog="Exit codes: 0 swapped, 2 usage / no service / not allowed, 4 refused (the old model still serves).")
    parser.add_argument("--socket", required=True, metavar="PATH", help="the service's Unix socket")
    if command == "reload":
        parser.add_argument("--model", type=Path, default=None, metavar="DIR",
                            help="package directory (default: re-read the directory the service serves)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                        help=f"how long to wait for the answer (default {DEFAULT_TIMEOUT_S:g})")
    return parser


def request_line(command: str, model: Path | None) -> bytes:
    request: dict[str, object] = {"id": command, "op": command}
    if model is not None:
        request["model"] = str(model.absolute())  # the service resolves nothing against its own cwd
    return json.dumps(request).encode("utf-8") + b"\n"


def ask(path: str, line: bytes, timeout: float) -> dict:
    """Send one line, read one answer line; OSError / ValueError when that fails."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(line)
        sock.shutdown(socket.SHUT_WR)
        data = b""
        while b"\n" not in data and len(data) < MAX_ANSWER_BYTES:
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            data += chunk
    if b"\n" not in data:
        raise ValueError("the service closed the connection without an answer")
    return json.loads(data.split(b"\n", 1)[0])


def main(command: str, argv: list[str]) -> int:
    args = build_parser(command).parse_args(argv)
    try:
        answer = ask(args.socket, request_line(command, getattr(args, "model", None)), args.timeout)
    except (OSError, ValueError) as exc:
        reason = "timed out" if isinstance(exc, TimeoutError) else getattr(exc, "strerror", None) or exc
        print(f"decide: {command}: cannot ask the service at {args.socket}: {reason}", file=sys.stderr)
        return EXIT_USAGE
    error = answer.get("error") if isinstance(answer, dict) else None
    if error:
        print(f"decide: {command} {error.get('code')}: {error.get('message')}", file=sys.stderr)
        return EXIT_REFUSED if error.get("code") == "swap_failed" else EXIT_USAGE
    print(json.dumps(answer, ensure_ascii=False))
    return EXIT_OK
