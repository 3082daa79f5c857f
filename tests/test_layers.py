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


# ------------------------------------------------------------------------------- house rules
# Sizes that keep a module readable in one sitting (CONTRIBUTING.md: "modules of a few hundred
# lines", "no function over ~80 lines except a documented numba kernel").  Measured from the
# tree, so a new module or function is held to them the moment it is written.  A function's
# lines are its span (``end_lineno - lineno + 1``: from its ``def`` line to its last line)
# less its docstring: the rule bounds the code a reader holds at once, and must never push a
# public function to document less (``ingest``'s signature and docstring alone are 91 lines).
MAX_MODULE_LINES = 420
MAX_FUNCTION_LINES = 80

# Numba kernels may be longer: a jitted loop cannot call a Python helper, and splitting a kernel
# across jitted functions costs a call per item in its hot loop.  Each entry is a documented
# ``@njit`` kernel with a slow twin in the tests; keep this list short, and drop an entry as soon
# as its kernel fits (the test below fails on an entry that is no longer needed).
LONG_KERNELS = {
    ("kernels/streaming_batch.py", "layout_batch"),  # a packed batch's rows in one pass
}


def _functions(tree: ast.AST):
    """Every function and method of ``tree`` with its length in lines, docstring excluded."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            span = node.end_lineno - node.lineno + 1  # type: ignore[operator]
            first = node.body[0]
            doc = (
                first.end_lineno - first.lineno + 1  # type: ignore[operator]
                if isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
                else 0
            )
            yield node, span - doc


def _is_jitted(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for dec in node.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name == "njit":
            return True
    return False


def test_modules_are_short():
    sizes = {
        str(path.relative_to(PACKAGE)): len(path.read_text().splitlines())
        for path in sorted(PACKAGE.rglob("*.py"))
    }
    long = {rel: n for rel, n in sizes.items() if n > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split along their seams): {long}"


def test_functions_are_short():
    long = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE))
        for node, n in _functions(ast.parse(path.read_text())):
            if n > MAX_FUNCTION_LINES and (rel, node.name) not in LONG_KERNELS:
                long[f"{rel}:{node.lineno} {node.name}"] = n
    assert not long, (
        f"functions over {MAX_FUNCTION_LINES} lines (extract the steps they take): {long}"
    )


def test_long_kernel_allowlist_is_needed():
    for rel, name in sorted(LONG_KERNELS):
        found = [
            (node, n)
            for node, n in _functions(ast.parse((PACKAGE / rel).read_text()))
            if node.name == name
        ]
        assert found, f"LONG_KERNELS names {rel} {name}, which no longer exists; drop the entry"
        for node, n in found:
            assert _is_jitted(node), f"{rel} {name} is in LONG_KERNELS but is no numba kernel"
            assert n > MAX_FUNCTION_LINES, (
                f"{rel} {name} is {n} lines now; drop it from LONG_KERNELS"
            )


def test_function_length_excludes_only_the_docstring():
    source = '''
def documented(x):
    """One line,
    and another."""
    y = x + 1
    return y


def plain(x):
    return x  # a string statement later on is code, not a docstring
    "not a docstring"
'''
    lengths = {node.name: n for node, n in _functions(ast.parse(source))}
    assert lengths == {"documented": 3, "plain": 3}
