"""`python -m runtime` and the frozen `decide` binary start here."""

import sys

from runtime.cli import main

if __name__ == "__main__":
    sys.exit(main())
