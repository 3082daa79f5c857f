"""The mmpack exception hierarchy.

Every error mmpack raises on purpose derives from :class:`MmpackError` *and* from the builtin
exception a caller would naturally catch, so ``except ValueError`` keeps working for code that does
not know about mmpack.
"""

from __future__ import annotations

__all__ = [
    "FormatError",
    "MmpackError",
    "RemoteAccessError",
    "RemoteError",
    "StateMismatchError",
    "StoreExistsError",
    "StoreNotFoundError",
]


class MmpackError(Exception):
    """Base class of every error raised deliberately by mmpack."""


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
