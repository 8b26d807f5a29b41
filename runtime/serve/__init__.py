"""Serving JSON lines: the service that answers a typed request (service.py), the stdio
transport, the socket server with its connections, admission and listeners, signals, systemd
notification, and live swaps of the package served."""
