"""The socket server's side of live swaps (runtime/serve/swap.py): the reload/rollback ops and who may
send them, SIGHUP, and the --watch loop. Everything here runs on the event loop thread except
the swap's `done` callback, which comes from the swap thread.

Who may swap: the ops are taken only from a peer that runs as the server's own user, checked with
SO_PEERCRED on the Unix socket (the socket is 0600 as well). A TCP peer cannot prove a uid, so
over TCP the ops are refused (`forbidden`); SIGHUP and --watch work for every transport.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from runtime.protocol import BUSY, FORBIDDEN, SWAP_FAILED, ControlRequest
from runtime.serve.swap import Outcome

if TYPE_CHECKING:
    from runtime.package.watch import PackageWatcher
    from runtime.serve.service import Service
    from runtime.serve.swap import Swapper

log = logging.getLogger("decide")


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process at the other end of a Unix socket (SO_PEERCRED); None for TCP."""
    if sock.family != socket.AF_UNIX or not hasattr(socket, "SO_PEERCRED"):
        return None
    try:
        _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                              struct.calcsize("3i")))
    except OSError:
        return None
    return uid


def _resolve(future: asyncio.Future, response: dict[str, Any]) -> None:
    if not future.done():
        future.set_result(response)


class SwapHost(Protocol):
    """What the swap ops use of their socket server (server.py's SocketServer), named here so that
    this module needs nothing above it."""

    service: Service
    swapper: Swapper | None
    state: str


class SocketSwaps:
    """Swap requests of one SocketServer."""

    def __init__(self, server: SwapHost):
        self.server = server

    def op(self, request: ControlRequest, future: asyncio.Future, sender_uid: int | None) -> None:
        """Answer a reload/rollback op from a peer running as `sender_uid` (None: TCP, unknown);
        a reload's answer resolves `future` when it is done."""
        server, service = self.server, self.server.service
        if sender_uid is None or sender_uid != os.geteuid():
            who = ("a TCP peer cannot prove its uid" if sender_uid is None
                   else f"the peer runs as uid {sender_uid}, the service as uid {os.geteuid()}")
            future.set_result(service.error(request.id, FORBIDDEN, f"{request.op} refused: {who}; use the Unix "
                                            "socket as the service's user, or send SIGHUP"))
            return
        swapper = server.swapper
        if swapper is None:
            future.set_result(service.error(request.id, SWAP_FAILED, "the first model is still loading"))
            return
        if request.op == "rollback":
            future.set_result(self.answer(request, swapper.rollback("op")))
            return
        loop = asyncio.get_running_loop()

        def done(outcome: Outcome) -> None:  # the swap thread
            try:
                loop.call_soon_threadsafe(_resolve, future, self.answer(request, outcome))
            except RuntimeError:  # the loop closed meanwhile (shutdown): nobody waits for this answer
                pass

        refused = swapper.reload(Path(request.model) if request.model else None, "op", done)
        if refused is not None:
            future.set_result(service.error(request.id, BUSY, refused))

    def answer(self, request: ControlRequest, outcome: Outcome) -> dict[str, Any]:
        """The op's answer: what serves now, or swap_failed with the reason."""
        service = self.server.service
        if not outcome.ok:
            return service.error(request.id, SWAP_FAILED, f"{outcome.error}; still serving {outcome.serving}")
        return {"id": request.id, "op": request.op, "status": "ok", **outcome.to_json(),
                "signature": service.info["model"].get("signature")}

    def on_sighup(self) -> None:
        """SIGHUP: reload the package directory served now."""
        swapper = self.server.swapper
        if swapper is None:
            log.info("SIGHUP received while the first model loads: ignored")
            return
        refused = swapper.reload(None, "SIGHUP")
        if refused is not None:
            log.info("SIGHUP received: %s; ignored", refused)

    async def watch(self, watcher: PackageWatcher) -> None:
        """--watch: look for a new complete package every interval, while no swap is under way."""
        while True:
            await asyncio.sleep(watcher.interval_s)
            swapper = self.server.swapper
            if self.server.state != "ready" or swapper is None or swapper.busy:
                continue  # looking now would use up a candidate that cannot be tried yet
            candidate = await asyncio.to_thread(watcher.poll)
            if candidate is not None and swapper.reload(candidate, "watch") is not None:
                watcher.forget(candidate)  # a reload op started meanwhile: try it at the next look
