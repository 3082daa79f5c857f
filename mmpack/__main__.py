"""``python -m mmpack``: the ``mmpack`` command (see :mod:`mmpack._src.cli.commands`)."""

import sys

from mmpack._src.cli.commands import main

if __name__ == "__main__":
    sys.exit(main())
