"""The socket server's settings (its flags are in server.py's add_arguments), apart from the server
so that its connections and swap ops can name them without importing the server."""

from __future__ import annotations

from dataclasses import dataclass, field

from runtime.protocol import DEFAULT_MAX_BATCH, Limits
from runtime.serve.listen import ListenAddress

DEFAULT_MAX_CONNECTIONS = 64
DEFAULT_QUEUE_SIZE = 256  # classify requests waiting for the engine, all connections together
DEFAULT_BATCH_DELAY_MS = 2.0
DEFAULT_IDLE_TIMEOUT_S = 60.0
DEFAULT_QUEUE_TIMEOUT_S = 10.0  # a request finding no place in the queue this long gets busy


@dataclass(frozen=True)
class ServerConfig:
    """Everything the server needs besides the service."""

    address: ListenAddress
    limits: Limits = field(default_factory=Limits)
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    queue_size: int = DEFAULT_QUEUE_SIZE
    batch_delay_ms: float = DEFAULT_BATCH_DELAY_MS
    max_batch_texts: int = DEFAULT_MAX_BATCH
    allow_remote: bool = False
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S  # 0 = never close idle connections
    queue_timeout_s: float = DEFAULT_QUEUE_TIMEOUT_S
