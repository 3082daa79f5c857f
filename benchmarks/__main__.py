"""Run every benchmark topic and print one table each: ``python -m benchmarks [--quick] [topic...]``.

Writes the raw rows to ``benchmarks/results/latest.json`` (``latest-quick.json`` with
``--quick``), the printed tables of a run of every topic to ``latest.md`` (and, for a full run,
to ``docs/benchmarks.md`` through :mod:`benchmarks.docs_page`), and the plots that topics return
to ``benchmarks/results/*.png``.
"""

from __future__ import annotations

import argparse
import importlib
import io
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

TOPICS = {
    "store": "benchmarks.bench_store",
    "window": "benchmarks.bench_window",
    "packing": "benchmarks.bench_packing",
    "regions": "benchmarks.bench_regions",
    "packed": "benchmarks.bench_packed",
    "streaming": "benchmarks.bench_streaming",
    "sampler": "benchmarks.bench_sampler",
    "e2e": "benchmarks.bench_e2e",
    "hf": "benchmarks.bench_hf",
    "foreign": "benchmarks.bench_foreign",
    "megatron_order": "benchmarks.bench_megatron_order",
    "remote": "benchmarks.bench_remote",
    "cold": "benchmarks.bench_cold",
    "first_call": "benchmarks.bench_first_call",
    "ingest": "benchmarks.bench_ingest",
    "join": "benchmarks.bench_join",
    "kernels": "benchmarks.bench_kernels",
    "lossmask": "benchmarks.bench_lossmask",
    "schedule": "benchmarks.bench_schedule",
    "provenance": "benchmarks.bench_provenance",
    "subset": "benchmarks.bench_subset",
    "balance": "benchmarks.bench_balance",
}
RESULTS = Path(__file__).resolve().parent / "results"


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 1e5 or abs(value) < 1e-3:
            return f"{value:.3g}"
        return f"{value:.3f}" if abs(value) < 10 else f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def print_table(title: str, rows: list[dict[str, Any]], out=sys.stdout) -> None:
    """Print ``rows`` as a Markdown table whose columns are the union of the rows' keys."""
    rows = [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]
    columns: list[str] = []
    for r in rows:
        columns.extend(k for k in r if k not in columns)
    print(f"\n### {title}\n", file=out)
    print("| " + " | ".join(columns) + " |", file=out)
    print("|" + "|".join("---" for _ in columns) + "|", file=out)
    for r in rows:
        print("| " + " | ".join(_fmt(r.get(c, "")) for c in columns) + " |", file=out)
    out.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument(
        "topics",
        nargs="*",
        metavar="TOPIC",
        help=f"topics to run, of {sorted(TOPICS)} (default all)",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run for CI")
    args = parser.parse_args(argv)
    topics = args.topics or list(TOPICS)
    unknown = sorted(set(topics) - set(TOPICS))
    if unknown:
        parser.error(f"unknown topic(s) {unknown}; choose from {sorted(TOPICS)}")
    RESULTS.mkdir(exist_ok=True)
    report: dict[str, Any] = {
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),
        },
        "quick": args.quick,
        "topics": {},
    }
    header = f"mmpack benchmarks ({'quick' if args.quick else 'full'}) on {os.cpu_count()} CPUs"
    print(header)
    tables = io.StringIO()
    tables.write(
        f"# {header}\n\nCommand: `python -m benchmarks{' --quick' if args.quick else ''}`\n"
    )
    failed = []
    for name in topics:
        module = importlib.import_module(TOPICS[name])
        t0 = time.perf_counter()
        rows = module.run(quick=args.quick)
        elapsed = time.perf_counter() - t0
        print_table(f"{name} ({elapsed:.0f} s)", rows)
        print_table(f"{name} ({elapsed:.0f} s)", rows, out=tables)
        plot = getattr(module, "plot", None)
        if plot is not None and not args.quick:
            plot(rows, RESULTS)
        report["topics"][name] = {"seconds": elapsed, "rows": rows}
        failed += [f"{name}: {r.get('case')}" for r in rows if r.get("met") is False]
    stem = "latest-quick" if args.quick else "latest"
    out = RESULTS / f"{stem}.json"
    out.write_text(json.dumps(report, indent=1, default=str))
    if set(topics) == set(TOPICS):
        (RESULTS / f"{stem}.md").write_text(tables.getvalue())
        if not args.quick:  # the committed run: docs/benchmarks.md shows its tables
            from benchmarks.docs_page import main as write_docs_page

            write_docs_page([])
    print(f"\nraw figures: {out}")
    if failed:
        print("targets not met: " + "; ".join(failed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
