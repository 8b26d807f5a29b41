"""Where the socket server listens: address rules, binding, and accepting connections.

Stdlib only. The checks are pure functions first (testable without sockets); `bind` turns a
`ListenAddress` into a listening socket; `Acceptor` accepts connections for an asyncio loop and
backs off when the process runs out of file descriptors instead of logging every second.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import os
import socket
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass

log = logging.getLogger("decide")

# Connections the kernel holds before decide accepts them. 128 made a burst of connects fail with
# EAGAIN before decide could even answer busy (issue 23); the kernel caps this at
# net.core.somaxconn (4096 on Linux ≥ 5.4, 128 before: raise it there for bursts).
LISTEN_BACKLOG = max(socket.SOMAXCONN, 4096)
MAX_UNIX_PATH_BYTES = 107  # sun_path is 108 bytes with the terminating NUL (Linux)
ACCEPT_BURST = 64  # connections accepted per wake-up at most (others wait in the backlog)
ACCEPT_RETRY_MIN_S = 0.1  # first pause after EMFILE; doubles up to ACCEPT_RETRY_MAX_S
ACCEPT_RETRY_MAX_S = 2.0
OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class ListenError(Exception):
    """A listen address that is refused (security rules) or cannot be bound."""


@dataclass(frozen=True)
class ListenAddress:
    """Where to listen: a Unix socket path, or a TCP host and port."""

    path: str | None = None
    host: str | None = None
    port: int | None = None

    def describe(self) -> str:
        """`unix:/run/decide.sock` or `tcp:127.0.0.1:7878` (for logs, info and the ready event)."""
        if self.path is not None:
            return f"unix:{self.path}"
        host = f"[{self.host}]" if self.host and ":" in self.host else self.host
        return f"tcp:{host}:{self.port}"


def parse_tcp_address(value: str) -> tuple[str, int]:
    """HOST:PORT or [IPv6]:PORT → (host, port); raises ListenError."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not host:
        raise ListenError(f"--tcp needs HOST:PORT (e.g. 127.0.0.1:7878), got {value!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
    except ValueError:
        raise ListenError(f"--tcp port must be a number, got {port_text!r}") from None
    if not 0 <= port <= 65535:
        raise ListenError(f"--tcp port {port} is out of range 0–65535")
    return host, port


def resolve_host(host: str, port: int) -> list[tuple[int, str]]:
    """(family, address) for every address `host` resolves to (numeric hosts need no DNS)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise ListenError(f"cannot resolve {host!r}: {exc}") from exc
    return [(family, str(sockaddr[0])) for family, _, _, _, sockaddr in infos]


def is_loopback(addresses: Sequence[str]) -> bool:
    """True only if every address is a loopback address (127/8, ::1)."""
    return bool(addresses) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)


def _owner(uid: int) -> str:
    """`uid 1000 (alice)` for messages."""
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def check_socket_path(path: str) -> None:
    """Refuse a socket path that cannot work: empty, a NUL byte, longer than sun_path."""
    if not path:
        raise ListenError("--socket needs a path (e.g. $XDG_RUNTIME_DIR/decide.sock)")
    if "\0" in path:
        raise ListenError("--socket path contains a NUL byte")
    size = len(os.fsencode(os.path.abspath(path)))
    if size > MAX_UNIX_PATH_BYTES:
        raise ListenError(f"socket path is {size} bytes long; Unix sockets allow at most "
                          f"{MAX_UNIX_PATH_BYTES} (choose a shorter path, e.g. under $XDG_RUNTIME_DIR)")


def check_socket_directory(path: str) -> None:
    """Refuse a socket path whose directory someone else could write to: owned by another user
    (not us, not root), or writable by group/others without the sticky bit. Such a user could
    swap the socket for their own between our checks and a client's connect, and answer for us."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        info = os.stat(directory)
    except OSError as exc:
        raise ListenError(f"socket directory {directory}: {exc.strerror}") from exc
    if not stat.S_ISDIR(info.st_mode):
        raise ListenError(f"{directory} is not a directory")
    if info.st_uid not in (0, os.geteuid()):
        raise ListenError(f"socket directory {directory} belongs to {_owner(info.st_uid)}, who could replace "
                          "the socket; use a directory you or root own (e.g. $XDG_RUNTIME_DIR or /run/decide)")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
        raise ListenError(f"socket directory {directory} is writable by other users; use a directory only "
                          "you control (e.g. $XDG_RUNTIME_DIR or /run/decide)")


def socket_is_live(path: str) -> bool:
    """True if a server accepts connections on the Unix socket `path`."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError:
        return True  # e.g. EAGAIN (backlog full) or a timeout: something is there; do not remove it
    finally:
        probe.close()
    return True


def bind_unix(path: str) -> tuple[socket.socket, tuple[int, int]]:
    """A listening Unix socket created 0600, and its (st_dev, st_ino) so we remove only our file.

    A leftover socket file (a crashed server) is replaced only if it is ours and nothing listens
    on it; another user's socket or a path that is not a socket is never touched."""
    check_socket_path(path)
    check_socket_directory(path)
    if os.path.lexists(path):
        info = os.lstat(path)
        if not stat.S_ISSOCK(info.st_mode):
            raise ListenError(f"{path} exists and is not a socket; not replacing it")
        if info.st_uid != os.geteuid():
            raise ListenError(f"{path} is a socket of {_owner(info.st_uid)}; not replacing it "
                              "(remove it as that user, or choose another path)")
        if socket_is_live(path):
            raise ListenError(f"another server is listening on {path}")
        os.unlink(path)
        log.info("removed stale socket %s (nothing was listening)", path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # bind() creates the file with mode 0777 & ~umask: a tight umask makes it 0600 from the first
    # instant (a chmod after bind would leave a window). No other thread runs yet at this point.
    old_umask = os.umask(0o177)
    try:
        sock.bind(path)
    except OSError as exc:
        sock.close()
        raise ListenError(f"cannot bind {path}: {exc.strerror or exc}") from exc
    finally:
        os.umask(old_umask)
    sock.listen(LISTEN_BACKLOG)
    info = os.stat(path)
    return sock, (info.st_dev, info.st_ino)


def check_tcp_host(host: str, port: int, allow_remote: bool) -> list[tuple[int, str]]:
    """Resolve `host`; refuse a non-loopback address unless allow_remote."""
    resolved = resolve_host(host, port)
    if not allow_remote and not is_loopback([address for _, address in resolved]):
        raise ListenError(f"{host} is not a loopback address; decide has no authentication or TLS. "
                          "Pass --allow-remote to listen on it anyway")
    return resolved


def bind_tcp(host: str, port: int, allow_remote: bool) -> socket.socket:
    """A listening TCP socket; non-loopback addresses need allow_remote (and get a warning)."""
    resolved = check_tcp_host(host, port, allow_remote)
    if not is_loopback([address for _, address in resolved]):
        log.warning("listening on non-loopback %s: anyone who can reach this port can use the model "
                    "(no authentication, no TLS)", host)
    family, address = resolved[0]
    try:
        return socket.create_server((address, port), family=family, backlog=LISTEN_BACKLOG)
    except OSError as exc:
        raise ListenError(f"cannot bind {host}:{port}: {exc.strerror or exc}") from exc


def bind(address: ListenAddress, allow_remote: bool) -> tuple[socket.socket, Callable[[], None]]:
    """Bind the address; returns the socket and a cleanup that removes our socket file."""
    if address.path is not None:
        sock, identity = bind_unix(address.path)
        path = address.path

        def remove_socket_file() -> None:
            with contextlib.suppress(OSError):
                info = os.stat(path)
                if (info.st_dev, info.st_ino) == identity:  # never remove a successor's socket
                    os.unlink(path)
        return sock, remove_socket_file
    assert address.host is not None and address.port is not None
    return bind_tcp(address.host, address.port, allow_remote), lambda: None


class Acceptor:
    """Accepts connections on a listening socket inside an asyncio loop.

    asyncio's own server logs a traceback every second while accept() fails with EMFILE; here
    the first failure logs one warning, accepting pauses with a doubling delay (0.1 → 2 s; pending
    clients wait in the backlog), and one line says when accepting works again."""

    def __init__(self, listener: socket.socket, on_connection: Callable[[socket.socket], None]):
        self.listener = listener
        self.on_connection = on_connection
        self.loop: asyncio.AbstractEventLoop | None = None
        self.delay = 0.0
        self.retry: asyncio.TimerHandle | None = None
        self.failures = 0  # accept() failures in the current out-of-resources episode

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Begin accepting."""
        self.loop = loop
        self.listener.setblocking(False)
        loop.add_reader(self.listener.fileno(), self._accept)

    def close(self) -> None:
        """Stop accepting (the listening socket stays open until the caller closes it)."""
        if self.retry is not None:
            self.retry.cancel()
            self.retry = None
        if self.loop is not None:
            self.loop.remove_reader(self.listener.fileno())
            self.loop = None

    def _accept(self) -> None:
        for _ in range(ACCEPT_BURST):
            try:
                connection, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue  # the client gave up before we accepted it
            except OSError as exc:
                self._pause(exc)
                return
            if self.failures:
                log.info("accepting connections again (after %d refused attempts)", self.failures)
                self.failures, self.delay = 0, 0.0
            connection.setblocking(False)
            self.on_connection(connection)

    def _pause(self, exc: OSError) -> None:
        """Out of descriptors (or another accept error): stop watching the socket for a while."""
        assert self.loop is not None
        if not self.failures:
            reason = "out of file descriptors" if exc.errno in OUT_OF_RESOURCES else "accept failed"
            log.warning("%s (%s): new connections wait in the backlog; retrying with back-off",
                        reason, exc.strerror or exc)
        self.failures += 1
        self.delay = min(ACCEPT_RETRY_MAX_S, self.delay * 2 or ACCEPT_RETRY_MIN_S)
        self.loop.remove_reader(self.listener.fileno())
        self.retry = self.loop.call_later(self.delay, self._resume)

    def _resume(self) -> None:
        self.retry = None
        if self.loop is not None:
            self.loop.add_reader(self.listener.fileno(), self._accept)
