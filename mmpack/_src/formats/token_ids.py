"""The token ids of other tools' files: the dtype they are served as, and the check that none is
negative.

Token ids are never negative, so a signed file (Megatron's default int32, an int32 ``.npy``) is
served as the little-endian unsigned dtype of the same width over the same bytes (zero copy).
A negative id would then read as a huge one (-1 as 4294967295), so signed files are checked:
:func:`check_ids_nonnegative` scans in chunks of 16 Mi tokens (one comparison against
``2**(bits - 1)`` per token, about the cost of a ``max`` over the mapping) and raises naming the
count and the first position.
"""

from __future__ import annotations

import numpy as np

from mmpack.errors import FormatError

__all__ = ["check_ids_nonnegative", "unsigned_view_dtype"]

_CHUNK = 1 << 24


def unsigned_view_dtype(dtype: np.dtype, where: str) -> np.dtype:
    """The little-endian unsigned dtype of the same width that serves a file's tokens
    (:class:`FormatError` naming ``where`` for non-integer or big-endian tokens)."""
    if dtype.kind not in "ui":
        raise FormatError(f"{where}: tokens of dtype {dtype} are not token ids (integers expected)")
    if dtype.byteorder == ">" or (dtype.byteorder == "=" and np.little_endian is False):
        raise FormatError(f"{where}: big-endian tokens ({dtype.str}) are not supported")
    return np.dtype(f"<u{dtype.itemsize}")


def check_ids_nonnegative(
    tokens: np.ndarray, file_dtype: np.dtype, where: object, first_token: int = 0
) -> None:
    """Raise :class:`FormatError` if the file of dtype ``file_dtype`` holds a negative id.

    Parameters
    ----------
    tokens : numpy.ndarray
        1-D, the unsigned view (:func:`unsigned_view_dtype`) of the file's ids (or of a piece of
        them, starting at token ``first_token``: named in the message).
    file_dtype : numpy.dtype
        The file's own dtype; unsigned dtypes need no check.
    where : object
        Named in the message (the file).
    """
    if file_dtype.kind != "i" or tokens.shape[0] == 0:
        return
    limit = 1 << (8 * file_dtype.itemsize - 1)
    count, first = 0, -1
    for lo in range(0, tokens.shape[0], _CHUNK):
        chunk = tokens[lo : lo + _CHUNK]
        if int(chunk.max()) >= limit:
            bad = chunk >= limit
            count += int(np.count_nonzero(bad))
            if first < 0:
                first = lo + int(np.argmax(bad))
    if count:
        value = int(tokens[first : first + 1].view(file_dtype.newbyteorder("<"))[0])
        raise FormatError(
            f"{where}: {count} negative token ids (the first at token {first_token + first}: "
            f"{value}; the file's dtype is {file_dtype}); token ids must be >= 0"
        )
