"""The architecture, enforced: ``mmpack/`` holds the façade, the errors and one folder per layer,
and each module imports mmpack modules only from its own layer or the layers below it (imports
flow one way; see the README's Layout).  Layers are folders, so a new module is placed by where
it is written, not by a hand-kept list."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "mmpack"

# Bottom to top; a module may import from its own layer and the ones listed before it.
LAYERS = [
    {"errors", "kernels", "core"},
    {"store"},
    {"views"},
    {"sampling", "streaming"},
    {"torch"},
    {"ingest"},
    {"cli", "__main__", "__init__"},
]
TOP_LEVEL_FILES = {"__init__.py", "__main__.py", "errors.py", "py.typed"}


def _layer(module: str) -> int:
    top = module.split(".")[0]
    for k, names in enumerate(LAYERS):
        if top in names:
            return k
    raise AssertionError(f"mmpack.{module} is in no layer folder; add its folder to LAYERS")


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"] or ["__init__"]
        yield ".".join(parts), path


def test_top_level_is_facade_errors_and_layer_folders():
    entries = {p.name for p in PACKAGE.iterdir() if p.name != "__pycache__"}
    folders = {n for n in entries if (PACKAGE / n).is_dir()}
    assert entries - folders == TOP_LEVEL_FILES
    assert folders == set().union(*LAYERS) - {"errors", "__main__", "__init__"}


@pytest.mark.parametrize(("module", "path"), list(_modules()), ids=lambda x: str(x))
def test_imports_flow_one_way(module, path):
    own = _layer(module)
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mmpack."):
            names = [node.module[len("mmpack.") :]]
        elif isinstance(node, ast.Import):
            names = [a.name[len("mmpack.") :] for a in node.names if a.name.startswith("mmpack.")]
        for name in names:
            assert _layer(name) <= own, (
                f"mmpack.{module} (layer {own}) imports mmpack.{name} (layer {_layer(name)})"
            )


def test_old_module_paths_warn_and_alias():
    import importlib
    import sys
    import warnings

    from mmpack.core.moved import MOVED

    for old, new in MOVED.items():
        sys.modules.pop(old, None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            alias = importlib.import_module(old)
        assert any(
            issubclass(w.category, DeprecationWarning) and new in str(w.message) for w in caught
        ), old
        target = importlib.import_module(new)
        for name in getattr(target, "__all__", []):
            assert getattr(alias, name) is getattr(target, name), (old, name)
