"""``python -m rlocks demo``: see :mod:`rlocks.demo`."""

import sys

from .demo import _entry

if __name__ == "__main__":
    sys.exit(_entry(sys.argv[1:]))
