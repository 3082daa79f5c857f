"""What every store offers over its documents: their fields, and subsets of them.

:class:`DocumentSets` is a base of :class:`~mmpack.TokenStore`: ``store.fields``
(:mod:`mmpack._src.store.fields`), ``store.field_categories(name)``, what a subset knows of its
parent (``store.parent``, ``parent_doc_ids``, ``parent_doc_starts``, ``split_depth``: its
backend's, None or 0 for a store that holds its tokens) and ``store.select`` / ``where`` /
``split``, whose subsets are ``TokenStore`` objects over a
:class:`~mmpack._src.store.subset.SubsetBackend` (made by ``TokenStore``'s ``_over``).  Each
call costs what :mod:`mmpack._src.store.subset` states.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from mmpack._src.store.fields import Fields, read_field
from mmpack._src.store.format import StoreMeta
from mmpack._src.store.subset import check_doc_ids, split_positions, where_positions

__all__ = ["DocumentSets"]


class DocumentSets:
    """Fields and subsets of a store's documents (a base of ``TokenStore``)."""

    _fields: Fields | None = None
    _meta: StoreMeta
    _backend: Any
    _location: str

    @property
    def parent(self) -> Any:
        """The store that holds a subset's tokens (a ``TokenStore``, never itself a subset);
        None for a store that holds its own tokens."""
        return self._backend.parent

    @property
    def parent_doc_ids(self) -> np.ndarray | None:
        """The parent document id of each document (int64, shape (num_docs,), sorted, unique,
        read-only) for a subset; None for a store that holds its own tokens (its ids are its
        own)."""
        return self._backend.parent_doc_ids

    @property
    def parent_doc_starts(self) -> np.ndarray | None:
        """Where each of a subset's documents starts in its parent's flat tokens (int64, shape
        (num_docs,), read-only: ``parent.offsets[parent_doc_ids]``, computed with the subset);
        None for a store that holds its own tokens."""
        return self._backend.parent_doc_starts

    @property
    def split_depth(self) -> int:
        """How many ``split`` calls made these documents (a subset of a part counts its
        part's; 0 for a store that holds its tokens): what keys this store's own ``split``
        (:mod:`mmpack._src.store.subset`)."""
        return int(self._backend.split_depth)

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
        """The fields the metadata names, read from the store's own files; a subset's are its
        parent's restricted to it."""
        if self.parent is not None:
            parent, ids = self.parent.fields, self.parent_doc_ids
            loaders = {name: (lambda name=name: parent[name][ids]) for name in parent}
            return Fields(loaders, {name: parent.categories(name) for name in parent}, parent.kinds)
        specs = getattr(self._meta, "fields", ())
        mapped = self._meta.backend == "memmap" and "://" not in self._location
        n = len(self)  # type: ignore[arg-type]
        loaders = {
            s.name: functools.partial(read_field, self._backend, s, n, mapped, False) for s in specs
        }
        kinds = {s.name: s.kind for s in specs}
        return Fields(loaders, {s.name: s.categories for s in specs}, kinds)

    def select(self, doc_ids: Any) -> Any:
        """The subset of documents ``doc_ids``: a ``TokenStore`` over them (no token is copied;
        :attr:`parent` is this store, or this store's parent when it is a subset).

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
        return self._subset(check_doc_ids(doc_ids, len(self)), self.split_depth)  # type: ignore[arg-type]

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
        return self._subset(where_positions(self, mask, equal), self.split_depth)

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
        own = self.parent_doc_ids
        ids = own if own is not None else np.arange(len(self), dtype=np.int64)  # type: ignore[arg-type]
        parts = split_positions(ids, fractions, seed, self.split_depth)
        return {name: self._subset(pos, self.split_depth + 1) for name, pos in parts.items()}

    def _subset(self, positions: np.ndarray, split_depth: int) -> Any:
        """The subset of this store's documents at ``positions`` (int64, sorted, unique): a
        store over the same parent when this store is a subset (a subset of a subset is a
        subset of the first parent)."""
        own = self.parent_doc_ids
        if own is None:
            return self._over(self, positions, split_depth)
        return self._over(self.parent, own[positions], split_depth)

    @staticmethod
    def _over(parent: Any, ids: np.ndarray, split_depth: int) -> Any:
        """A store over documents ``ids`` of ``parent`` (``TokenStore`` makes it)."""
        raise NotImplementedError
