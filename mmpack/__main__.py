"""``python -m mmpack``: the ``mmpack`` command (see :mod:`mmpack.cli`)."""

import sys

from mmpack.cli import main

if __name__ == "__main__":
    sys.exit(main())
