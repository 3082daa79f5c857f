"""Joined stores: one store made of parts, each a complete store, without copying a token.

::

    manifest.py    OUT/mmpack-join.json: its format, checks and fingerprint (read and written)
    parts.py       JoinedStore and the backend that reads through the parts
    opening.py     open_join/detect_join: each part opened with the caller's options; cycles
    join.py        join(): writes a join without copying tokens, appends atomically

Registered in :mod:`mmpack._src.store.registry` when this package is imported (``import mmpack``
does): a folder holding ``mmpack-join.json`` is detected and opened as a ``"parts"`` store, and
``overwrite`` may replace the files a join holds of its own.  ``mmpack.join`` is
:func:`mmpack.join`.
"""

from __future__ import annotations

from mmpack._src.store.registry import register_detector, register_opener, register_owner

__all__: list[str] = []

register_opener("parts", "mmpack._src.joins.opening:open_join")
register_detector("mmpack._src.joins.opening:detect_join")
register_owner("mmpack._src.joins.manifest:join_entries")
