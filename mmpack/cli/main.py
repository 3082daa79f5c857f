"""The ``mmpack`` command: a thin argparse layer over the library.

Subcommands: ``build`` (ingest text into a store, :func:`mmpack.ingest.pipeline.ingest`), ``info``
(what a store holds), ``show`` (one window or packed sample, as ids or decoded text), ``pack``
(packing statistics of every algorithm against padding and concatenate-and-chunk), ``verify``
(checksums), ``join`` (stores joined without copying tokens, :func:`mmpack.join`), ``demo`` (the whole pipeline on the Python standard library's sources) and ``bench``
(``python -m benchmarks`` of a source checkout).

Exit codes: 0 success; 1 a missing or corrupt store, a bad input file or any other expected error
(one line on stderr, no traceback); 2 bad arguments (argparse).  Library imports happen inside
the subcommands so that ``mmpack --help`` starts fast.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["main"]

_PROG = "mmpack"


# --------------------------------------------------------------------------------- build
def _cmd_build(args: argparse.Namespace) -> int:
    from mmpack.ingest.pipeline import ingest

    def on_issue(issue) -> None:
        tag = "skipped" if issue.skipped else "note"
        print(f"{_PROG}: {tag}: {issue}", file=sys.stderr)

    if args.scheduler is not None and args.engine != "dask":
        raise ValueError("--scheduler needs --engine dask")
    if args.engine != "local":
        from mmpack.ingest.distributed import build_distributed

        report = build_distributed(
            args.inputs, args.output, engine=args.engine, scheduler=args.scheduler,
            n_workers=args.workers, part_bytes=args.part_mb << 20, overwrite=args.overwrite,
            progress=False if args.quiet else None, on_issue=on_issue,
            tokenizer=args.tokenizer, field=args.field, lines=args.lines, format=_formats(args),
            batch_size=args.batch_size, on_error=args.on_error, skip_empty=args.skip_empty,
            backend=args.backend, split=args.split, template=args.template,
        )
        print(report.summary() + f" ({len(report.store.parts)} parts, engine {args.engine})")
        return 0
    report = ingest(
        args.inputs,
        args.output,
        tokenizer=args.tokenizer,
        field=args.field,
        lines=args.lines,
        format=_formats(args),
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
            raise ValueError(f"--format-for expects PATTERN=FORMAT (e.g. '*.py=text'), got {item!r}")
        patterns[pattern] = kind
    return patterns


# --------------------------------------------------------------------------------- info
def _store_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


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
    out = {"min": int(lens.min())}
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
        label = str(k) if k <= 1 else f"{2 ** (k - 1)}-{2 ** k - 1}"  # 0, 1, 2-3, 4-7, ...
        count = int(buckets[k])
        bar = "#" * max(int(round(width * count / top)), 1 if count else 0)
        rows.append(f"  {label:>17} |{bar:<{width}} {count:,}")
    return rows


def _cmd_info(args: argparse.Namespace) -> int:
    import mmpack

    store = mmpack.open(args.store)
    lens = store.doc_lens
    info = {
        "path": str(store.path),
        "backend": store.backend,
        "dtype": store.dtype.name,
        "documents": len(store),
        "empty_documents": int((lens == 0).sum()),
        "tokens": store.num_tokens,
        "bytes_on_disk": _store_size(store.path),
        "fingerprint": store.fingerprint,
        "format_version": store.meta.get("version"),
        "doc_length": _length_quantiles(lens),
    }
    for section in ("tokenizer", "provenance"):
        if isinstance(store.meta.get(section), dict):
            info[section] = store.meta[section]
    if hasattr(store, "part_locations"):  # a joined store: its size is its parts' sizes
        info["parts"] = store.part_locations
        info["bytes_on_disk"] += sum(_store_size(p.path) for p in store.parts
                                     if "://" not in p.location)
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    q = info["doc_length"]
    print(f"store        {info['path']}")
    print(f"backend      {info['backend']} (format v{info['format_version']})")
    print(f"documents    {info['documents']:,} ({info['empty_documents']:,} empty)")
    print(f"tokens       {info['tokens']:,} ({info['dtype']}, "
          f"{store.dtype.itemsize} byte{'s' if store.dtype.itemsize > 1 else ''} each)")
    print(f"size         {_fmt_bytes(info['bytes_on_disk'])} on disk")
    print(f"fingerprint  {info['fingerprint']}")
    tok = info.get("tokenizer")
    if tok:
        ids = ", ".join(f"{k} {v}" for k, v in tok.get("special_ids", {}).items()) or "none"
        kept = f", copy in {tok['file']}" if tok.get("file") else ""
        print(f"tokenizer    {tok.get('kind')} (vocab {tok.get('vocab_size'):,}{kept}; "
              f"special ids: {ids})")
    prov = info.get("provenance")
    if prov:
        n_in = len(prov.get("inputs", []))
        print(f"built        {prov.get('time')} by mmpack {prov.get('mmpack_version')} from "
              f"{n_in} input{'s' if n_in != 1 else ''}: read {prov.get('docs_read', 0):,}, "
              f"skipped {prov.get('docs_skipped', 0):,} with errors and "
              f"{prov.get('empty_skipped', 0):,} empty")
    if "parts" in info:
        print(f"parts        {len(info['parts'])} (" + ", ".join(info["parts"][:4])
              + (", ..." if len(info["parts"]) > 4 else "") + ")")
    if q:
        print("doc length   " + "  ".join(
            f"{k} {v:,.0f}" for k, v in q.items() if k != "mean") + f"  mean {q['mean']:,.1f}")
        print("histogram    (documents per length bucket, tokens)")
        for row in _length_histogram(lens):
            print(row)
    return 0


# --------------------------------------------------------------------------------- show
def _cmd_show(args: argparse.Namespace) -> int:
    import numpy as np

    import mmpack

    store = mmpack.open(args.store)
    tok = None
    if args.decode:
        from mmpack.ingest.provenance import store_tokenizer
        from mmpack.ingest.tokenizer import load_tokenizer
        from mmpack.store.vocab import tokenizer_record

        if args.tokenizer is None and tokenizer_record(store) is not None:
            tok = store_tokenizer(store)  # the tokenizer the store was built with
        else:
            tok = load_tokenizer(args.tokenizer)
    if args.packed:
        from mmpack.views.packed import PackedDataset

        ds = PackedDataset(store, args.seqlen, eot=args.eot, pad_id=args.pad_id,
                           long_docs=args.long_docs, algorithm=args.algorithm)
        what = (f"packed row {{i}} of {{n}} (seqlen {args.seqlen}, {args.algorithm}, "
                f"eot {ds.eot}, pad {ds.pad_id})")
    else:
        from mmpack.views.window import WindowDataset

        ds = WindowDataset(store, args.seqlen, args.stride, eot=args.eot, pad_id=args.pad_id,
                           drop_last=not args.keep_last)
        what = (f"window {{i}} of {{n}} (seqlen {args.seqlen}, stride {ds.stride}, "
                f"eot {ds.eot})")
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
        lens = store.doc_lens
        print("from           " + "; ".join(
            f"doc {d} tokens {a}..{a + n}"
            + (" + eot" if args.eot is not None and a + n == lens[d] else "")
            for d, a, n in ds.locate(i)))
    else:
        print("from           " + "; ".join(
            f"doc {p['doc']} tokens {p['start']}..{p['stop']}" + (" + eot" if p["eot"] else "")
            for p in ds.locate(i)))
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
    import mmpack
    from mmpack.cli.demo import compare_packing

    store = mmpack.open(args.store)
    rows = compare_packing(store.doc_lens, args.seqlen, eot=args.eot, long_docs=args.long_docs,
                           lookahead=args.lookahead, algorithms=("bfd", "stream", "nextfit"))
    if args.json:
        print(json.dumps({"store": str(store.path), "seqlen": args.seqlen, "eot": args.eot,
                          "long_docs": args.long_docs, "lookahead": args.lookahead,
                          "documents": len(store), "methods": rows}, indent=1))
        return 0
    tokens = rows[0]["tokens"]
    print(f"{store.path}: {len(store):,} documents, {tokens:,} tokens to place "
          f"({'with' if args.eot else 'without'} an eot per document), seqlen {args.seqlen}, "
          f"long documents: {args.long_docs}; at least {-(-tokens // args.seqlen):,} rows")
    print(f"{'method':<22}{'rows':>12}{'efficiency':>12}{'padding':>15}{'docs cut':>11}"
          f"{'time':>11}")
    for r in rows:
        name = _METHOD_NAMES[r["method"]]
        t = f"{r['seconds'] * 1e3:.1f} ms" if "seconds" in r else ""
        print(f"{name:<22}{r['rows']:>12,}{r['efficiency']:>11.2%} {r['padding']:>14,}"
              f"{r['docs_cut']:>11,}{t:>11}")
    print(f"streaming best fit keeps {args.lookahead} rows open; docs cut: documents whose tokens "
          "land in more than one row")
    return 0


# --------------------------------------------------------------------------------- join
def _cmd_join(args: argparse.Namespace) -> int:
    from mmpack.store.join import join

    store = join(args.parts, args.output, append=args.append, overwrite=args.overwrite)
    index = sum(f.stat().st_size for f in Path(args.output).iterdir() if f.is_file())
    token_bytes = store.num_tokens * store.dtype.itemsize
    share = f" ({index / token_bytes:.2%} of the token bytes)" if token_bytes else ""
    print(f"{store.path}: {len(store.parts)} parts, {len(store):,} documents, "
          f"{store.num_tokens:,} tokens ({store.dtype.name}); wrote {_fmt_bytes(index)} of "
          f"manifest and offsets{share}; fingerprint {store.fingerprint}")
    return 0


# --------------------------------------------------------------------------------- verify
def _cmd_verify(args: argparse.Namespace) -> int:
    import mmpack

    store = mmpack.open(args.store)
    res = store.verify()
    parts = f"{res['parts']} parts, " if "parts" in res else ""
    print(f"{store.path}: ok, {parts}{res['blocks']} checksum blocks, {_fmt_bytes(res['bytes'])} "
          f"verified; {len(store):,} documents, {store.num_tokens:,} tokens, "
          f"fingerprint {store.fingerprint}")
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
def _int_at_least(lo: int, what: str):
    """An argparse ``type`` for an integer ``>= lo`` (``what`` names it in the error)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < lo:
            raise argparse.ArgumentTypeError(f"expected {what} >= {lo}, got {value}")
        return value

    return parse


_positive_int = _int_at_least(1, "an integer")
_token_id = _int_at_least(0, "an integer token id")


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
        "build", help="tokenize text files into a new store",
        description="Tokenize text into a new token store.  INPUT: files or quoted globs "
                    "(.txt/.md one document per file, or per line with --lines; .jsonl/.json "
                    "records with a text field; .parquet with a text column; optionally .gz or "
                    ".zst; "
                    "or a folder saved by Hugging Face datasets).  Bad records are reported on "
                    "stderr with their file and line.",
    )
    b.add_argument("inputs", nargs="+", metavar="INPUT", help="input files, folders or globs")
    b.add_argument("-o", "--output", required=True, metavar="STORE",
                   help="the store folder to create")
    b.add_argument("--tokenizer", metavar="PATH", default=None,
                   help="a tokenizer.json, a folder holding one, or a transformers tokenizer "
                        "folder (default: byte-level, UTF-8 bytes, eot 256)")
    b.add_argument("--field", default="text", metavar="NAME",
                   help="text field of JSON records / column of Parquet files (default: text)")
    b.add_argument("--lines", action="store_true",
                   help="text files hold one document per line (default: one per file)")
    b.add_argument("--format", choices=("text", "jsonl", "json", "parquet"), default=None,
                   help="format of every input file (default: from the extension)")
    b.add_argument("--format-for", action="append", default=None, metavar="PATTERN=FORMAT",
                   help="format of the files matching a glob pattern, e.g. '*.py=text' (source "
                        "files as text next to JSON lines); repeatable; others go by extension")
    b.add_argument("--workers", type=_positive_int, default=None, metavar="N",
                   help="tokenizer processes (default: the CPU count; 1 for byte-level)")
    b.add_argument("--batch-size", type=_positive_int, default=1000, metavar="N",
                   help="documents per tokenizer batch (default: 1000)")
    b.add_argument("--on-error", choices=("skip", "fail"), default="skip",
                   help="a bad record (invalid UTF-8 or JSON, missing or non-string field, "
                        "tokenizer failure) is reported and skipped, or stops the build with "
                        "nothing written (default: skip)")
    b.add_argument("--split", metavar="NAME", default=None,
                   help="read only this split of a saved Hugging Face DatasetDict (default: "
                        "every split, in name order)")
    b.add_argument("--template", metavar="TEMPLATE", default=None,
                   help="special tokens around every document: 'tokenizer' (the tokenizer's own "
                        "post-processor, e.g. BOS or [CLS] ... [SEP]) or a template such as "
                        "'<s> $A' or '[CLS] $A [SEP]' (default: none)")
    b.add_argument("--skip-empty", action="store_true",
                   help="drop empty documents (default: store them as empty documents)")
    b.add_argument("--backend", choices=("memmap", "zarr"), default="memmap",
                   help="storage backend (default: memmap)")
    b.add_argument("--overwrite", action="store_true", help="replace an existing store")
    b.add_argument("--quiet", action="store_true", help="no progress bar")
    b.add_argument("--engine", choices=("local", "dask", "serial"), default="local",
                   help="local: one store, tokenized by a local process pool (default); dask: "
                        "one part per task on a Dask cluster, joined into STORE (--workers then "
                        "sizes the local cluster); serial: the same parts, one after another")
    b.add_argument("--scheduler", metavar="ADDRESS", default=None,
                   help="with --engine dask: a running scheduler (tcp://host:8786) instead of a "
                        "local cluster on 127.0.0.1")
    b.add_argument("--part-mb", type=_positive_int, default=64, metavar="MB",
                   help="with --engine dask/serial: input megabytes per part; files are grouped "
                        "in order, never split (default: 64)")
    b.set_defaults(func=_cmd_build)

    i = sub.add_parser("info", help="what a store holds",
                       description="Counts, dtype, backend, size on disk, document-length "
                                   "quantiles and a histogram of a store.")
    i.add_argument("store", metavar="STORE", help="the store folder")
    i.add_argument("--json", action="store_true", help="print JSON instead of text")
    i.set_defaults(func=_cmd_info)

    s = sub.add_parser("show", help="one window or packed sample",
                       description="Print sample I of the window view (or of the packed view "
                                   "with --packed): its arrays, the documents it comes from, "
                                   "and with --decode its text, segment by segment.")
    s.add_argument("store", metavar="STORE", help="the store folder")
    s.add_argument("--seqlen", type=_positive_int, required=True, metavar="N",
                   help="tokens per sample")
    s.add_argument("--stride", type=_positive_int, default=None, metavar="S",
                   help="distance between window starts (default: seqlen; windows only)")
    s.add_argument("-i", "--index", type=int, required=True, metavar="I",
                   help="sample index (negative counts from the end)")
    s.add_argument("--packed", action="store_true",
                   help="the packed view (whole documents best-fit into rows) instead of windows")
    s.add_argument("--eot", type=_token_id_or_store, default=None, metavar="ID",
                   help="end-of-text id inserted after every document, or 'store' for the id "
                        "of the tokenizer the store records (default: none; the byte-level "
                        "tokenizer's is 256)")
    s.add_argument("--pad-id", type=_token_id, default=0, metavar="ID",
                   help="padding id (default: 0)")
    s.add_argument("--keep-last", action="store_true",
                   help="windows: add the final partial window, padded (default: dropped)")
    s.add_argument("--algorithm", choices=("bfd", "stream", "nextfit"), default="bfd",
                   help="packing algorithm of --packed (default: bfd)")
    s.add_argument("--long-docs", choices=("split", "truncate", "drop"), default="split",
                   help="documents longer than a row, with --packed (default: split)")
    s.add_argument("--decode", action="store_true", help="also print the decoded text")
    s.add_argument("--tokenizer", metavar="PATH", default=None,
                   help="tokenizer for --decode (default: the one the store records, else "
                        "byte-level)")
    s.set_defaults(func=_cmd_show)

    k = sub.add_parser("pack", help="packing statistics for a sequence length",
                       description="Build the packing plans (best-fit decreasing, streaming "
                                   "best fit, next fit) for SEQLEN and compare them with plain "
                                   "padding (one document per row) and concatenate-and-chunk: "
                                   "rows, efficiency (real tokens / slots), padding, documents "
                                   "cut.")
    k.add_argument("store", metavar="STORE", help="the store folder")
    k.add_argument("--seqlen", type=_positive_int, required=True, metavar="N",
                   help="tokens per row")
    k.add_argument("--eot", action=argparse.BooleanOptionalAction, default=True,
                   help="an end-of-text token follows every document and takes a slot "
                        "(default: yes)")
    k.add_argument("--long-docs", choices=("split", "truncate", "drop"), default="split",
                   help="documents longer than a row (default: split)")
    k.add_argument("--lookahead", type=_positive_int, default=1024, metavar="N",
                   help="open rows of the streaming algorithm (default: 1024)")
    k.add_argument("--json", action="store_true", help="print JSON instead of a table")
    k.set_defaults(func=_cmd_pack)

    v = sub.add_parser("verify", help="check a store's checksums",
                       description="Recompute every block checksum of a store; exit 1 naming "
                                   "the first bad block.")
    v.add_argument("store", metavar="STORE", help="the store folder")
    v.set_defaults(func=_cmd_verify)

    j = sub.add_parser("join", help="join stores into one without copying tokens",
                       description="Join PART stores (in order) into the store OUT: writes a "
                                   "manifest (part locations relative to OUT, fingerprints, "
                                   "counts) and the global document offsets (8 bytes per "
                                   "document), never a token.  OUT opens like any store; a "
                                   "part that later changes or goes missing is refused.")
    j.add_argument("parts", nargs="+", metavar="PART", help="part stores, in order")
    j.add_argument("-o", "--output", required=True, metavar="OUT", help="the join folder")
    j.add_argument("--append", action="store_true",
                   help="add the parts after those of the existing join OUT")
    j.add_argument("--overwrite", action="store_true",
                   help="replace the manifest of the existing join OUT (parts are kept)")
    j.set_defaults(func=_cmd_join)

    d = sub.add_parser("demo", help="the whole pipeline on the Python standard library",
                       description="Build a store from the Python standard library's own "
                                   "source files (byte-level tokens), then show what it holds, "
                                   "window samples, packing statistics and random-access "
                                   "speed.  Nothing is downloaded.")
    d.add_argument("--out", metavar="DIR", default=None,
                   help="keep the store in DIR/stdlib (default: a temporary folder, removed)")
    d.add_argument("--overwrite", action="store_true",
                   help="replace DIR/stdlib if it exists")
    d.set_defaults(func=_cmd_demo)

    if _benchmarks_root() is not None:
        n = sub.add_parser("bench", help="run the benchmarks (python -m benchmarks)",
                           description="Run 'python -m benchmarks' of the source checkout; every "
                                       "argument after 'bench' is passed on (e.g. 'mmpack bench "
                                       "--quick store window'; 'mmpack bench -- --help' for "
                                       "its options).")
        n.add_argument("bench_args", nargs=argparse.REMAINDER, metavar="ARGS",
                       help="arguments for python -m benchmarks (e.g. --quick)")
        n.set_defaults(func=_cmd_bench)
    return p


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
    from mmpack.errors import MmpackError

    try:
        return args.func(args)
    except (MmpackError, FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError,
            NotADirectoryError, ValueError, IndexError, ImportError) as exc:
        msg = " ".join(str(exc).split()) or type(exc).__name__
        print(f"{_PROG}: error: {msg}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{_PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `mmpack info STORE | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
