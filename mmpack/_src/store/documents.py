"""What every store offers over its documents: their fields, and subsets of them.

:class:`DocumentSets` is a base of :class:`~mmpack.TokenStore`: ``store.fields``
(:mod:`mmpack._src.store.fields`), ``store.field_categories(name)``, ``store.parent_doc_ids`` (None
for a store that holds its tokens) and ``store.select`` / ``where`` / ``split``, whose subsets
are :class:`~mmpack._src.store.subset.SubsetStore` (reached through :data:`mmpack._src.store.registry.SUBSETS`,
since that module builds on ``TokenStore``).  Each call costs what its function in
:mod:`mmpack._src.store.subset` states.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from mmpack._src.store.fields import Fields, read_field
from mmpack._src.store.format import StoreMeta
from mmpack._src.store.registry import SUBSETS, load

__all__ = ["DocumentSets"]


class DocumentSets:
    """Fields and subsets of a store's documents (a base of ``TokenStore``)."""

    _fields: Fields | None = None
    _meta: StoreMeta
    _backend: Any
    _location: str

    @property
    def parent_doc_ids(self) -> np.ndarray | None:
        """The parent document id of each document (int64, shape (num_docs,)) for a subset;
        None for a store that holds its own tokens (its ids are its own)."""
        return None

    @property
    def fields(self) -> Fields:
        """The per-document fields: a read-only mapping from name to an array of shape
        (num_docs,) (``int64``, ``float64``, or the ``int32`` codes of a categorical field, see
        :meth:`field_categories`); empty for a store built without fields."""
        if self._fields is None:
            self._fields = self._open_fields()
        return self._fields

    def field_categories(self, name: str) -> tuple[str, ...] | None:
        """The sorted strings of categorical field ``name`` (``fields[name]`` holds indices into
        them), None for a numeric field; ``KeyError`` for an unknown name."""
        return self.fields.categories(name)

    def _open_fields(self) -> Fields:
        """The fields the metadata names, read from the store's own files."""
        specs = getattr(self._meta, "fields", ())
        mapped = self._meta.backend == "memmap" and "://" not in self._location
        n = len(self)  # type: ignore[arg-type]
        loaders = {
            s.name: functools.partial(read_field, self._backend, s, n, mapped, False) for s in specs
        }
        kinds = {s.name: s.kind for s in specs}
        return Fields(loaders, {s.name: s.categories for s in specs}, kinds)

    def select(self, doc_ids: Any) -> Any:
        """The subset of documents ``doc_ids`` (a :class:`~mmpack._src.store.subset.SubsetStore`; no
        token is copied).

        Parameters
        ----------
        doc_ids : array_like of int, shape (k,)
            Document ids of this store, sorted and unique.

        Raises
        ------
        TypeError
            Not a 1-D sequence of integers.
        IndexError
            An id outside ``[0, len(store))``.
        ValueError
            Ids not sorted and unique (the first offending one is named).
        """
        return load(SUBSETS["select"])(self, doc_ids)

    def where(self, mask: Any = None, **equal: Any) -> Any:
        """The subset of documents where ``mask`` (bool, shape (num_docs,)) is true and each
        named field equals its value (``where(source=3)``; a categorical field compares with
        one of its strings, or a code).

        Raises
        ------
        ValueError
            No field of that name, a mask of another shape or dtype, or a string that is not
            one of the field's categories.
        TypeError
            A string for a numeric field, or a value that is neither a number nor a string.
        """
        return load(SUBSETS["where"])(self, mask, **equal)

    def split(self, fractions: dict[str, float], seed: Any = 0) -> dict[str, Any]:
        """Disjoint subsets covering the store, e.g. ``split({"train": 0.99, "validation":
        0.01}, seed=0)``: each document goes to one part by a keyed hash of its (parent)
        document id, so its part never changes when documents are appended
        (:mod:`mmpack._src.store.subset`).

        Raises
        ------
        ValueError
            A fraction outside ``[0, 1]``, or fractions not summing to 1.
        TypeError
            Not a dict of names to numbers; a seed that is not an int or a tuple of ints.
        """
        return load(SUBSETS["split"])(self, fractions, seed)
