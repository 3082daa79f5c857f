"""Opening a store while a writer replaces it (mmpack._src.store.opening): a failure of the open
is raised only if the record still reads the same; otherwise the open is tried again."""

from __future__ import annotations

import pytest

from mmpack._src.store.opening import open_while_unchanged
from mmpack.errors import FormatError, StateMismatchError


@pytest.mark.parametrize("error", [FormatError, StateMismatchError, OSError])
def test_an_open_that_fails_while_the_store_is_replaced_is_tried_again(tmp_path, error):
    """A Zarr store's open reads its first offsets stripe, which refuses a store replaced since
    its record was read (``StateMismatchError``), as a memmap open can fail to map a file
    swapped away (``OSError``, ``FormatError``): each is retried on the new record."""
    records = iter(["v1", "v2", "v2", "v2"])
    tried: list[str] = []

    def open_one(raw: str) -> str:
        tried.append(raw)
        if raw == "v1":
            raise error("replaced under the open")
        return f"store {raw}"

    got = open_while_unchanged(tmp_path, lambda _: next(records), open_one, recheck=False)
    assert got == "store v2" and tried == ["v1", "v2"]


@pytest.mark.parametrize("error", [FormatError, StateMismatchError, OSError])
def test_an_open_that_fails_on_an_unchanged_store_raises(tmp_path, error):
    def open_one(raw: str) -> str:
        raise error("damaged")

    with pytest.raises(error, match="damaged"):
        open_while_unchanged(tmp_path, lambda _: "v1", open_one, recheck=False)
