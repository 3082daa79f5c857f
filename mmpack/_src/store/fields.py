"""Per-document fields: one value per document (a source, a language, a quality score), stored as
one column per field next to the offsets.

A field's values are integers (stored ``<i8``), floats (``<f8``) or strings; strings are stored
as *categories*: a table of the distinct strings, sorted (in the metadata record), and one
``<i4`` code per document, the string's index in the table.  Each column is a little-endian file
of ``num_docs`` values in the store folder, :data:`_FIELD_FILE` ``field.<name>.bin``, whose CRC-32
the record names (``"fields"``: a list of ``{"name", "kind", "dtype", "file", "crc32"[,
"categories"]}``, in the order given at build); the record enters the store's fingerprint, so a
field that changed makes another store.  Reading: ``store.fields[name]`` is the column as a
read-only array: the file memory-mapped for a local memmap store (nothing read until used), the
file's bytes read once and checked against their CRC-32 otherwise (Zarr, remote stores); a
categorical field reads as its codes, ``store.field_categories(name)`` gives the table.

Costs: writing a column is one pass over its values (O(n); strings: one ``np.unique``, O(n log
n)); ``verify()`` reads every column once (8 or 4 bytes per document), and counts those bytes
in its total (as ``store.nbytes`` does).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mmpack.errors import FormatError

__all__ = [
    "Field",
    "FieldSpec",
    "Fields",
    "check_field_name",
    "check_fields",
    "check_same_fields",
    "commit_fields",
    "concat_fields",
    "fields_nbytes",
    "fields_record",
    "parse_fields_record",
    "read_field",
    "verify_fields",
]

_FIELD_FILE = "field.{}.bin"
"""The file name of a field's column in a store folder (or object under its data prefix)."""
MAX_CATEGORY_CHARS = 1024
"""The longest string a categorical field holds (fields are short labels, not text)."""
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
_DTYPES: dict[str, np.dtype] = {
    "int": np.dtype("<i8"),
    "float": np.dtype("<f8"),
    "category": np.dtype("<i4"),
}


def check_field_name(name: Any) -> str:
    """A field name: a string of letters, digits and ``_``, not starting with a digit, at most
    64 characters (it names a file).  ``ValueError`` (``TypeError`` for a non-string) naming it."""
    if not isinstance(name, str):
        raise TypeError(f"a field name is a string, got {name!r}")
    if not _NAME.match(name):
        raise ValueError(
            f"field name {name!r} is not allowed: use letters, digits and '_', not starting "
            "with a digit, at most 64 characters"
        )
    return name


@dataclass(frozen=True)
class Field:
    """A field's column in memory: ``values`` (shape (num_docs,), ``<i8``, ``<f8``, or ``<i4``
    codes into ``categories``) and, for a categorical field, its sorted table of strings."""

    values: np.ndarray
    categories: tuple[str, ...] | None = None

    @property
    def kind(self) -> str:
        """``"int"``, ``"float"`` or ``"category"``."""
        if self.categories is not None:
            return "category"
        return "float" if self.values.dtype.kind == "f" else "int"


def _as_field(name: str, values: Any) -> Field:
    """The column of field ``name`` from the user's ``values`` (one per document): a
    :class:`Field` as it is, else a 1-D sequence of ints (bools count as ints), of numbers (ints
    and floats: floats), or of strings (categories).

    Raises
    ------
    TypeError
        Not a 1-D sequence, or values of another type (``None``, bytes, a mix of strings and
        numbers); the message names the field and the first such position.
    ValueError
        A string longer than :data:`MAX_CATEGORY_CHARS`, or an integer beyond int64.
    """
    if isinstance(values, Field):
        return values
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise TypeError(
            f"field {name!r}: values must be a sequence with one value per document, "
            f"got {type(values).__name__}"
        )
    arr = np.asarray(values) if isinstance(values, np.ndarray) else None
    if arr is not None and arr.ndim == 1 and arr.dtype.kind in "biuf":
        return _numeric(name, arr)
    items = list(values)
    if items and all(isinstance(v, str) for v in items):
        return _categories(name, items)
    strings = bool(items) and isinstance(items[0], str)  # the kind of value 0
    for p, v in enumerate(items):
        if isinstance(v, str) != strings or not isinstance(
            v, (str, int, float, np.integer, np.floating, np.bool_)
        ):
            raise TypeError(
                f"field {name!r}: value {p} is {v!r}; a field holds numbers or strings (all of "
                "one kind), one per document"
            )
    try:
        arr = np.asarray(items) if items else np.zeros(0, dtype=np.int64)
    except OverflowError:
        raise ValueError(f"field {name!r}: an integer does not fit in 64 bits") from None
    if arr.dtype.kind == "O":
        raise ValueError(f"field {name!r}: an integer does not fit in 64 bits")
    return _numeric(name, arr)


def _numeric(name: str, arr: np.ndarray) -> Field:
    if arr.ndim != 1:
        raise TypeError(f"field {name!r}: values have shape {arr.shape}; give one per document")
    if arr.dtype.kind == "f":
        return Field(arr.astype(_DTYPES["float"]))
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"field {name!r}: value {int(arr.max())} does not fit in int64")
    return Field(arr.astype(_DTYPES["int"]))


def _categories(name: str, items: list[str]) -> Field:
    long = next((p for p, v in enumerate(items) if len(v) > MAX_CATEGORY_CHARS), None)
    if long is not None:
        raise ValueError(
            f"field {name!r}: value {long} has {len(items[long])} characters; categories are "
            f"short labels of at most {MAX_CATEGORY_CHARS}"
        )
    table, codes = np.unique(np.array(items, dtype=object), return_inverse=True)
    return Field(codes.astype(_DTYPES["category"]), tuple(str(s) for s in table))


# --------------------------------------------------------------------------------- on disk
@dataclass(frozen=True)
class FieldSpec:
    """A field as the metadata record names it."""

    name: str
    kind: str
    crc32: int
    categories: tuple[str, ...] | None = None

    @property
    def dtype(self) -> np.dtype:
        return _DTYPES[self.kind]

    @property
    def file(self) -> str:
        return _FIELD_FILE.format(self.name)

    def to_json(self) -> dict[str, Any]:
        rec: dict[str, Any] = {
            "name": self.name,
            "kind": self.kind,
            "dtype": self.dtype.str,
            "file": self.file,
            "crc32": self.crc32,
        }
        if self.categories is not None:
            rec["categories"] = list(self.categories)
        return rec


def fields_record(specs: tuple[FieldSpec, ...]) -> list[dict[str, Any]]:
    """The ``"fields"`` section of a metadata record."""
    return [s.to_json() for s in specs]


def parse_fields_record(rec: Any, where: Path) -> tuple[FieldSpec, ...]:
    """The ``"fields"`` section of a metadata record checked (absent: no fields);
    :class:`FormatError` naming the defect."""
    if rec is None:
        return ()
    if not isinstance(rec, list):
        raise FormatError(f"{where}: malformed fields record {rec!r}")
    specs = []
    for r in rec:
        try:
            cats = r.get("categories")
            spec = FieldSpec(
                check_field_name(r["name"]),
                r["kind"],
                int(r["crc32"]),
                None if cats is None else tuple(cats),
            )
            ok = spec.kind in _DTYPES and r["dtype"] == spec.dtype.str and r["file"] == spec.file
            ok = ok and (spec.categories is None) == (spec.kind != "category")
            ok = ok and all(isinstance(c, str) for c in spec.categories or ())
        except (KeyError, TypeError, ValueError, AttributeError):
            ok = False
        if not ok:
            raise FormatError(f"{where}: malformed field record {r!r}")
        specs.append(spec)
    if len({s.name for s in specs}) != len(specs):
        raise FormatError(f"{where}: the fields record names a field twice")
    return tuple(specs)


def _write_fields(folder: Path, fields: dict[str, Field], fsync: bool) -> tuple[FieldSpec, ...]:
    """Write every column into ``folder`` (:data:`_FIELD_FILE`) and return their records."""
    import os

    specs = []
    for name, field in fields.items():
        data = np.ascontiguousarray(field.values.astype(_DTYPES[field.kind], copy=False))
        with open(folder / _FIELD_FILE.format(name), "wb") as f:
            f.write(data.tobytes())
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        crc = zlib.crc32(memoryview(data).cast("B"))  # type: ignore[arg-type]
        specs.append(FieldSpec(name, field.kind, crc, field.categories))
    return tuple(specs)


def read_field(backend: Any, spec: FieldSpec, n: int, mapped: bool, check: bool) -> np.ndarray:
    """The column of ``spec`` (read-only, shape (n,)): memory-mapped from the store folder when
    ``mapped``, else read with ``backend.read_file`` and checked against its CRC-32 (also when
    ``check``).  :class:`FormatError` for a missing file, another size, or another checksum."""
    where = backend.path / spec.file
    size = n * spec.dtype.itemsize
    if mapped and not check:
        try:
            got = where.stat().st_size
        except OSError:
            raise FormatError(f"{where}: the field file is missing; rebuild the store") from None
        if got != size:
            raise FormatError(f"{where}: {got} bytes, a field of {n} documents has {size}")
        if n == 0:
            return np.zeros(0, dtype=spec.dtype)
        return np.memmap(where, dtype=spec.dtype, mode="r", shape=(n,))
    try:
        data = backend.read_file(spec.file)
    except FileNotFoundError:
        raise FormatError(f"{where}: the field file is missing; rebuild the store") from None
    if len(data) != size:
        raise FormatError(f"{where}: {len(data)} bytes, a field of {n} documents has {size}")
    if zlib.crc32(data) != spec.crc32:
        raise FormatError(f"field {spec.name!r} of {backend.path}: its file fails its checksum")
    return np.frombuffer(data, dtype=spec.dtype)


def fields_nbytes(specs: tuple[FieldSpec, ...], n: int) -> int:
    """Bytes of the columns ``specs`` of a store of ``n`` documents (8 per int or float value,
    4 per category code)."""
    return n * sum(spec.dtype.itemsize for spec in specs)


def verify_fields(backend: Any, specs: tuple[FieldSpec, ...], n: int, on_bytes: Any = None) -> int:
    """Read every column of ``specs`` through ``backend.read_file`` and check it against its
    CRC-32 (:func:`read_field`, :class:`FormatError` naming the first bad one); ``on_bytes`` (a
    progress bar's ``update``) is told each column's size.  Returns the bytes checked."""
    for spec in specs:
        read_field(backend, spec, n, False, True)
        if on_bytes is not None:
            on_bytes(n * spec.dtype.itemsize)
    return fields_nbytes(specs, n)


class Fields(Mapping[str, np.ndarray]):
    """The fields of a store: a read-only mapping from name to column (``numpy.ndarray``, shape
    (num_docs,), not writeable; a categorical field's codes), loaded on first access, plus
    :meth:`categories`."""

    def __init__(
        self,
        loaders: dict[str, Any],
        categories: dict[str, tuple[str, ...] | None],
        kinds: dict[str, str],
    ) -> None:
        self._loaders = loaders
        self._categories = categories
        self.kinds = dict(kinds)
        """Each field's kind, ``"int"``, ``"float"`` or ``"category"``, by name (no data read)."""
        self._cache: dict[str, np.ndarray] = {}

    @classmethod
    def of(cls, columns: dict[str, Field]) -> Fields:
        """The fields of columns held in memory."""
        return cls(
            {n: (lambda f=f: f.values) for n, f in columns.items()},
            {n: f.categories for n, f in columns.items()},
            {n: f.kind for n, f in columns.items()},
        )

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._loaders:
            raise KeyError(f"no field {name!r} (the store has {sorted(self._loaders)})")
        if name not in self._cache:
            arr = self._loaders[name]()
            if arr.flags.writeable:
                arr = arr.view()
                arr.flags.writeable = False
            self._cache[name] = arr
        return self._cache[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._loaders)

    def __len__(self) -> int:
        return len(self._loaders)

    def categories(self, name: str) -> tuple[str, ...] | None:
        """The sorted strings of categorical field ``name`` (its codes index them), or None for a
        numeric field."""
        if name not in self._loaders:
            raise KeyError(f"no field {name!r} (the store has {sorted(self._loaders)})")
        return self._categories[name]

    def field(self, name: str) -> Field:
        """Field ``name`` as a :class:`Field` (values and categories)."""
        return Field(self[name], self.categories(name))

    def summary(self, top: int = 3) -> dict[str, dict[str, Any]]:
        """Per field: its kind and dtype, and ``min``/``max``/``mean`` of a numeric field or
        the number of ``categories`` and the ``top`` most frequent with their counts (what
        ``mmpack info`` shows).  Reads every column once."""
        out: dict[str, dict[str, Any]] = {}
        for name, kind in self.kinds.items():
            values = self[name]
            rec: dict[str, Any] = {"kind": kind, "dtype": values.dtype.name}
            cats = self.categories(name)
            if cats is not None:
                counts = np.bincount(values, minlength=len(cats))
                best = np.argsort(-counts, kind="stable")[:top]
                rec["categories"] = len(cats)
                rec["top"] = {cats[int(k)]: int(counts[int(k)]) for k in best}
            elif values.size:
                rec.update(min=values.min().item(), max=values.max().item())
                rec["mean"] = float(values.mean())
            out[name] = rec
        return out

    def __repr__(self) -> str:
        return f"Fields({self.kinds})"


def _kinds_of(parts: list[Fields]) -> dict[str, str]:
    """The field kinds of the first part with documents (an empty part's strings read as
    ints: it had no value to tell)."""
    for p in parts:
        if p.kinds and any(len(p[n]) for n in p.kinds):
            return p.kinds
    return parts[0].kinds if parts else {}


def check_same_fields(parts: list[Fields], where: Any) -> None:
    """``ValueError`` naming the first of ``parts`` whose field names, or kinds (a part without
    documents has any), differ from the others': a join's documents all have the same fields."""
    want = _kinds_of(parts)
    for k, p in enumerate(parts):
        same = sorted(p.kinds) == sorted(want) and all(
            p.kinds[n] == want[n] or not len(p[n]) for n in want
        )
        if not same:
            raise ValueError(
                f"{where}: part {k} has fields {p.kinds} but the others have {want}; join "
                "stores with the same fields"
            )


def concat_fields(parts: list[Fields], where: Any) -> dict[str, Field]:
    """The fields of stores joined in order: each field's values concatenated (categorical
    fields over the sorted union of the parts' tables, codes remapped).  ``ValueError`` as
    :func:`check_same_fields`.  O(documents + categories)."""
    check_same_fields(parts, where)
    out: dict[str, Field] = {}
    for name, kind in _kinds_of(parts).items():
        if kind != "category":
            dtype = _DTYPES[kind]
            out[name] = Field(np.concatenate([p[name].astype(dtype) for p in parts]))
            continue
        table = sorted(set().union(*(p.categories(name) or () for p in parts)))
        index = {c: i for i, c in enumerate(table)}
        codes = [
            np.array([index[c] for c in p.categories(name) or ()] + [0], dtype="<i4")[p[name]]
            for p in parts
        ]
        out[name] = Field(np.concatenate(codes).astype("<i4"), tuple(table))
    return out


def check_fields(fields: Any) -> dict[str, Field]:
    """``build``'s ``fields``: None, or a dict of field names to values (:func:`_as_field`);
    the number of values is checked against the documents by :func:`commit_fields`."""
    if fields is None:
        return {}
    if not isinstance(fields, Mapping):
        raise TypeError(
            f"fields must be a dict of field names to per-document values, got {fields!r}"
        )
    return {check_field_name(name): _as_field(name, v) for name, v in fields.items()}


def commit_fields(
    folder: Path, fields: dict[str, Field], n: int, order: np.ndarray | None, fsync: bool
) -> tuple[FieldSpec, ...]:
    """Write the columns of a build of ``n`` documents into ``folder``, each in the stored order
    (``order``: the input document of each store position, for ``shuffle_docs``).

    Raises
    ------
    ValueError
        A field whose number of values is not ``n`` (nothing is written).
    """
    for name, field in fields.items():
        if field.values.shape[0] != n:
            raise ValueError(
                f"field {name!r} has {field.values.shape[0]} values but the store has {n} "
                "documents; give one value per document"
            )
    if order is not None:
        fields = {k: Field(f.values[order], f.categories) for k, f in fields.items()}
    return _write_fields(folder, fields, fsync)
