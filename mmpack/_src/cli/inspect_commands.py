"""The subcommands that describe a store: ``info`` (what it holds: sizes, document lengths, its
provenance and the views' defaults) and ``show`` (one window or packed sample, as ids or decoded
text; by index, or the one a run served at a position: :mod:`mmpack._src.cli.position`).

Each handler takes the parsed arguments and returns the exit code; library imports happen inside
the handlers so that ``mmpack --help`` starts fast.  Cost: ``info`` reads the document lengths
(O(documents)) and stats every file; ``show`` builds its view (``--packed``: a packing plan,
cached in the store).
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from mmpack._src.cli.store_commands import _fmt_bytes, _open

if TYPE_CHECKING:
    from mmpack._src.ingest.tokenizer import Tokenizer
    from mmpack._src.views.packed import PackedDataset
    from mmpack._src.views.window import WindowDataset

__all__: list[str] = []


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
    from mmpack._src.store.vocab import resolve_special

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

    from mmpack._src.cli.position import check_run_flags, served_at

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
    from mmpack._src.ingest.provenance import store_tokenizer
    from mmpack._src.ingest.tokenizer import load_tokenizer
    from mmpack._src.store.vocab import tokenizer_record

    if args.tokenizer is None and tokenizer_record(store) is not None:
        return store_tokenizer(store)  # the tokenizer the store was built with
    return load_tokenizer(args.tokenizer)


def _print_origin(
    args: argparse.Namespace, store, ds: PackedDataset | WindowDataset, i: int
) -> None:
    """The ``from`` line of ``show``: the documents sample ``i`` comes from, token ranges."""
    from mmpack._src.views.packed import PackedDataset
    from mmpack._src.views.window import WindowDataset

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
        from mmpack._src.views.packed import PackedDataset

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
        from mmpack._src.views.window import WindowDataset

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
