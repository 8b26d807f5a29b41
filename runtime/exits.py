"""decide's exit codes: the process's contract with whoever started it (README, docs/limits.md).

Stdlib only and below every layer: the CLI, `decide score` and its worker pool all return them.
"""

EXIT_OK = 0
EXIT_INTERNAL = 1  # a bug: one stderr line (DECIDE_DEBUG=1 adds the traceback)
EXIT_USAGE = 2  # bad arguments, or an override this CPU/package cannot honour
EXIT_CPU_UNSUPPORTED = 3
EXIT_PACKAGE = 4  # model package (or platforms/*.json) missing, malformed, checksum mismatch, unsigned
# or wrongly signed while trusted keys are configured, no usable variant
EXIT_SELFTEST_FAILED = 5
EXIT_OUTPUT_FAILED = 6  # stdout cannot take the answers (full disk, closed, bad fd); not EPIPE
EXIT_INTERRUPTED = 130  # a stop signal (Ctrl-C, SIGTERM, SIGQUIT) before serving started
