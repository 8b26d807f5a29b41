"""`python -m runtime` and the frozen `decide` binary start here."""

import sys

if "--multiprocessing-fork" in sys.argv:  # a `decide score` worker process of the frozen binary
    import multiprocessing

    multiprocessing.freeze_support()

from runtime.cli import main  # after the worker check, which never returns

if __name__ == "__main__":
    sys.exit(main())
