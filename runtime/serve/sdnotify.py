"""systemd's readiness notification (sd_notify) in a few lines of stdlib, no libsystemd.

Under `Type=notify` systemd sets $NOTIFY_SOCKET and waits for a datagram "READY=1" before it
counts the service as started: units ordered After=decide.service then start only once the model
is warm, and a model that fails to load makes `systemctl start` fail instead of reporting a
service that is "active" for half a second. Outside systemd the variable is unset and every call
is a no-op. Protocol: sd_notify(3) — one datagram of newline-separated KEY=VALUE assignments to
an AF_UNIX socket; a leading "@" means the Linux abstract namespace.
"""

from __future__ import annotations

import logging
import os
import socket

ENV_NOTIFY_SOCKET = "NOTIFY_SOCKET"

log = logging.getLogger("decide")


def notify_address(value: str | None) -> str | bytes | None:
    """The address to send to, from $NOTIFY_SOCKET's value (None when unset or unusable)."""
    if not value:
        return None
    if value.startswith("@"):
        return b"\0" + value[1:].encode()  # abstract namespace socket
    if value.startswith("/"):
        return value
    return None  # e.g. vsock:… addresses: not for a local service


def notify(*assignments: str) -> bool:
    """Send e.g. notify("READY=1", "STATUS=serving") to systemd; True if a datagram was sent."""
    address = notify_address(os.environ.get(ENV_NOTIFY_SOCKET))
    if address is None:
        return False
    message = "\n".join(assignments).encode("utf-8")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(message, address)
    except OSError as exc:
        # Readiness is advisory: a missing notify socket must not stop the service itself.
        log.warning("sd_notify to %s failed: %s", os.environ.get(ENV_NOTIFY_SOCKET), exc)
        return False
    return True
