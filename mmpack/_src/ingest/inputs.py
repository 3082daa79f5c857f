"""What the inputs of :func:`mmpack.ingest.ingest` are: format detection and input
resolution.

A path, a glob (its matches sorted), a list of them, a folder saved by Hugging Face ``datasets``,
a ``datasets``-like object or an iterable becomes a list of sources
(:mod:`mmpack._src.ingest.readers`), each tagged with the input as the caller named it (the unit of the
``on_error="skip-some"`` rule).  A file's format comes from a ``format=`` pattern, else
``format=``, else its extension (after an optional ``.gz`` or ``.zst``) looked up in the table of
``TEXT_EXTENSIONS`` and the JSON and Parquet extensions.  Nothing of the store being built is
ever an input: a glob's matches inside it (its files, a join's parts, its cache) or inside its
builds' temporary folders are left out, and such a path named explicitly is refused.

Cost: one ``glob`` and one ``stat`` a path (and two ``realpath`` a path when the output is
local); nothing is read here (a saved dataset is opened lazily by ``datasets.load_from_disk``).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from mmpack._src.ingest.chat_readers import _ChatJsonFile, _ChatObjectSource, _ChatParquetFile
from mmpack._src.ingest.object_source import _ObjectSource
from mmpack._src.ingest.readers import _JsonFile, _ParquetFile, _TextFile
from mmpack._src.ingest.report import _Input
from mmpack._src.store.publish import inside_build
from mmpack.errors import MissingDependencyError, Param, with_params

__all__ = ["FORMATS", "TEXT_EXTENSIONS", "size_of"]

FORMATS = ("json", "jsonl", "parquet", "text")
"""Accepted ``format`` names (``None``: from each file's extension)."""

TEXT_EXTENSIONS = (
    ".txt",
    ".text",
    ".md",
    ".markdown",
    ".rst",
    ".adoc",
    ".org",
    ".tex",
    ".py",
    ".pyi",
    ".c",
    ".h",
    ".cc",
    ".cpp",
    ".cxx",
    ".hpp",
    ".hh",
    ".cu",
    ".java",
    ".kt",
    ".scala",
    ".go",
    ".rs",
    ".rb",
    ".php",
    ".pl",
    ".lua",
    ".jl",
    ".r",
    ".swift",
    ".cs",
    ".js",
    ".mjs",
    ".jsx",
    ".ts",
    ".tsx",
    ".sh",
    ".bash",
    ".sql",
    ".html",
    ".htm",
    ".xml",
    ".css",
    ".yaml",
    ".yml",
    ".toml",
    ".ini",
    ".cfg",
)
"""Extensions read as text (one document per file, or per line with ``lines``) by default."""

_EXTENSIONS = {
    **dict.fromkeys(TEXT_EXTENSIONS, "text"),
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".parquet": "parquet",
    ".pq": "parquet",
}
_DATASET_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")


def _resolve_inputs(
    inputs: Any,
    *,
    field: str,
    lines: bool,
    fmt: Any,
    extensions: Mapping[str, str] = _EXTENSIONS,
    split: str | None = None,
    output: Path | None = None,
    loss_on: str | None = None,
    keys: tuple[str, ...] = (),
) -> list:
    """The sources of ``inputs``, each tagged with its input as named; nothing of the store
    ``output`` (or of its builds' temporary folders) is ever one of them
    (:func:`_paths_of`).  With ``loss_on`` the sources read chat records
    (:mod:`mmpack._src.ingest.chat_readers`); with ``keys`` (the keys ``fields=`` names) each
    document carries its record's values of them."""
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    if isinstance(inputs, (list, tuple)):
        sources = []
        for item in inputs:
            if not isinstance(item, (str, os.PathLike)):
                raise TypeError(
                    f"a list of inputs must hold paths or globs, got {type(item).__name__}; "
                    "to ingest in-memory texts pass an iterator, e.g. iter(texts)"
                )
            paths = _paths_of(os.fspath(item), output)
            sources.extend(
                _grouped(
                    _sources_for_paths(paths, field, lines, fmt, extensions, split, loss_on, keys),
                    os.fspath(item),
                )
            )
        return sources
    if isinstance(inputs, bytes):
        raise TypeError("inputs must be a path, a list of paths or an iterable of texts, not bytes")
    if hasattr(inputs, "iter") or isinstance(inputs, Iterable):
        return _grouped(
            _object_sources(inputs, field, type(inputs).__name__, split, None, loss_on, keys),
            type(inputs).__name__,
        )
    raise TypeError(
        f"inputs must be a path, a glob, a list of them, a dataset or an iterable of texts, "
        f"got {type(inputs).__name__}"
    )


def _paths_of(item: str, output: Path | None) -> list[Path]:
    """The paths an input names: itself, or a glob's matches (sorted; files and saved datasets),
    leaving out whatever belongs to ``output``, the store being built (its files, its parts, its
    builds' temporary folders: :func:`~mmpack._src.store.publish.inside_build`).

    Raises
    ------
    FileNotFoundError
        The path does not exist, or the glob matches nothing (outside ``output``) or only folders.
    ValueError
        A path named explicitly lies inside ``output``.
    """
    if glob.has_magic(item):
        matches = sorted(glob.glob(item, recursive=True))
        if not matches:
            raise FileNotFoundError(f"no file matches {item!r}")
        if output is not None:
            matches = [m for m in matches if not inside_build(m, output)]
            if not matches:
                raise FileNotFoundError(
                    f"{item!r} matches only the store being built ({str(output)!r}) and what "
                    "lies in it, which is never read as input"
                )
        paths = [Path(m) for m in matches if Path(m).is_file() or _is_saved_dataset(Path(m))]
        if not paths:
            raise FileNotFoundError(f"{item!r} matches only folders, no files")
        return paths
    if output is not None and inside_build(item, output):
        raise with_params(
            ValueError,
            f"input {item!r} lies inside ",
            Param("output", str(output)),
            ", the store this build writes (and replaces): its files are never read as input",
        )
    if not Path(item).exists():
        raise FileNotFoundError(f"input {item!r} does not exist")
    return [Path(item)]


def _sources_for_paths(
    paths: list[Path],
    field: str,
    lines: bool,
    fmt: Any,
    extensions: Mapping[str, str],
    split: str | None = None,
    loss_on: str | None = None,
    keys: tuple[str, ...] = (),
) -> list:
    out = []
    for path in paths:
        if path.is_dir():
            if not _is_saved_dataset(path):
                raise ValueError(
                    f"input {str(path)!r} is a folder but not a saved Hugging Face dataset; "
                    f"pass its files or a glob such as '{path}/**/*.jsonl'"
                )
            dataset = _load_saved_dataset(path)
            out.extend(
                _object_sources(dataset, field, str(path), split, size_of(path), loss_on, keys)
            )
            continue
        kind = _pattern_format(path, fmt) if isinstance(fmt, Mapping) else fmt
        kind = kind or _format_of(path, extensions)
        if loss_on is not None:
            out.append(_chat_source(path, kind, loss_on, keys))
        elif kind == "text":
            out.append(_TextFile(path, lines, keys))
        elif kind == "parquet":
            out.append(_ParquetFile(path, field, keys))
        else:
            out.append(_JsonFile(path, field, array_ok=kind == "json", keys=keys))
    return out


def _chat_source(path: Path, kind: str, loss_on: str, keys: tuple[str, ...] = ()) -> Any:
    """The source of chat records in the file ``path`` of format ``kind`` (with the values
    of ``keys``, the fields)."""
    if kind == "text":
        raise with_params(
            ValueError,
            f"{str(path)!r} is read as text, but ",
            Param("loss_on", loss_on),
            " reads chat records: JSON lines, JSON, Parquet or a saved Hugging Face dataset",
        )
    if kind == "parquet":
        return _ChatParquetFile(path, loss_on, keys)
    return _ChatJsonFile(path, loss_on, array_ok=kind == "json", keys=keys)


def _grouped(sources: list, name: str) -> list:
    group = _Input(name, len(sources))
    for src in sources:
        src.input = group
    return sources


def _format_of(path: Path, extensions: Mapping[str, str] = _EXTENSIONS) -> str:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in (".gz", ".zst"):
        suffixes = suffixes[:-1]
    kind = extensions.get(suffixes[-1]) if suffixes else None
    if kind is None:
        ext = suffixes[-1] if suffixes else None
        known = ", ".join(e for e in extensions if e not in TEXT_EXTENSIONS[3:])
        read_as_text: tuple = (
            ("pass ", Param("text_extensions", [ext]), " to read it as text, or ")
            if ext
            else ("or pass ",)
        )
        raise with_params(
            ValueError,
            f"cannot tell the format of {str(path)!r} from its extension "
            f"({ext or 'it has none'}); known: {known}, common source and markup files "
            "(.py, .rst, .c, .html, ...), optionally .gz or .zst; ",
            *read_as_text,
            Param("format"),
            f" (one of {', '.join(FORMATS)}) for every input",
        )
    return kind


def _text_extensions(exts: Any) -> dict[str, str]:
    if isinstance(exts, (str, bytes)) or not isinstance(exts, Iterable):
        raise TypeError(
            f"text_extensions must be an iterable of extensions such as ['.py'], "
            f"got {type(exts).__name__} {exts!r}"
        )
    out = {}
    for ext in exts:
        if not isinstance(ext, str) or not ext.strip(". ") or "/" in ext:
            raise ValueError(f"text_extensions must hold extensions such as '.py', got {ext!r}")
        out["." + ext.strip().lstrip(".").lower()] = "text"
    return out


def _check_format_patterns(patterns: Mapping) -> None:
    for pattern, kind in patterns.items():
        if not isinstance(pattern, str) or kind not in FORMATS:
            raise ValueError(
                f"format patterns map glob patterns to one of {FORMATS}, got {pattern!r}: {kind!r}"
            )


def _pattern_format(path: Path, patterns: Mapping) -> str | None:
    import fnmatch

    for pattern, kind in patterns.items():
        if fnmatch.fnmatch(path.name, pattern) or fnmatch.fnmatch(str(path), pattern):
            return kind
    return None


def _is_saved_dataset(path: Path) -> bool:
    return path.is_dir() and any((path / m).is_file() for m in _DATASET_MARKERS)


def _load_saved_dataset(path: Path):
    try:
        import datasets
    except ImportError:
        raise MissingDependencyError(
            f"{str(path)!r} is a saved Hugging Face dataset; reading it needs the `datasets` "
            "package, which is not installed",
            "datasets",
        ) from None
    return datasets.load_from_disk(str(path))


def size_of(path: Path) -> int:
    """Bytes of a file on disk, or of every file under a folder; 0 if it cannot be read."""
    try:
        if path.is_dir():
            return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        return path.stat().st_size
    except OSError:
        return 0


def _object_sources(
    obj: Any,
    field: str,
    name: str,
    split: str | None = None,
    nbytes: int | None = None,
    loss_on: str | None = None,
    keys: tuple[str, ...] = (),
) -> list:
    """A dataset, a DatasetDict (its one split, or the split ``split`` names) or a plain
    iterable; ``nbytes``: the size on disk of a saved dataset's folder (its progress);
    ``keys``: the keys (columns) ``fields=`` names.

    Raises
    ------
    ValueError
        A DatasetDict of several splits and no ``split`` (a store of train and validation
        together is never what was meant), or ``split`` is not one of its splits; the message
        names its splits.
    """
    if isinstance(obj, Mapping) and obj and all(hasattr(v, "iter") for v in obj.values()):
        names = sorted(map(str, obj))
        if split is None and len(obj) == 1:
            split = next(iter(obj))
        if split is None:
            raise with_params(
                ValueError,
                f"{name} holds several splits ({', '.join(names)}); build one split per store: "
                "choose it with ",
                Param("split", names[0]),
                " (or another of them)",
            )
        if split not in obj:
            raise with_params(
                ValueError,
                Param("split", split),
                f" is not a split of {name} (its splits: {', '.join(names)})",
            )
        obj, name = obj[split], f"{name}[{split!r}]"
    if loss_on is not None:
        return [_ChatObjectSource(obj, loss_on, name, nbytes, keys)]
    return [_ObjectSource(obj, field, name, nbytes, keys)]
