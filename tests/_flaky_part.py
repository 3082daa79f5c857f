"""A per-part function whose first attempt at part 1 writes the part and then fails, as a worker
that dies after writing would; sent to Dask workers by value (see tests/test_distributed.py)."""

from __future__ import annotations

from pathlib import Path

from mmpack.ingest import build_part


def flaky_build_part(inputs, part_path, options):
    path = Path(part_path)
    marker = path.parents[2] / f"attempted-{path.name}"  # beside the staging folder
    if path.name == "part-00001" and not marker.exists():
        build_part(inputs, part_path, options)
        marker.touch()
        raise RuntimeError("simulated worker failure after the part was written")
    return build_part(inputs, part_path, options)
