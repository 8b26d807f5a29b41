"""`python -m runtime` and the frozen `decide` binary start here."""

import sys


def _multiprocessing_child(argv: list[str]) -> bool:
    """The frozen binary started again by multiprocessing (decide score's worker processes and
    its resource tracker): PyInstaller's freeze_support runs those and exits."""
    return "--multiprocessing-fork" in argv or (
        len(argv) >= 3 and argv[-2] == "-c" and argv[-1].startswith("from multiprocessing."))


if getattr(sys, "frozen", False) and _multiprocessing_child(sys.argv):
    import multiprocessing

    multiprocessing.freeze_support()

from runtime.cli import main  # after the check above, which never returns for a child

if __name__ == "__main__":
    sys.exit(main())
