"""The subcommands that work on an existing store: ``pack`` (packing statistics of every
algorithm against padding and concatenate-and-chunk), ``verify`` (checksums), ``export`` (to
Megatron ``.bin/.idx`` or a flat EOS-separated file) and ``cp`` (a copy, local or remote); and
:func:`_open`, the STORE arguments opened (every subcommand over a store opens it here; those
that describe one, ``info`` and ``show``, are :mod:`mmpack._src.cli.inspect_commands`).

Each handler takes the parsed arguments and returns the exit code; library imports happen inside
the handlers so that ``mmpack --help`` starts fast.  Cost: ``pack`` packs with every algorithm;
``verify`` reads every byte; ``export`` and ``cp`` write every token once.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mmpack._src.cli.subsets import apply_subset

__all__: list[str] = []


def _open(args: argparse.Namespace, opener=None):
    """``mmpack.open`` (or ``opener``, called the same way) with the
    --format/--eos/--dtype/--metadata options of the store arguments."""
    import mmpack
    from mmpack._src.formats.eos_separated import EosSeparatedStore
    from mmpack._src.formats.megatron import detect_megatron

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


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


# --------------------------------------------------------------------------------- pack
_METHOD_NAMES = {
    "bfd": "best-fit decreasing",
    "online": "online best fit",
    "nextfit": "next fit",
    "pad": "pad (1 doc/row)",
    "chunk": "concat + chunk",
}


def _cmd_pack(args: argparse.Namespace) -> int:
    from mmpack._src.cli.demo import compare_packing
    from mmpack._src.store.vocab import resolve_special

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
    from mmpack._src.formats.eos_separated import EosSeparatedStore
    from mmpack._src.formats.export import export_flat, export_megatron

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
    from mmpack._src.ingest.copy import copy_store, open_source

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
