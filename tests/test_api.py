"""The public surface: ``mmpack.__all__`` resolves lazily and every module keeps a sorted
``__all__`` of names it defines."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import pytest

import mmpack

MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(mmpack.__path__, "mmpack.")
    if not m.name.endswith("__main__")
)


def test_public_names_resolve():
    for name in mmpack.__all__:
        assert getattr(mmpack, name) is not None, name
    assert mmpack.open.__name__ == "open_store"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        mmpack.nope  # noqa: B018


def test_import_is_light():
    """``import mmpack`` loads neither numba, zarr nor torch (the CLI's --help stays instant)."""
    code = "import sys, mmpack; print(sorted(m for m in ('numba', 'zarr', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("name", MODULES)
def test_module_all_is_sorted_and_defined(name):
    module = importlib.import_module(name)
    names = getattr(module, "__all__", None)
    if names is None:
        assert name.rsplit(".", 1)[-1].startswith("_"), f"{name} has no __all__"
        return
    assert list(names) == sorted(names), name
    for attr in names:
        assert hasattr(module, attr), f"{name}.__all__ lists {attr!r}, which it does not define"


def test_cli_helpers_are_public_and_load_lazily():
    """``mmpack.cli`` exports the demo helpers without importing numpy until one is used."""
    code = (
        "import sys, mmpack.cli as c; before = 'numpy' in sys.modules; "
        "f = c.compare_packing; print(before, 'numpy' in sys.modules, f.__module__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True", "mmpack.cli.demo"]
    import mmpack.cli

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        mmpack.cli.nope  # noqa: B018
