"""The mmpack exception hierarchy.

Every error mmpack raises on purpose derives from :class:`MmpackError` *and* from the builtin
exception a caller would naturally catch, so ``except ValueError`` keeps working for code that does
not know about mmpack.

A message that tells the caller which parameter to pass is built with :func:`with_params` from
text and :class:`Param` parts: ``str(exc)`` spells each parameter as Python (``overwrite=True``),
while a front end such as the ``mmpack`` command re-renders ``exc.message_parts`` with its own
spelling (``--overwrite``) by :func:`render_message`.  One mechanism, no string replacing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

__all__ = [
    "DefaultOrderWarning",
    "FormatError",
    "IngestError",
    "IngestWarning",
    "MissingDependencyError",
    "MmpackError",
    "Param",
    "RemoteAccessError",
    "RemoteError",
    "SlowReadWarning",
    "StateMismatchError",
    "StoreExistsError",
    "StoreNotFoundError",
    "render_message",
    "with_params",
]

_E = TypeVar("_E", bound=BaseException)
_ANY = object()


class MmpackError(Exception):
    """Base class of every error raised deliberately by mmpack."""


class Param:
    """A parameter named in an error message (``Param("on_error", "skip")``; without a value:
    the parameter itself, ``Param("format")``).  ``str()`` is the Python spelling,
    ``on_error='skip'`` / ``format=``."""

    __slots__ = ("name", "value")

    def __init__(self, name: str, value: Any = _ANY) -> None:
        self.name, self.value = name, value

    @property
    def has_value(self) -> bool:
        return self.value is not _ANY

    def __str__(self) -> str:
        return f"{self.name}={self.value!r}" if self.has_value else f"{self.name}="

    def __repr__(self) -> str:
        return f"Param({self.name!r}" + (f", {self.value!r})" if self.has_value else ")")


def with_params(exc_type: Callable[[str], _E], *parts: str | Param) -> _E:
    """``exc_type(message)``, the message being ``parts`` joined with each :class:`Param` spelled
    as Python; the parts are kept in ``exc.message_parts`` for :func:`render_message`."""
    exc = exc_type("".join(map(str, parts)))
    exc.message_parts = parts  # type: ignore[attr-defined]
    return exc


def render_message(exc: BaseException, spell: Callable[[Param], str]) -> str:
    """The message of ``exc`` with every :class:`Param` spelled by ``spell`` (``str(exc)`` for an
    exception not built by :func:`with_params`)."""
    parts = getattr(exc, "message_parts", None)
    if parts is None:
        return str(exc)
    return "".join(spell(p) if isinstance(p, Param) else str(p) for p in parts)


class FormatError(MmpackError, ValueError):
    """A store, packing plan or state on disk is malformed, corrupt, or of an unknown version."""


class StoreExistsError(MmpackError, FileExistsError):
    """The build target exists and ``overwrite=True`` was not given."""


class StoreNotFoundError(MmpackError, FileNotFoundError):
    """No store at the given path."""


class StateMismatchError(MmpackError, ValueError):
    """A saved state, plan or checkpoint belongs to other data or other parameters."""


class RemoteError(MmpackError, ConnectionError):
    """An object store could not be reached or kept failing after bounded retries."""


class RemoteAccessError(MmpackError, PermissionError):
    """An object store refused the credentials (wrong keys, no permission)."""


class IngestError(MmpackError, ValueError):
    """A build refused by its ``on_error`` policy, or a file that failed part-way after some of its
    documents were passed on; the message names the file, line and reason.  Nothing is written.
    ``report`` (when set) holds the counts up to the refusal."""

    report: Any = None  # the IngestReport (mmpack._src.ingest.report, a layer above this module)


class IngestWarning(UserWarning):
    """A skipped input record (``on_error="skip"``)."""


class DefaultOrderWarning(UserWarning):
    """A sampler over a remote store reads the block-window order because ``shuffle`` was left
    to its default (:func:`~mmpack._src.core.sample_order.check_shuffle`); the message names the order,
    its window, its measured cost in model quality and how to choose the global order.  Warned
    once per process and store."""


class SlowReadWarning(UserWarning):
    """A remote store read in a way that cannot fetch whole blocks (each sample a small range
    request: the global order, or the block order without a node cache); the message names the
    fix.  Warned once per process, store and way of reading."""


class MissingDependencyError(MmpackError, ImportError):
    """An optional dependency is not installed.  The message says what needs it and how to install
    it: the ``mmpack`` extra that brings it (``pip install -e ".[ingest]"`` in mmpack's checkout,
    as the README installs it), or the package
    itself where no extra does (``datasets``, ``transformers``).  ``package`` is the missing
    import, ``extra`` the extra (or None)."""

    def __init__(self, message: str, package: str | None = None, extra: str | None = None) -> None:
        if extra is not None:
            message += f' (the mmpack extra: pip install -e ".[{extra}]" in mmpack\'s checkout)'
        elif package is not None:
            message += f" (pip install {package})"
        super().__init__(message, name=package)
        self.package, self.extra = package, extra
