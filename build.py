#!/usr/bin/env python3
"""Build the decide bundle: dist/decide-<version>-linux-<arch>.zip (+ .sha256, + build manifest).

    python3 build.py                 # host architecture (x86_64)
    python3 build.py --arch aarch64  # arm64 on an x86_64 host (cross-compiled, PyInstaller under qemu)
    python3 build.py --help

The steps live in bundle_spec/ (one module each; the order in bundle_spec/pipeline.py). Why a
Debian 11 root: PyInstaller copies libpython, libstdc++, libffi … from the machine it runs on, so
the bundle needs at least that machine's glibc. Caches live in ~/.cache/decide-build (--cache);
a fresh machine needs only the Debian and PyPI registries. Measured times (from nothing, cached)
are in README, "The bundle".
Exit codes: 0 built, 1 build failed, 2 refused (unsupported arch, not root, bad arguments).
"""

import sys

import runtime  # noqa: F401  (its __init__ turns ORT telemetry off for the build and every process it starts)
from bundle_spec.pipeline import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
