"""``python -m mmpack``: the ``mmpack`` command (see :mod:`mmpack.cli.main`)."""

import sys

from mmpack.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
