"""``python -m rlocks``: the ``rlocks`` command line (see :mod:`rlocks.cli`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
