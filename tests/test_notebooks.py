"""The notebooks run from top to bottom without an error and write their plots.

Each is executed with nbclient in a temporary working directory (so the committed PNGs under
``notebooks/`` are not touched) on the ``python3`` kernel, which ipykernel provides for the
running interpreter (no ``ipykernel install`` step is needed).

Run: ``.venv/bin/python -m pytest tests/test_notebooks.py -q``.
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def _mmpack_imports(name: str) -> list[tuple[str, str]]:
    """``(module, name)`` of every ``from mmpack... import name`` in the notebook's code cells."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    found = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for node in ast.walk(ast.parse(cell.source)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "mmpack":
                found += [(node.module, alias.name) for alias in node.names]
    return found


@pytest.mark.parametrize("name", ["quickstart.ipynb", "packing.ipynb"])
def test_notebooks_import_from_the_public_home_of_each_name(name):
    """Each name comes from a module that exports it, and from the shallowest one that does:
    ``mmpack.ingest``, not ``mmpack._src.ingest.pipeline``; ``mmpack.cli``, not ``mmpack._src.cli.demo``."""
    imports = _mmpack_imports(name)
    assert imports  # the notebooks do use mmpack
    for module, attr in imports:
        assert attr in importlib.import_module(module).__all__, (module, attr)
        parts = module.split(".")
        for depth in range(1, len(parts)):
            parent = ".".join(parts[:depth])
            exported = getattr(importlib.import_module(parent), "__all__", [])
            assert attr not in exported, f"{name}: import {attr} from {parent}, not {module}"


def test_the_python3_kernel_runs_this_interpreter():
    spec = KernelSpecManager().get_kernel_spec("python3")
    assert spec.argv[0] in (sys.executable, "python", "python3")  # "python" is mapped to it


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "pngs"),
    [("quickstart.ipynb", []), ("packing.ipynb", ["doc_lengths.png", "packing_efficiency.png"])],
)
def test_notebook_runs_and_writes_its_plots(tmp_path, name, pngs):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError on the first failing cell
    errors = [
        o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"
    ]
    assert errors == []
    for png in pngs:
        data = (tmp_path / png).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 10_000
        assert (NOTEBOOKS / png).is_file()  # the committed copy
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    if name == "quickstart.ipynb":
        assert "118 tokens with eots -> 28 samples" in text
    else:
        assert "packing plans in" in text and "2,000,000 documents" in text
        assert "lognormal(5.48, 1.15)   8192" in text
