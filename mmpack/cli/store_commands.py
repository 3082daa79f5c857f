"""The subcommands over an existing store: ``info`` (what it holds), ``show`` (one window or packed
sample, as ids or decoded text; by index, or the one a run served at a position:
:mod:`mmpack.cli.position`), ``pack`` (packing statistics of every algorithm against padding
and concatenate-and-chunk), ``verify`` (checksums), ``export`` (to Megatron ``.bin/.idx`` or a
flat EOS-separated file) and ``cp`` (a copy, local or remote); and :func:`_open`, the STORE
arguments opened.

Each handler takes the parsed arguments and returns the exit code; library imports happen inside
the handlers so that ``mmpack --help`` starts fast.  Cost: ``info`` reads the document lengths
(O(documents)) and stats every file; ``show`` builds its view (``--packed``: a packing plan,
cached in the store); ``pack`` packs with every algorithm; ``verify`` reads every byte.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmpack.cli.subsets import apply_subset

if TYPE_CHECKING:
    from mmpack.ingest.tokenizer import Tokenizer
    from mmpack.views.packed import PackedDataset
    from mmpack.views.window import WindowDataset

__all__: list[str] = []


def _open(args: argparse.Namespace, opener=None):
    """``mmpack.open`` (or ``opener``, called the same way) with the
    --format/--eos/--dtype/--metadata options of the store arguments."""
    import mmpack
    from mmpack.formats.eos_separated import EosSeparatedStore
    from mmpack.formats.megatron import detect_megatron

    opener = mmpack.open if opener is None else opener
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
    store = opener(args.store, format=args.format, **options)
    if (
        args.eos is not None
        and args.command != "export"
        and not isinstance(store, EosSeparatedStore)
    ):
        raise ValueError(f"--eos is for flat token files; {args.store} is a {store.backend} store")
    return apply_subset(store, args)


def _store_size(store) -> int:
    """Bytes of the files a store reads, each counted once: a join's own folder and its parts (a
    distributed build keeps them inside its folder; a part may be named twice); a remote store
    counts the bytes of its data objects (a remote join: its offsets, then its parts)."""
    sizes: dict[tuple[int, int], int] = {}
    remote: dict[str, int] = {}
    pending = [store]
    while pending:
        s = pending.pop()
        files = getattr(s, "source_files", None)
        joined = hasattr(s, "part_locations")  # its tokens are its parts'
        if files is None and "://" in s.location:
            tokens = 0 if joined else s.num_tokens * s.dtype.itemsize
            remote[s.location] = tokens + (len(s) + 1) * 8
        else:
            for f in files if files is not None else s.path.rglob("*"):
                if f.is_file():
                    st = f.stat()
                    sizes[(st.st_dev, st.st_ino)] = st.st_size
        pending.extend(s.parts if joined else ())
    return sum(remote.values()) + sum(sizes.values())


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


def _chat_and_fields(prov: dict[str, Any]) -> str:
    """What a build took beyond the text, as its flags: ``" (--loss-on assistant, --fields
    source,lang)"``, or nothing."""
    flags = [f"--loss-on {prov['loss_on']}"] if prov.get("loss_on") else []
    if prov.get("fields"):
        flags.append("--fields " + ",".join(map(str, prov["fields"])))
    return f" ({', '.join(flags)})" if flags else ""


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
        "loss_mask": store.has_loss_mask,
        "fields": store.fields.summary(),
        "format_version": store.meta.get("version"),
        "doc_length": _length_quantiles(lens),
    }
    for section in ("tokenizer", "provenance", "order"):
        if isinstance(store.meta.get(section), dict):
            info[section] = store.meta[section]
    info["view_defaults"] = _view_defaults(store)
    if hasattr(store, "part_locations"):  # a joined store (its size counts its parts)
        info["parts"] = store.part_locations
    if args.json:
        print(json.dumps(info, indent=1))
    else:
        _print_info(info, store, lens)
    return 0


def _view_defaults(store) -> dict:
    """The eot and pad id the views take by default (``"store"`` resolved)."""
    from mmpack.store.vocab import resolve_special

    return {name: resolve_special("store", store, name) for name in ("eot", "pad_id")}


def _print_info(info: dict, store, lens) -> None:
    """``mmpack info`` as text: one labelled line a fact, then the length histogram."""
    q = info["doc_length"]
    print(f"store        {info['path']}")
    if store.meta.get("format") == info["backend"]:  # a foreign store: its format and source
        source = store.meta.get("source", {})
        print(
            f"format       {info['backend']}"
            + (f" v{info['format_version']}" if info["format_version"] is not None else "")
            + f", file dtype {source.get('dtype')}, served in place (read-only)"
        )
    elif info["backend"] == "subset":
        parent = store.parent
        print(f"subset       {len(store):,} of the {len(parent):,} documents of {parent.location}")
    else:
        print(f"backend      {info['backend']} (format v{info['format_version']})")
    print(f"documents    {info['documents']:,} ({info['empty_documents']:,} empty)")
    print(
        f"tokens       {info['tokens']:,} ({info['dtype']}, "
        f"{store.dtype.itemsize} byte{'s' if store.dtype.itemsize > 1 else ''} each)"
    )
    print(f"size         {_fmt_bytes(info['bytes_on_disk'])} on disk")
    print(f"fingerprint  {info['fingerprint']}")
    if info["loss_mask"]:
        print("loss mask    yes (one 0/1 value per token, 1 = the token is a target)")
    for name, rec in info["fields"].items():
        if "top" in rec:
            top = ", ".join(f"{k!r} {v:,}" for k, v in rec["top"].items())
            what = f"{rec['categories']:,} categories (most frequent: {top})"
        else:
            what = ", ".join(f"{k} {rec[k]:.6g}" for k in ("min", "max", "mean") if k in rec)
        print(f"field        {name}: {rec['kind']} ({rec['dtype']}){': ' + what if what else ''}")
    tok = info.get("tokenizer")
    if tok:
        ids = ", ".join(f"{k} {v}" for k, v in tok.get("special_ids", {}).items()) or "none"
        kept = f", copy in {tok['file']}" if tok.get("file") else ""
        print(
            f"tokenizer    {tok.get('kind')} (vocab {tok.get('vocab_size'):,}{kept}; "
            f"special ids: {ids})"
        )
    views = info["view_defaults"]
    print(
        f"views        eot {views['eot']}, pad {views['pad_id']} by default (eot/pad_id 'store': "
        "the ids the store's tokenizer records, else no eot and pad 0)"
    )
    prov = info.get("provenance")
    if prov:
        n_in = len(prov.get("inputs", []))
        print(
            f"built        {prov.get('time')} by mmpack {prov.get('mmpack_version')} from "
            f"{n_in} input{'s' if n_in != 1 else ''}: read {prov.get('docs_read', 0):,}, "
            f"skipped {prov.get('docs_skipped', 0):,} with errors and "
            f"{prov.get('empty_skipped', 0):,} empty{_chat_and_fields(prov)}"
        )
    order = info.get("order")
    if order:
        print(f"order        {_order_line(order)}")
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


def _order_line(order: dict) -> str:
    """The ``"order"`` section (a build's ``--shuffle-docs``) in words."""
    seed = order.get("seed")
    if order.get("parts"):
        return (
            f"documents keyed within each of {order.get('part_count')} parts, parts in a "
            f"keyed order (--shuffle-docs {seed})"
        )
    return f"documents in a keyed random order (--shuffle-docs {seed})"


# --------------------------------------------------------------------------------- show
def _cmd_show(args: argparse.Namespace) -> int:
    import numpy as np

    from mmpack.cli.position import check_run_flags, served_at

    check_run_flags(args)
    store = _open(args)
    tok = _show_tokenizer(args, store) if args.decode else None
    ds, what = _show_view(args, store)
    n = len(ds)
    if args.position is not None:
        index, line = served_at(args, ds)
        print(line)
        if index is None:  # a run over another dataset: its index is all there is to show
            return 0
        i = index
    elif not -n <= args.index < n:
        raise IndexError(f"sample index {args.index} is out of range: the view has {n} samples")
    else:
        i = args.index % n
    sample = ds[i]
    print(what.format(i=i, n=n))
    for key, value in sample.items():
        arr = np.asarray(value)
        print(f"{key:<15}{arr.tolist()}")
    _print_origin(args, store, ds, i)
    if tok is not None:
        ids = np.asarray(sample["input_ids"])
        cu = np.asarray(sample.get("cu_seqlens", [0, ids.size])).tolist()
        for a, b in zip(cu[:-1], cu[1:]):
            print(f"--- positions {a}..{b} ---")
            print(tok.decode(ids[a:b]))
    return 0


def _show_tokenizer(args: argparse.Namespace, store) -> Tokenizer:
    """The tokenizer of ``show --decode``: ``--tokenizer``, else the one the store records, else
    byte-level."""
    from mmpack.ingest.provenance import store_tokenizer
    from mmpack.ingest.tokenizer import load_tokenizer
    from mmpack.store.vocab import tokenizer_record

    if args.tokenizer is None and tokenizer_record(store) is not None:
        return store_tokenizer(store)  # the tokenizer the store was built with
    return load_tokenizer(args.tokenizer)


def _print_origin(
    args: argparse.Namespace, store, ds: PackedDataset | WindowDataset, i: int
) -> None:
    """The ``from`` line of ``show``: the documents sample ``i`` comes from, token ranges."""
    from mmpack.views.packed import PackedDataset
    from mmpack.views.window import WindowDataset

    assert isinstance(ds, PackedDataset if args.packed else WindowDataset)
    pieces = [
        f"doc {p['doc']} tokens {p['start']}..{p['stop']}" + (" + eot" if p["eot"] else "")
        for p in ds.locate(i)
    ]
    print("from           " + "; ".join(pieces))


def _show_view(args: argparse.Namespace, store) -> tuple[PackedDataset | WindowDataset, str]:
    """The view ``show`` samples (packed rows with ``--packed``, else windows) and the title of a
    sample (a format string over ``i`` and ``n``)."""
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
            check_vocab=args.check_vocab,
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
            check_vocab=args.check_vocab,
        )
        what = (
            f"window {{i}} of {{n}} (seqlen {args.seqlen}, stride {ds.stride}, eot {ds.eot}, "
            f"pad {ds.pad_id})"
        )
    return ds, what


# --------------------------------------------------------------------------------- pack
_METHOD_NAMES = {
    "bfd": "best-fit decreasing",
    "online": "online best fit",
    "nextfit": "next fit",
    "pad": "pad (1 doc/row)",
    "chunk": "concat + chunk",
}


def _cmd_pack(args: argparse.Namespace) -> int:
    from mmpack.cli.demo import compare_packing
    from mmpack.store.vocab import resolve_special

    store = _open(args)
    eot = resolve_special(args.eot, store, "eot")  # "store": the recorded eot, else none
    add_eot = eot is not None
    rows = compare_packing(
        store.doc_lens,
        args.seqlen,
        add_eot=add_eot,
        long_docs=args.long_docs,
        lookahead=args.lookahead,
        algorithms=("bfd", "online", "nextfit"),
    )
    if args.json:
        print(
            json.dumps(
                {
                    "store": store.location,
                    "seqlen": args.seqlen,
                    "add_eot": add_eot,
                    "eot": eot,
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
        f"({f'with an eot ({eot}) per document' if add_eot else 'without an eot'}), "
        f"seqlen {args.seqlen}, "
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
        f"online best fit keeps {args.lookahead} rows open; docs cut: documents whose tokens "
        "land in more than one row"
    )
    return 0


# --------------------------------------------------------------------------------- verify
def _cmd_verify(args: argparse.Namespace) -> int:
    store = _open(args)
    res = store.verify(progress=args.progress)
    parts = f"{res['parts']} parts, " if "parts" in res else ""
    print(
        f"{store.location}: ok, {parts}{res['blocks']} checksum blocks, {_fmt_bytes(res['bytes'])} "
        f"verified; {len(store):,} documents, {store.num_tokens:,} tokens, "
        f"fingerprint {store.fingerprint}"
        + (
            f"; checksums recorded in {res['sidecar']} (checked by the next verify)"
            if res.get("recorded") and res.get("sidecar")
            else "; the checksums could not be kept (the cache folder is not writable)"
            if res.get("recorded")
            else ""
        )
    )
    return 0


# --------------------------------------------------------------------------------- export
def _cmd_export(args: argparse.Namespace) -> int:
    from mmpack.formats.eos_separated import EosSeparatedStore
    from mmpack.formats.export import export_flat, export_megatron

    store = _open(args)
    if args.to == "megatron":
        if args.eos is not None and not isinstance(store, EosSeparatedStore):
            raise ValueError("--eos is for --to npy/olmo (or an eos-separated STORE)")
        bin_path, idx_path = export_megatron(
            store, args.output, overwrite=args.overwrite, progress=args.progress
        )
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
            progress=args.progress,
        )
        written = str(path) + (" and its .csv.gz document metadata" if args.to == "olmo" else "")
    print(
        f"{store.location}: {len(store):,} documents, {store.num_tokens:,} tokens written "
        f"to {written}"
    )
    return 0


# --------------------------------------------------------------------------------- cp
def _cmd_cp(args: argparse.Namespace) -> int:
    from mmpack.ingest.copy import copy_store, open_source

    source = _open(args, open_source)
    copy = copy_store(
        source,
        args.destination,
        overwrite=args.overwrite,
        backend=args.backend,
        progress=args.progress,
    )
    parts = getattr(source, "part_locations", None)
    what = f"{len(parts)} parts flattened, " if parts is not None else ""
    print(
        f"{source.location} -> {copy.location}: {what}{len(copy):,} documents, "
        f"{copy.num_tokens:,} tokens ({copy.dtype.name}, {copy.backend}), "
        f"{_fmt_bytes(copy.nbytes)} copied and verified; fingerprint {copy.fingerprint}"
    )
    return 0
