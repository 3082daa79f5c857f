"""The architecture, enforced: each module imports mmpack modules only from its own layer or
the layers below it (imports flow one way; see the README's Layout)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "mmpack"

LAYERS = [
    {"errors", "validation", "kernels", "buffers", "batch"},
    {"format", "masking", "permutation"},
    {"backends", "store"},
    {"writer"},
    {"window", "plan", "packed", "mixture", "schedules", "prefetch", "microbatch", "streaming",
     "stream_sources"},
    {"sampler", "collate", "attention"},
    {"tokenizer", "ingest"},
    {"demo", "cli", "__main__", "__init__"},
]


def _layer(module: str) -> int:
    top = module.split(".")[0]
    for k, names in enumerate(LAYERS):
        if top in names:
            return k
    raise AssertionError(f"mmpack.{module} is in no layer; add it to LAYERS")


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"] or ["__init__"]
        yield ".".join(parts), path


@pytest.mark.parametrize(("module", "path"), list(_modules()), ids=lambda x: str(x))
def test_imports_flow_one_way(module, path):
    own = _layer(module)
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mmpack."):
            names = [node.module[len("mmpack."):]]
        elif isinstance(node, ast.Import):
            names = [a.name[len("mmpack."):] for a in node.names if a.name.startswith("mmpack.")]
        for name in names:
            assert _layer(name) <= own, f"mmpack.{module} (layer {own}) imports mmpack.{name} (layer {_layer(name)})"
