"""The ``mmpack`` command: a thin argparse layer over the library.

Subcommands: ``build`` (ingest text into a store, :func:`mmpack.ingest.pipeline.ingest`), ``info``
(what a store holds), ``show`` (one window or packed sample, as ids or decoded text), ``pack``
(packing statistics of every algorithm against padding and concatenate-and-chunk), ``verify``
(checksums), ``join`` (stores joined without copying tokens, :func:`mmpack.join`), ``export`` (to Megatron ``.bin/.idx`` or a flat EOS-separated file), ``demo`` (the whole pipeline on the Python standard library's sources) and ``bench``
(``python -m benchmarks`` of a source checkout).

Exit codes: 0 success; 1 a missing or corrupt store, a refused build, an I/O error (a read-only
or full disk, a permission denied) or any other expected error (one line on stderr, no
traceback); 2 bad arguments (argparse).  Library imports happen inside the subcommands so that
``mmpack --help`` starts fast.

Messages name this command's flags, never Python parameters: a library error that names a
parameter is built from :class:`mmpack.errors.Param` parts, and :func:`main` spells each one as
the flag of the running subcommand whose ``dest`` is the parameter's name (``overwrite=True`` ->
``--overwrite``, ``on_error='skip'`` -> ``--on-error skip``).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["main"]

_PROG = "mmpack"


# --------------------------------------------------------------------------------- build
def _cmd_build(args: argparse.Namespace) -> int:
    from mmpack.ingest.pipeline import ingest

    def on_issue(issue) -> None:
        tag = "skipped" if issue.is_error else "note"
        print(f"{_PROG}: {tag}: {issue}", file=sys.stderr)

    if args.scheduler is not None and args.engine != "dask":
        raise ValueError("--scheduler needs --engine dask")
    if args.engine != "local":
        from mmpack.ingest.distributed import build_distributed

        report = build_distributed(
            args.inputs,
            args.output,
            engine=args.engine,
            scheduler=args.scheduler,
            n_workers=args.workers,
            part_bytes=args.part_mb << 20,
            overwrite=args.overwrite,
            progress=False if args.quiet else None,
            on_issue=on_issue,
            tokenizer=args.tokenizer,
            field=args.field,
            lines=args.lines,
            format=_formats(args),
            batch_size=args.batch_size,
            on_error=args.on_error,
            skip_empty=args.skip_empty,
            backend=args.backend,
            split=args.split,
            template=args.template,
        )
        from mmpack.store.parts import JoinedStore

        assert isinstance(report.store, JoinedStore)  # build_distributed opens the joined parts
        print(report.summary() + f" ({len(report.store.parts)} parts, engine {args.engine})")
        return 0
    report = ingest(
        args.inputs,
        args.output,
        tokenizer=args.tokenizer,
        field=args.field,
        lines=args.lines,
        format=_formats(args),
        text_extensions=[e for group in args.text_extensions or () for e in group],
        workers=args.workers,
        batch_size=args.batch_size,
        on_error=args.on_error,
        skip_empty=args.skip_empty,
        backend=args.backend,
        overwrite=args.overwrite,
        split=args.split,
        template=args.template,
        progress=False if args.quiet else None,
        on_issue=on_issue,
    )
    print(report.summary())
    return 0


# --------------------------------------------------------------------------------- opening
def _open(args: argparse.Namespace):
    """``mmpack.open`` with the --format/--eos/--dtype/--metadata options of the store
    arguments."""
    import mmpack
    from mmpack.store.foreign import EosSeparatedStore
    from mmpack.store.foreign.megatron import detect_megatron

    options: dict = {}
    path = Path(args.store)
    flat = args.format == "eos-separated" or (
        args.format is None and path.is_file() and detect_megatron(path) is None
    )
    if flat:
        options = {"eos": args.eos} if args.eos is not None else {}
        if args.dtype is not None:
            options["dtype"] = args.dtype
        if args.metadata:
            options["metadata"] = True
    elif args.dtype is not None or args.metadata:
        flag = "--dtype" if args.dtype is not None else "--metadata"
        raise ValueError(f"{flag} is for flat token files (--format eos-separated)")
    store = mmpack.open(args.store, format=args.format, **options)
    if (
        args.eos is not None
        and args.func is not _cmd_export
        and not isinstance(store, EosSeparatedStore)
    ):
        raise ValueError(f"--eos is for flat token files; {args.store} is a {store.backend} store")
    return store


def _add_store_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "store",
        metavar="STORE",
        help="an mmpack store folder, a Megatron dataset prefix (PREFIX.bin + "
        "PREFIX.idx) or a flat token file",
    )
    p.add_argument(
        "--format",
        choices=("mmpack", "megatron", "eos-separated"),
        default=None,
        help="what STORE is (default: detected; a flat token file needs "
        "--format eos-separated --eos ID)",
    )
    p.add_argument(
        "--eos",
        type=_token_id,
        default=None,
        metavar="ID",
        help="end-of-sequence id that ends each document of a flat token file "
        "(export: the id written after each document)",
    )
    p.add_argument(
        "--dtype",
        choices=("uint8", "uint16", "uint32", "uint64", "int32"),
        default=None,
        help="token dtype of a headerless flat token file (OLMo-core: uint16 or uint32)",
    )
    p.add_argument(
        "--metadata",
        action="store_true",
        help="a flat token file's documents from OLMo-core's NAME.csv.gz beside it "
        "(default: found by scanning for --eos)",
    )


def _formats(args: argparse.Namespace):
    """``--format`` or the ``--format-for PATTERN=FORMAT`` patterns (not both)."""
    if not args.format_for:
        return args.format
    if args.format is not None:
        raise ValueError("give --format or --format-for, not both")
    patterns = {}
    for item in args.format_for:
        pattern, sep, kind = item.rpartition("=")
        if not sep or not pattern:
            raise ValueError(
                f"--format-for expects PATTERN=FORMAT (e.g. '*.py=text'), got {item!r}"
            )
        patterns[pattern] = kind
    return patterns


# --------------------------------------------------------------------------------- info
def _store_size(store) -> int:
    files = getattr(store, "source_files", None)
    if files is not None:
        return sum(f.stat().st_size for f in files)
    if "://" in store.location:  # a remote store: the bytes of its data objects
        return store.num_tokens * store.dtype.itemsize + (len(store) + 1) * 8
    return sum(f.stat().st_size for f in store.path.rglob("*") if f.is_file())


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def _length_quantiles(lens) -> dict[str, float]:
    import numpy as np

    if lens.size == 0:
        return {}
    qs = (0.01, 0.1, 0.5, 0.9, 0.99)
    vals = np.quantile(lens, qs)
    out: dict[str, float] = {"min": int(lens.min())}
    out.update({f"p{int(q * 100)}": float(v) for q, v in zip(qs, vals)})
    out["max"] = int(lens.max())
    out["mean"] = float(lens.mean())
    return out


def _length_histogram(lens, width: int = 40) -> list[str]:
    """Rows ``label |#### count`` over power-of-two buckets (0, 1, 2-3, 4-7, ...)."""
    import numpy as np

    if lens.size == 0:
        return []
    buckets = np.zeros(65, dtype=np.int64)
    nz = lens[lens > 0]
    buckets[0] = lens.size - nz.size
    if nz.size:
        b = np.floor(np.log2(nz)).astype(np.int64) + 1
        buckets += np.bincount(b, minlength=65)[:65]
    used = np.flatnonzero(buckets)
    lo, hi = int(used[0]), int(used[-1])
    top = int(buckets.max())
    rows = []
    for k in range(lo, hi + 1):
        label = str(k) if k <= 1 else f"{2 ** (k - 1)}-{2**k - 1}"  # 0, 1, 2-3, 4-7, ...
        count = int(buckets[k])
        bar = "#" * max(int(round(width * count / top)), 1 if count else 0)
        rows.append(f"  {label:>17} |{bar:<{width}} {count:,}")
    return rows


def _cmd_info(args: argparse.Namespace) -> int:
    store = _open(args)
    lens = store.doc_lens
    info = {
        "path": store.location,
        "backend": store.backend,
        "dtype": store.dtype.name,
        "documents": len(store),
        "empty_documents": int((lens == 0).sum()),
        "tokens": store.num_tokens,
        "bytes_on_disk": _store_size(store),
        "fingerprint": store.fingerprint,
        "format_version": store.meta.get("version"),
        "doc_length": _length_quantiles(lens),
    }
    for section in ("tokenizer", "provenance"):
        if isinstance(store.meta.get(section), dict):
            info[section] = store.meta[section]
    if hasattr(store, "part_locations"):  # a joined store: its size is its parts' sizes
        info["parts"] = store.part_locations
        info["bytes_on_disk"] += sum(_store_size(p) for p in store.parts if "://" not in p.location)
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    q = info["doc_length"]
    print(f"store        {info['path']}")
    if store.meta.get("format") == info["backend"]:  # a foreign store: its format and source
        source = store.meta.get("source", {})
        print(
            f"format       {info['backend']}"
            + (f" v{info['format_version']}" if info["format_version"] is not None else "")
            + f", file dtype {source.get('dtype')}, served in place (read-only)"
        )
    else:
        print(f"backend      {info['backend']} (format v{info['format_version']})")
    print(f"documents    {info['documents']:,} ({info['empty_documents']:,} empty)")
    print(
        f"tokens       {info['tokens']:,} ({info['dtype']}, "
        f"{store.dtype.itemsize} byte{'s' if store.dtype.itemsize > 1 else ''} each)"
    )
    print(f"size         {_fmt_bytes(info['bytes_on_disk'])} on disk")
    print(f"fingerprint  {info['fingerprint']}")
    tok = info.get("tokenizer")
    if tok:
        ids = ", ".join(f"{k} {v}" for k, v in tok.get("special_ids", {}).items()) or "none"
        kept = f", copy in {tok['file']}" if tok.get("file") else ""
        print(
            f"tokenizer    {tok.get('kind')} (vocab {tok.get('vocab_size'):,}{kept}; "
            f"special ids: {ids})"
        )
    prov = info.get("provenance")
    if prov:
        n_in = len(prov.get("inputs", []))
        print(
            f"built        {prov.get('time')} by mmpack {prov.get('mmpack_version')} from "
            f"{n_in} input{'s' if n_in != 1 else ''}: read {prov.get('docs_read', 0):,}, "
            f"skipped {prov.get('docs_skipped', 0):,} with errors and "
            f"{prov.get('empty_skipped', 0):,} empty"
        )
    if "parts" in info:
        print(
            f"parts        {len(info['parts'])} ("
            + ", ".join(info["parts"][:4])
            + (", ..." if len(info["parts"]) > 4 else "")
            + ")"
        )
    if q:
        print(
            "doc length   "
            + "  ".join(f"{k} {v:,.0f}" for k, v in q.items() if k != "mean")
            + f"  mean {q['mean']:,.1f}"
        )
        print("histogram    (documents per length bucket, tokens)")
        for row in _length_histogram(lens):
            print(row)
    return 0


# --------------------------------------------------------------------------------- show
def _cmd_show(args: argparse.Namespace) -> int:
    import numpy as np

    store = _open(args)
    tok = None
    if args.decode:
        from mmpack.ingest.provenance import store_tokenizer
        from mmpack.ingest.tokenizer import load_tokenizer
        from mmpack.store.vocab import tokenizer_record

        if args.tokenizer is None and tokenizer_record(store) is not None:
            tok = store_tokenizer(store)  # the tokenizer the store was built with
        else:
            tok = load_tokenizer(args.tokenizer)
    ds: PackedDataset | WindowDataset
    if args.packed:
        from mmpack.views.packed import PackedDataset

        ds = PackedDataset(
            store,
            args.seqlen,
            eot=args.eot,
            pad_id=args.pad_id,
            long_docs=args.long_docs,
            algorithm=args.algorithm,
        )
        what = (
            f"packed row {{i}} of {{n}} (seqlen {args.seqlen}, {args.algorithm}, "
            f"eot {ds.eot}, pad {ds.pad_id})"
        )
    else:
        from mmpack.views.window import WindowDataset

        ds = WindowDataset(
            store,
            args.seqlen,
            args.stride,
            eot=args.eot,
            pad_id=args.pad_id,
            drop_last=not args.keep_last,
        )
        what = f"window {{i}} of {{n}} (seqlen {args.seqlen}, stride {ds.stride}, eot {ds.eot})"
    n = len(ds)
    if not -n <= args.index < n:
        raise IndexError(f"sample index {args.index} is out of range: the view has {n} samples")
    i = args.index % n
    sample = ds[i]
    print(what.format(i=i, n=n))
    for key, value in sample.items():
        arr = np.asarray(value)
        print(f"{key:<15}{arr.tolist()}")
    if args.packed:
        assert isinstance(ds, PackedDataset)
        lens = store.doc_lens
        print(
            "from           "
            + "; ".join(
                f"doc {d} tokens {a}..{a + n}"
                + (" + eot" if args.eot is not None and a + n == lens[d] else "")
                for d, a, n in ds.locate(i)
            )
        )
    else:
        assert isinstance(ds, WindowDataset)
        print(
            "from           "
            + "; ".join(
                f"doc {p['doc']} tokens {p['start']}..{p['stop']}" + (" + eot" if p["eot"] else "")
                for p in ds.locate(i)
            )
        )
    if tok is not None:
        ids = np.asarray(sample["input_ids"])
        cu = np.asarray(sample.get("cu_seqlens", [0, ids.size])).tolist()
        for a, b in zip(cu[:-1], cu[1:]):
            print(f"--- positions {a}..{b} ---")
            print(tok.decode(ids[a:b]))
    return 0


# --------------------------------------------------------------------------------- pack
_METHOD_NAMES = {
    "bfd": "best-fit decreasing",
    "stream": "streaming best fit",
    "nextfit": "next fit",
    "pad": "pad (1 doc/row)",
    "chunk": "concat + chunk",
}


def _cmd_pack(args: argparse.Namespace) -> int:
    from mmpack.cli.demo import compare_packing

    store = _open(args)
    eot = args.eot is not None
    rows = compare_packing(
        store.doc_lens,
        args.seqlen,
        eot=eot,
        long_docs=args.long_docs,
        lookahead=args.lookahead,
        algorithms=("bfd", "stream", "nextfit"),
    )
    if args.json:
        eot_id = args.eot if isinstance(args.eot, int) and not isinstance(args.eot, bool) else None
        print(
            json.dumps(
                {
                    "store": store.location,
                    "seqlen": args.seqlen,
                    "eot": eot,
                    "eot_id": eot_id,
                    "long_docs": args.long_docs,
                    "lookahead": args.lookahead,
                    "documents": len(store),
                    "methods": rows,
                },
                indent=1,
            )
        )
        return 0
    tokens = rows[0]["tokens"]
    print(
        f"{store.location}: {len(store):,} documents, {tokens:,} tokens to place "
        f"({'with' if eot else 'without'} an eot per document), seqlen {args.seqlen}, "
        f"long documents: {args.long_docs}; at least {-(-tokens // args.seqlen):,} rows"
    )
    print(
        f"{'method':<22}{'rows':>12}{'efficiency':>12}{'padding':>15}{'docs cut':>11}{'time':>11}"
    )
    for r in rows:
        name = _METHOD_NAMES[r["method"]]
        t = f"{r['seconds'] * 1e3:.1f} ms" if "seconds" in r else ""
        print(
            f"{name:<22}{r['rows']:>12,}{r['efficiency']:>11.2%} {r['padding']:>14,}"
            f"{r['docs_cut']:>11,}{t:>11}"
        )
    print(
        f"streaming best fit keeps {args.lookahead} rows open; docs cut: documents whose tokens "
        "land in more than one row"
    )
    return 0


# --------------------------------------------------------------------------------- join
def _cmd_join(args: argparse.Namespace) -> int:
    from mmpack.store.join import join

    store = join(args.parts, args.output, append=args.append, overwrite=args.overwrite)
    index = sum(f.stat().st_size for f in Path(args.output).iterdir() if f.is_file())
    token_bytes = store.num_tokens * store.dtype.itemsize
    share = f" ({index / token_bytes:.2%} of the token bytes)" if token_bytes else ""
    print(
        f"{store.path}: {len(store.parts)} parts, {len(store):,} documents, "
        f"{store.num_tokens:,} tokens ({store.dtype.name}); wrote {_fmt_bytes(index)} of "
        f"manifest and offsets{share}; fingerprint {store.fingerprint}"
    )
    return 0


# --------------------------------------------------------------------------------- verify
def _cmd_verify(args: argparse.Namespace) -> int:
    store = _open(args)
    res = store.verify()
    parts = f"{res['parts']} parts, " if "parts" in res else ""
    print(
        f"{store.location}: ok, {parts}{res['blocks']} checksum blocks, {_fmt_bytes(res['bytes'])} "
        f"verified; {len(store):,} documents, {store.num_tokens:,} tokens, "
        f"fingerprint {store.fingerprint}"
        + (
            f"; checksums recorded in {res['sidecar']} (checked by the next verify)"
            if res.get("recorded")
            else ""
        )
    )
    return 0


# --------------------------------------------------------------------------------- export
def _cmd_export(args: argparse.Namespace) -> int:
    from mmpack.store.foreign import EosSeparatedStore, export_flat, export_megatron

    store = _open(args)
    if args.to == "megatron":
        if args.eos is not None and not isinstance(store, EosSeparatedStore):
            raise ValueError("--eos is for --to npy/olmo (or an eos-separated STORE)")
        bin_path, idx_path = export_megatron(store, args.output, overwrite=args.overwrite)
        written = f"{bin_path} and {idx_path}"
    else:
        if args.eos is None:
            raise ValueError(f"--to {args.to} needs --eos ID (the id written after each document)")
        path = export_flat(
            store,
            args.output,
            eos=args.eos,
            header=args.to == "npy",
            metadata=args.to == "olmo",
            overwrite=args.overwrite,
        )
        written = str(path) + (" and its .csv.gz document metadata" if args.to == "olmo" else "")
    print(
        f"{store.location}: {len(store):,} documents, {store.num_tokens:,} tokens written "
        f"to {written}"
    )
    return 0


# --------------------------------------------------------------------------------- demo, bench
def _cmd_demo(args: argparse.Namespace) -> int:
    from mmpack.cli.demo import run_demo

    run_demo(out=args.out, overwrite=args.overwrite)
    return 0


def _benchmarks_root() -> Path | None:
    root = Path(__file__).resolve().parents[2]
    return root if (root / "benchmarks" / "__main__.py").is_file() else None


def _cmd_bench(args: argparse.Namespace) -> int:
    root = _benchmarks_root()
    if root is None:
        raise FileNotFoundError(
            "benchmarks/ is not next to this mmpack (the benchmarks ship with the source "
            "checkout, not the installed package)"
        )
    return subprocess.call([sys.executable, "-m", "benchmarks", *args.bench_args], cwd=root)


# --------------------------------------------------------------------------------- parser
def _int_at_least(lo: int, what: str, hi: int | None = None, why: str = ""):
    """An argparse ``type`` for an integer in ``[lo, hi]`` (``what`` names it in the error, ``why``
    says where ``hi`` comes from), so that a value out of range is refused naming the flag."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < lo:
            raise argparse.ArgumentTypeError(f"expected {what} >= {lo}, got {value}")
        if hi is not None and value > hi:
            raise argparse.ArgumentTypeError(f"expected {what} <= {hi} ({why}), got {value}")
        return value

    return parse


_positive_int = _int_at_least(1, "an integer")
_token_id = _int_at_least(0, "an integer token id", 2**63 - 1, "ids are int64")
_seqlen = _int_at_least(1, "an integer", 2**31 - 1, "cu_seqlens are int32")
_stride = _int_at_least(1, "an integer", 2**63 - 1, "token offsets are int64")


def _extensions(text: str) -> list[str]:
    """``--text-ext .py,.rst`` -> ``[".py", ".rst"]``."""
    exts = [e.strip() for e in text.split(",")]
    if not all(e.strip(".") for e in exts):
        raise argparse.ArgumentTypeError(f"expected extensions such as .py,.rst, got {text!r}")
    return exts


_BARE_EOT = object()  # `pack --eot` without an id: the old switch spelling (not a str: argparse
# would convert it with `type`)


def _add_eot(p: argparse.ArgumentParser, default: Any, help: str, type: Any = None) -> None:
    """``--eot ID`` / ``--no-eot``, spelled the same in every subcommand."""
    p.add_argument(
        "--eot",
        type=type or _token_id,
        nargs="?",
        const=_BARE_EOT,
        default=default,
        metavar="ID",
        help=help,
    )
    p.add_argument(
        "--no-eot", dest="eot", action="store_const", const=None, help="no end-of-text token"
    )


def _token_id_or_store(text: str) -> int | str:
    return "store" if text == "store" else _token_id(text)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``mmpack`` command (every option documented)."""
    p = argparse.ArgumentParser(
        prog=_PROG,
        description="Memory-mapped, random-access token stores for language-model training: "
        "build one from text, inspect it, and view it as windows or packed rows.",
        epilog="Run 'mmpack COMMAND --help' for the options of each command.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    b = sub.add_parser(
        "build",
        help="tokenize text files into a new store",
        description="Tokenize text into a new token store.  INPUT: files or quoted globs "
        "(.txt/.md and common source and markup files such as .py, .rst, .c, .js, "
        ".html, .yaml: one document per file, or per line with --lines; more "
        "extensions as text with --text-ext; .jsonl/.json records with a text "
        "field; .parquet with a text column; optionally .gz or .zst; or a folder "
        "saved by Hugging Face datasets).  Bad records are reported on stderr with "
        "their file and line.  A file is all or nothing: a corrupt or truncated "
        "compressed file, or a file whose reading fails, is skipped whole.",
    )
    b.add_argument("inputs", nargs="+", metavar="INPUT", help="input files, folders or globs")
    b.add_argument(
        "-o", "--output", required=True, metavar="STORE", help="the store folder to create"
    )
    b.add_argument(
        "--tokenizer",
        metavar="PATH",
        default=None,
        help="a tokenizer.json, a folder holding one, or a transformers tokenizer "
        "folder (default: byte-level, UTF-8 bytes, eot 256)",
    )
    b.add_argument(
        "--field",
        default="text",
        metavar="NAME",
        help="text field of JSON records / column of Parquet files (default: text)",
    )
    b.add_argument(
        "--lines",
        action="store_true",
        help="text files hold one document per line (default: one per file)",
    )
    b.add_argument(
        "--format",
        choices=("text", "jsonl", "json", "parquet"),
        default=None,
        help="format of every input file (default: from the extension)",
    )
    b.add_argument(
        "--text-ext",
        dest="text_extensions",
        type=_extensions,
        action="append",
        metavar="EXTS",
        help="also read files with these extensions as text, e.g. --text-ext "
        ".sql,.bas (comma-separated, repeatable; the others keep their format)",
    )
    b.add_argument(
        "--format-for",
        action="append",
        default=None,
        metavar="PATTERN=FORMAT",
        help="format of the files matching a glob pattern, e.g. '*.py=text' (source "
        "files as text next to JSON lines); repeatable; others go by extension",
    )
    b.add_argument(
        "--workers",
        type=_positive_int,
        default=None,
        metavar="N",
        help="tokenizer processes (default: the CPU count; 1 for byte-level)",
    )
    b.add_argument(
        "--batch-size",
        type=_positive_int,
        default=1000,
        metavar="N",
        help="documents per tokenizer batch (default: 1000)",
    )
    b.add_argument(
        "--on-error",
        choices=("skip-some", "skip", "fail"),
        default="skip-some",
        help="a bad record (invalid UTF-8 or JSON, missing or non-string field, "
        "tokenizer failure, unreadable file) is reported and skipped; "
        "skip-some (default) then refuses the build, nothing written, if a file "
        "was unreadable, if no record of an INPUT could be stored, or if more "
        "than half of all records were skipped; skip builds from whatever is "
        "left; fail stops at the first bad record, nothing written",
    )
    b.add_argument(
        "--split",
        metavar="NAME",
        default=None,
        help="read only this split of a saved Hugging Face DatasetDict (default: "
        "every split, in name order)",
    )
    b.add_argument(
        "--template",
        metavar="TEMPLATE",
        default=None,
        help="special tokens around every document: 'tokenizer' (the tokenizer's own "
        "post-processor, e.g. BOS or [CLS] ... [SEP]) or a template such as "
        "'<s> $A' or '[CLS] $A [SEP]' (default: none)",
    )
    b.add_argument(
        "--skip-empty",
        action="store_true",
        help="drop empty documents (default: store them as empty documents)",
    )
    b.add_argument(
        "--backend",
        choices=("memmap", "zarr"),
        default="memmap",
        help="storage backend (default: memmap)",
    )
    b.add_argument("--overwrite", action="store_true", help="replace an existing store")
    b.add_argument("--quiet", action="store_true", help="no progress bar")
    b.add_argument(
        "--engine",
        choices=("local", "dask", "serial"),
        default="local",
        help="local: one store, tokenized by a local process pool (default); dask: "
        "one part per task on a Dask cluster, joined into STORE (--workers then "
        "sizes the local cluster); serial: the same parts, one after another",
    )
    b.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        default=None,
        help="with --engine dask: a running scheduler (tcp://host:8786) instead of a "
        "local cluster on 127.0.0.1",
    )
    b.add_argument(
        "--part-mb",
        type=_positive_int,
        default=64,
        metavar="MB",
        help="with --engine dask/serial: input megabytes per part; files are grouped "
        "in order, never split (default: 64)",
    )
    b.set_defaults(func=_cmd_build, parser=b)

    i = sub.add_parser(
        "info",
        help="what a store holds",
        description="Counts, dtype, backend, size on disk, document-length "
        "quantiles and a histogram of a store.",
    )
    _add_store_arguments(i)
    i.add_argument("--json", action="store_true", help="print JSON instead of text")
    i.set_defaults(func=_cmd_info, parser=i)

    s = sub.add_parser(
        "show",
        help="one window or packed sample",
        description="Print sample I of the window view (or of the packed view "
        "with --packed): its arrays, the documents it comes from, "
        "and with --decode its text, segment by segment.",
    )
    _add_store_arguments(s)
    s.add_argument("--seqlen", type=_seqlen, required=True, metavar="N", help="tokens per sample")
    s.add_argument(
        "--stride",
        type=_stride,
        default=None,
        metavar="S",
        help="distance between window starts (default: seqlen; windows only)",
    )
    s.add_argument(
        "-i",
        "--index",
        type=int,
        required=True,
        metavar="I",
        help="sample index (negative counts from the end)",
    )
    s.add_argument(
        "--packed",
        action="store_true",
        help="the packed view (whole documents best-fit into rows) instead of windows",
    )
    _add_eot(
        s,
        None,
        "end-of-text id inserted after every document, or 'store' for the id of "
        "the tokenizer the store records (default: none; the byte-level "
        "tokenizer's is 256)",
        type=_token_id_or_store,
    )
    s.add_argument(
        "--pad-id", type=_token_id, default=0, metavar="ID", help="padding id (default: 0)"
    )
    s.add_argument(
        "--keep-last",
        action="store_true",
        help="windows: add the final partial window, padded (default: dropped)",
    )
    s.add_argument(
        "--algorithm",
        choices=("bfd", "stream", "nextfit"),
        default="bfd",
        help="packing algorithm of --packed (default: bfd)",
    )
    s.add_argument(
        "--long-docs",
        choices=("split", "truncate", "drop"),
        default="split",
        help="documents longer than a row, with --packed (default: split)",
    )
    s.add_argument("--decode", action="store_true", help="also print the decoded text")
    s.add_argument(
        "--tokenizer",
        metavar="PATH",
        default=None,
        help="tokenizer for --decode (default: the one the store records, else byte-level)",
    )
    s.set_defaults(func=_cmd_show, parser=s)

    k = sub.add_parser(
        "pack",
        help="packing statistics for a sequence length",
        description="Build the packing plans (best-fit decreasing, streaming "
        "best fit, next fit) for SEQLEN and compare them with plain "
        "padding (one document per row) and concatenate-and-chunk: "
        "rows, efficiency (real tokens / slots), padding, documents "
        "cut.",
    )
    _add_store_arguments(k)
    k.add_argument("--seqlen", type=_seqlen, required=True, metavar="N", help="tokens per row")
    _add_eot(
        k,
        True,
        "an end-of-text token (any id: only its slot counts) follows every "
        "document (default: yes; --no-eot: none)",
    )
    k.add_argument(
        "--long-docs",
        choices=("split", "truncate", "drop"),
        default="split",
        help="documents longer than a row (default: split)",
    )
    k.add_argument(
        "--lookahead",
        type=_positive_int,
        default=1024,
        metavar="N",
        help="open rows of the streaming algorithm (default: 1024)",
    )
    k.add_argument("--json", action="store_true", help="print JSON instead of a table")
    k.set_defaults(func=_cmd_pack, parser=k)

    v = sub.add_parser(
        "verify",
        help="check a store's checksums",
        description="Recompute every block checksum of a store; exit 1 naming the first bad block.",
    )
    _add_store_arguments(v)
    v.set_defaults(func=_cmd_verify, parser=v)

    x = sub.add_parser(
        "export",
        help="write a store as Megatron .bin/.idx or a flat token file",
        description="Write STORE (any store mmpack opens) in another tool's "
        "format: Megatron-LM's PREFIX.bin + PREFIX.idx (one sequence "
        "per document), numpy .npy or OLMo-core's headerless flat "
        "file (+ NAME.csv.gz), each document followed by --eos.  "
        "Files appear complete or not at all.",
    )
    _add_store_arguments(x)
    x.add_argument(
        "--to",
        choices=("megatron", "npy", "olmo"),
        required=True,
        help="megatron: PREFIX.bin + PREFIX.idx; npy: numpy .npy (np.load reads "
        "it); olmo: headerless flat file as OLMo-core reads it, plus its "
        ".csv.gz document metadata",
    )
    x.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="OUT",
        help="the Megatron prefix or the file to write",
    )
    x.add_argument("--overwrite", action="store_true", help="replace existing files")
    x.set_defaults(func=_cmd_export, parser=x)

    j = sub.add_parser(
        "join",
        help="join stores into one without copying tokens",
        description="Join PART stores (in order) into the store OUT: writes a "
        "manifest (part locations relative to OUT, fingerprints, "
        "counts) and the global document offsets (8 bytes per "
        "document), never a token.  OUT opens like any store; a "
        "part that later changes or goes missing is refused.",
    )
    j.add_argument("parts", nargs="+", metavar="PART", help="part stores, in order")
    j.add_argument("-o", "--output", required=True, metavar="OUT", help="the join folder")
    j.add_argument(
        "--append", action="store_true", help="add the parts after those of the existing join OUT"
    )
    j.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the manifest of the existing join OUT (parts are kept)",
    )
    j.set_defaults(func=_cmd_join, parser=j)

    d = sub.add_parser(
        "demo",
        help="the whole pipeline on the Python standard library",
        description="Build a store from the Python standard library's own "
        "source files (byte-level tokens), then show what it holds, "
        "window samples, packing statistics and random-access "
        "speed.  Nothing is downloaded.",
    )
    d.add_argument(
        "--out",
        metavar="DIR",
        default=None,
        help="keep the store in DIR/stdlib (default: a temporary folder, removed)",
    )
    d.add_argument("--overwrite", action="store_true", help="replace DIR/stdlib if it exists")
    d.set_defaults(func=_cmd_demo, parser=d)

    if _benchmarks_root() is not None:
        n = sub.add_parser(
            "bench",
            help="run the benchmarks (python -m benchmarks)",
            description="Run 'python -m benchmarks' of the source checkout; every "
            "argument after 'bench' is passed on (e.g. 'mmpack bench "
            "--quick store window'; 'mmpack bench -- --help' for "
            "its options).",
        )
        n.add_argument(
            "bench_args",
            nargs=argparse.REMAINDER,
            metavar="ARGS",
            help="arguments for python -m benchmarks (e.g. --quick)",
        )
        n.set_defaults(func=_cmd_bench, parser=n)
    return p


def _flag_speller(parser: argparse.ArgumentParser):
    """Spell a :class:`~mmpack.errors.Param` as the flag of ``parser`` whose ``dest`` is its name
    (``--overwrite``, ``--on-error skip``, ``--text-ext .sql``); the Python spelling when the
    subcommand has no such flag."""
    actions: dict[str, argparse.Action] = {}
    for action in parser._actions:
        if action.option_strings and not action.option_strings[0].startswith("--no-"):
            actions.setdefault(action.dest, action)

    def spell(param) -> str:
        action = actions.get(param.name)
        if action is None:
            return str(param)
        flag = max(action.option_strings, key=len)
        if not param.has_value or (action.nargs == 0 and param.value is True):
            return flag
        value = param.value
        if isinstance(value, (list, tuple)):
            value = ",".join(map(str, value))
        return f"{flag} {value}"

    return spell


_IO_HINTS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
}


def _one_line(exc: BaseException, parser: argparse.ArgumentParser) -> str:
    """The message of an expected error, on one line, in this command's terms."""
    from mmpack.errors import render_message

    if (
        isinstance(exc, OSError)
        and exc.errno is not None
        and getattr(exc, "message_parts", None) is None
    ):
        # "[Errno 28] No space left on device: 'x'" -> "No space left on device: 'x' (...)"
        where = "" if exc.filename is None else f": {str(exc.filename)!r}"
        hint = _IO_HINTS.get(exc.errno)
        msg = f"{exc.strerror or exc}{where}" + (f" ({hint})" if hint else "")
    else:
        msg = render_message(exc, _flag_speller(parser))
    return " ".join(msg.split()) or type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    """Run the ``mmpack`` command; returns the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    if argv[:1] == ["bench"] and argv[1:2] not in (["-h"], ["--help"]):
        # Everything after 'bench' belongs to python -m benchmarks, options included.
        args = parser.parse_args(["bench"])
        args.bench_args = argv[2:] if argv[1:2] == ["--"] else argv[1:]
    else:
        args = parser.parse_args(argv)
    if getattr(args, "eot", None) is _BARE_EOT:
        if args.command != "pack":
            args.parser.error(
                "argument --eot: expected an id (e.g. --eot 256, the byte-level "
                "tokenizer's), or --no-eot"
            )
        print(
            f"{_PROG}: note: 'pack --eot' without an id is deprecated; an eot is counted by "
            "default (give its id as in 'show --eot ID', or --no-eot for none)",
            file=sys.stderr,
        )
        args.eot = True
    from mmpack.errors import MmpackError

    try:
        return args.func(args)
    except BrokenPipeError:  # e.g. `mmpack info STORE | head` (an OSError: caught first)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except (MmpackError, OSError, ValueError, IndexError, ImportError) as exc:
        print(f"{_PROG}: error: {_one_line(exc, args.parser)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{_PROG}: interrupted", file=sys.stderr)
        return 130
