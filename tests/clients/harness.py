"""The Python client's conformance harness: reads commands on stdin, answers one JSON line each.

Every client has one such harness in its language (harness.c, Harness.java, Harness.cs,
harness.js); tests/test_clients.py drives them all with the same commands. A command is one line
of TAB-separated fields:

    spawn NAME READY_TIMEOUT_S TIMEOUT_S ARG...   a client on a child process (the client adds --ready)
    connect NAME TIMEOUT_S PATH                   a client on the socket service at PATH
    one NAME REPEAT TEXT                          classify TEXT repeated REPEAT times
    many NAME FILE                                classify_many(the file's lines)
    async NAME FILE [inflight]                    each line as its own pipelined call, all in flight at
                                                  once; with `inflight` the line {"event": "inflight"}
                                                  is printed once all are sent
    threads NAME N M FILE                         N threads share the client, each makes M calls one
                                                  after the other: thread t, call j takes line t*M+j
                                                  (mod the number of lines)
    sleep MS
    close NAME

The answer line: {"cmd", "elapsed_ms"} plus either "error_code" and "error_message" (the call
raised) or the results: `one` gives label, leaning, score, abstained, reason, truncated; `many`,
`async` and `threads` give "labels", one per line in the order above: the label, null when
abstained, or "!CODE: MESSAGE" for a call that failed. Run with clients/python on PYTHONPATH.
"""

from __future__ import annotations

import concurrent.futures
import json
import sys
import threading
import time
from typing import Any

from decide_client import DecideClient, DecideError


def label_or_code(call: Any) -> Any:
    """The answer's label, or "!code: message" when the call failed."""
    try:
        return call().label
    except DecideError as exc:
        return f"!{exc.code}: {exc.message}"


def read_lines(path: str) -> list[str]:
    """The file's lines (split at "\\n" only: a text may hold U+2028)."""
    with open(path, encoding="utf-8", newline="") as file:
        return file.read().split("\n")[:-1]


def run(fields: list[str], clients: dict[str, DecideClient]) -> dict[str, Any]:
    cmd, args = fields[0], fields[1:]
    if cmd == "spawn":
        clients[args[0]] = DecideClient.spawn(args[3:], ready_timeout=float(args[1]), timeout=float(args[2]))
    elif cmd == "connect":
        clients[args[0]] = DecideClient.connect(args[2], timeout=float(args[1]))
    elif cmd == "one":
        answer = clients[args[0]].classify(args[2] * int(args[1]))
        return {"label": answer.label, "leaning": answer.leaning, "score": answer.score,
                "abstained": answer.abstained, "reason": answer.reason, "truncated": answer.truncated}
    elif cmd == "many":
        return {"labels": [answer.label for answer in clients[args[0]].classify_many(read_lines(args[1]))]}
    elif cmd == "async":
        client = clients[args[0]]
        futures = [client.submit(text) for text in read_lines(args[1])]
        if args[2:] == ["inflight"]:
            print(json.dumps({"event": "inflight"}), flush=True)
        deadline = time.monotonic() + client.timeout

        def wait(future: concurrent.futures.Future) -> Any:
            try:
                return future.result(max(0.0, deadline - time.monotonic()))
            except concurrent.futures.TimeoutError:
                raise DecideError("timeout", "no answer in time (harness)") from None

        return {"labels": [label_or_code(lambda f=future: wait(f)) for future in futures]}
    elif cmd == "threads":
        client, n, m, texts = clients[args[0]], int(args[1]), int(args[2]), read_lines(args[3])
        labels: list[Any] = [None] * (n * m)

        def worker(t: int) -> None:
            for j in range(m):
                labels[t * m + j] = label_or_code(lambda i=t * m + j: client.classify(texts[i % len(texts)]))

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(n)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return {"labels": labels}
    elif cmd == "sleep":
        time.sleep(int(args[0]) / 1000)
    elif cmd == "close":
        clients[args[0]].close()  # kept: later calls must raise `closed`
    else:
        raise ValueError(f"unknown command {cmd!r}")
    return {}


def main() -> int:
    clients: dict[str, DecideClient] = {}
    for line in sys.stdin:
        fields = line.rstrip("\n").split("\t")
        started = time.monotonic()
        try:
            result = run(fields, clients)
        except DecideError as exc:
            result = {"error_code": exc.code, "error_message": exc.message}
        result.update(cmd=fields[0], elapsed_ms=round((time.monotonic() - started) * 1000, 1))
        print(json.dumps(result, ensure_ascii=False), flush=True)
    for client in clients.values():
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
