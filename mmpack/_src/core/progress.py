"""Progress bars of the long operations (builds, ``verify``, ``export``, copies): a total, a rate
and an ETA on stderr, and nothing at all unless asked.

:func:`progress_bar` turns a ``progress`` argument into a :class:`Progress`: ``False`` (the
library's default) gives a bar that does nothing; ``True`` a tqdm bar (``tqdm.auto``: a widget
in a notebook, text on stderr elsewhere); ``None`` a bar only when stderr is a terminal (what
the ``mmpack`` command passes unless ``--progress`` or ``--no-progress`` says otherwise), so
output captured by a pipe, a file or a test never holds a bar; an existing :class:`Progress`
is shared (an operation made of others, such as a join verifying its parts, advances one bar,
which its owner closes).  The total is the bytes the operation reads (inputs' bytes on disk,
compressed sizes for ``.gz``/``.zst``; a store's token and offsets bytes) or, where no size is
known, the documents (an in-memory dataset of known length); with neither the bar counts and
shows a rate but no ETA.  Cost: a lock and a few attribute updates per call; tqdm redraws at
most ten times a second.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

__all__ = ["Progress", "progress_bar", "stderr_is_tty"]


def stderr_is_tty() -> bool:
    """Whether stderr is a terminal (where ``progress=None`` shows a bar)."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


class Progress:
    """A bar over ``total`` units (None: unknown), advanced from any thread.

    Use as a context manager (the bar is closed on exit) or call :meth:`close`.  A disabled
    bar (``enabled=False``) does nothing and imports nothing.
    """

    def __init__(
        self, total: int | None, *, desc: str, unit: str = "B", enabled: bool = True
    ) -> None:
        self.total = total
        self.n = 0
        self._lock = threading.Lock()
        self._bar: Any = None
        if enabled:
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=total,
                desc=desc,
                unit=unit,
                unit_scale=True,
                unit_divisor=1024 if unit == "B" else 1000,
                file=sys.stderr,
                smoothing=0.1,
                dynamic_ncols=True,
            )

    @property
    def enabled(self) -> bool:
        return self._bar is not None

    def update(self, n: int) -> None:
        """Advance by ``n`` units."""
        if n and self._bar is not None:
            with self._lock:
                self.n += n
                self._bar.update(n)

    def advance_to(self, position: int) -> None:
        """Advance to ``position`` units done (never backwards)."""
        if self._bar is not None:
            with self._lock:
                step = position - self.n
                if step > 0:
                    self.n = position
                    self._bar.update(step)

    def note(self, text: str) -> None:
        """Show ``text`` after the bar (counts, a rate in other units)."""
        if self._bar is not None:
            with self._lock:
                self._bar.set_postfix_str(text, refresh=False)

    def close(self) -> None:
        if self._bar is not None:
            with self._lock:
                self._bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def progress_bar(progress: Any, total: int | None, *, desc: str, unit: str = "B") -> Progress:
    """The bar that ``progress`` asks for (see the module docstring).

    Parameters
    ----------
    progress : bool, None or Progress
        ``False``: none; ``True``: a bar; ``None``: a bar when stderr is a terminal; a
        :class:`Progress`: that bar, shared (closing the returned one leaves it open).
    total : int or None
        Units to do; None when unknown (a count and a rate, no ETA).
    desc, unit : str
        The bar's label and unit (``"B"``: bytes, scaled by 1024).

    Raises
    ------
    TypeError
        ``progress`` is none of these.
    """
    if isinstance(progress, Progress):
        return _Shared(progress)
    if progress is None:
        progress = stderr_is_tty()
    if not isinstance(progress, bool):
        raise TypeError(f"progress must be True, False or None, got {progress!r}")
    return Progress(total, desc=desc, unit=unit, enabled=progress)


class _Shared(Progress):
    """Another operation's bar: advances it, never closes it."""

    def __init__(self, bar: Progress) -> None:
        self._of = bar

    @property
    def enabled(self) -> bool:
        return self._of.enabled

    def update(self, n: int) -> None:
        self._of.update(n)

    def advance_to(self, position: int) -> None:
        self._of.advance_to(position)

    def note(self, text: str) -> None:
        self._of.note(text)

    def close(self) -> None:
        pass
