"""``python -m mmpack``: the ``mmpack`` command (see :mod:`mmpack.cli.commands`)."""

import sys

from mmpack.cli.commands import main

if __name__ == "__main__":
    sys.exit(main())
