"""The ``mmpack`` command (top layer).

::

    commands.py          main(): dispatch, error messages in flag terms; build, join, demo, bench
    inspect_commands.py  the subcommands that describe a store: info, show
    store_commands.py    the subcommands that work on a store: pack, verify, export, cp
    parser.py            build_parser(): one function per subcommand
    build_options.py     the options of build: what it reads, how it tokenizes, where it runs
    arguments.py         argparse types and the options several subcommands share
    demo.py              the demo and the packing comparison shared with ``mmpack pack``

Public through :mod:`mmpack.cli`: :func:`~mmpack.cli.main` and the demo helpers.
"""

__all__: list[str] = []
