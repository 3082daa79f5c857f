"""The subset options of the commands that read a store: ``--where FIELD=VALUE`` (repeatable;
every condition holds) and ``--split NAME=FRACTION,... --split-part NAME [--split-seed N]``
(:meth:`TokenStore.split <mmpack.TokenStore.split>`).  The command then reads the
subset (:mod:`mmpack._src.store.subset`): ``info`` describes it, ``pack`` plans it, ``export`` and
``cp`` write its documents.  A value reads as an int, else a float, else a string (a category).
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_subset_arguments", "apply_subset"]


def add_subset_arguments(p: argparse.ArgumentParser) -> None:
    """``--where``, ``--split``, ``--split-part``, ``--split-seed``."""
    p.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="read only the documents whose field FIELD equals VALUE (repeatable: all hold)",
    )
    p.add_argument(
        "--split",
        default=None,
        metavar="NAME=FRACTION,...",
        help="split the documents by a keyed hash of each, e.g. train=0.99,validation=0.01, "
        "and read the part --split-part",
    )
    p.add_argument("--split-part", default=None, metavar="NAME", help="the part of --split read")
    p.add_argument(
        "--split-seed", type=int, default=0, metavar="N", help="the seed of --split (default 0)"
    )


def _value(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _pairs(text: str, flag: str, sep: str) -> list[tuple[str, str]]:
    out = []
    for item in text.split(sep):
        name, eq, value = item.partition("=")
        if not eq or not name.strip():
            raise ValueError(f"{flag} {text!r}: expected NAME=VALUE, got {item!r}")
        out.append((name.strip(), value.strip()))
    return out


def apply_subset(store: Any, args: argparse.Namespace) -> Any:
    """``store``, or its subset that the options name."""
    wheres = getattr(args, "where", None) or []
    if wheres:
        cond: dict[str, Any] = {}
        for text in wheres:
            for name, value in _pairs(text, "--where", "\0"):
                cond[name] = _value(value)
        try:
            store = store.where(**cond)
        except TypeError as exc:  # a flag's mistake: the CLI's error, in its words
            raise ValueError(f"--where {' '.join(wheres)}: {exc.args[0]}") from None
    split, part = getattr(args, "split", None), getattr(args, "split_part", None)
    if (split is None) != (part is None):
        raise ValueError("--split and --split-part go together (the fractions, the part read)")
    if split is not None:
        fractions: dict[str, Any] = {}
        for name, value in _pairs(split, "--split", ","):
            number = _value(value)
            if isinstance(number, str):
                raise ValueError(f"--split: the fraction of {name!r} is {value!r}, not a number")
            fractions[name] = number
        parts = store.split(fractions, seed=args.split_seed)
        if part not in parts:
            raise ValueError(f"--split-part {part!r} is not one of the parts {sorted(parts)}")
        store = parts[part]
    return store
