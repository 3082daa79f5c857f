"""The public surface: ``mmpack.__all__`` resolves lazily and every module keeps a sorted
``__all__`` of names it defines."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import json
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _pages import PAGES, _blocks

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
    assert mmpack.Schedule.__module__ == "mmpack._src.sampling.schedule"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        mmpack.nope  # noqa: B018


def test_the_roots_typed_imports_are_its_lazy_table():
    """The root lists each lazy name twice: ``_LAZY`` (what ``__getattr__`` imports) and the
    ``TYPE_CHECKING`` imports (what type checkers and the API reference read); they agree."""
    tree = ast.parse((ROOT / "mmpack" / "__init__.py").read_text())
    typed = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom)
                typed |= {(a.asname or a.name): (imp.module, a.name) for a in imp.names}
    lazy = {
        name: entry if isinstance(entry, tuple) else (entry, name)
        for name, entry in mmpack._LAZY.items()
    }
    assert typed == lazy


def test_import_registers_the_adapters():
    from mmpack._src.store import registry

    assert registry.OPENERS["url"] == "mmpack._src.remote.opener:open_url"
    assert {"megatron", "eos-separated", "parts"} <= set(registry.OPENERS)
    assert registry.WRITERS["url"] == "mmpack._src.remote.writer:RemoteStoreWriter"
    assert "mmpack._src.joins.opening:detect_join" in registry.DETECTORS


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


ROOT = Path(__file__).resolve().parent.parent
USER_SOURCES = ("mmpack", "tests", "benchmarks", "docs", "notebooks", "README.md")
"""Where a public name may be used: another module, a test, a benchmark, a page or a notebook."""


def test_every_public_name_has_a_user():
    """A name a module exports (its ``__all__``) is used outside that module: by another module,
    a test, a benchmark, a page or a notebook; else it is private (``_name``) or gone."""
    texts = {}
    for top in USER_SOURCES:
        root = ROOT / top
        paths = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
        for path in paths:
            if path.suffix in (".py", ".md", ".ipynb") and "__pycache__" not in path.parts:
                texts[path] = path.read_text(errors="replace")
    unused = []
    for name in MODULES:
        module = importlib.import_module(name)
        own = Path(module.__file__).resolve()
        for attr in getattr(module, "__all__", ()):
            word = re.compile(rf"\b{re.escape(attr)}\b")
            if not any(word.search(text) for path, text in texts.items() if path != own):
                unused.append(f"{name}.{attr}")
    assert not unused, f"public names nothing outside their module uses: {unused}"


def test_cli_helpers_are_public_and_load_lazily():
    """``mmpack.cli`` exports the demo helpers without importing numpy until one is used."""
    code = (
        "import sys, mmpack.cli as c; before = 'numpy' in sys.modules; "
        "f = c.compare_packing; print(before, 'numpy' in sys.modules, f.__module__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True", "mmpack._src.cli.demo"]
    import mmpack.cli

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        mmpack.cli.nope  # noqa: B018


# -- one name per concept --------------------------------------------------------------------------
REQUIRED = inspect.Parameter.empty


def _public_callables() -> dict[str, object]:
    """Every public class and function whose parameters name the shared concepts."""
    import mmpack._src.torch.attention as attention
    from mmpack._src.cli.demo import compare_packing
    from mmpack._src.ingest.region_plan import build_region_plan
    from mmpack._src.packing.options import PlanSpec
    from mmpack._src.packing.plan import build_plan
    from mmpack._src.torch.collate import Collator, collate
    from mmpack._src.torch.hf import hf_inputs
    from mmpack._src.torch.loading import loader
    from mmpack._src.torch.streaming import PackerDataset

    found = {
        name: getattr(mmpack, name)
        for name in ("WindowDataset", "PackedDataset", "Mixture", "ResumableSampler", "Stages")
    }
    found |= {"Permutation": mmpack.Permutation, "StreamingPacker": mmpack.StreamingPacker}
    found |= {"join": mmpack.join, "collate": collate, "Collator": Collator}
    found |= {"PackerDataset": PackerDataset, "loader": loader}
    found |= {"hf_inputs": hf_inputs, "build_plan": build_plan, "PlanSpec": PlanSpec}
    found |= {"build_region_plan": build_region_plan, "compare_packing": compare_packing}
    for name in attention.__all__:
        if callable(getattr(attention, name)) and name[0].islower():
            found[f"attention.{name}"] = getattr(attention, name)
    return found


def _parameters(obj) -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(obj).parameters)


# (callable, parameter, default): the same concept has the same keyword and the same default in
# every public signature.  Token ids are ``eot`` / ``pad_id`` (an int, or "store" where a store is
# read: the id its tokenizer records, else no eot and pad 0); a bool about an eot is ``add_eot``;
# seeds default to 0; per-token integer types are ``dtype``, int64 by default.  ``drop_last``
# drops an incomplete tail everywhere; the views and the packer drop theirs by default, the
# sampler (as torch's DistributedSampler) does not.
SHARED = [
    *[(c, "seqlen", REQUIRED) for c in ("WindowDataset", "PackedDataset", "build_plan")],
    *[(c, "seqlen", REQUIRED) for c in ("PlanSpec", "build_region_plan", "compare_packing")],
    ("StreamingPacker", "seqlen", REQUIRED),
    *[(c, "seed", 0) for c in ("PackedDataset", "Mixture", "ResumableSampler", "Permutation")],
    ("Stages", "seed", 0),
    ("StreamingPacker", "seed", 0),
    ("WindowDataset", "eot", "store"),
    ("PackedDataset", "eot", "store"),
    ("StreamingPacker", "eot", None),
    ("WindowDataset", "pad_id", "store"),
    ("PackedDataset", "pad_id", "store"),
    ("Collator", "pad_id", 0),
    ("StreamingPacker", "pad_id", 0),
    *[(c, "add_eot", REQUIRED) for c in ("build_plan", "PlanSpec", "build_region_plan")],
    ("compare_packing", "add_eot", True),
    *[(c, "dtype", "int64") for c in ("WindowDataset", "PackedDataset", "collate", "Collator")],
    ("PackerDataset", "dtype", "int64"),
    ("WindowDataset", "drop_last", True),
    ("StreamingPacker", "drop_last", True),
    ("ResumableSampler", "drop_last", False),
    ("Stages", "drop_last", False),
    ("loader", "drop_last", False),
    ("loader", "seed", 0),
    *[(c, "long_docs", "split") for c in ("PackedDataset", "build_plan", "PlanSpec")],
    *[
        (c, "long_docs", "split")
        for c in ("build_region_plan", "compare_packing", "StreamingPacker")
    ],
    *[(c, "algorithm", "bfd") for c in ("PackedDataset", "build_plan", "PlanSpec")],
    ("build_region_plan", "algorithm", "bfd"),
    *[(c, "lookahead", 1024) for c in ("PackedDataset", "build_plan", "PlanSpec")],
    *[(c, "lookahead", 1024) for c in ("build_region_plan", "compare_packing")],
    *[(c, "label_shift", "next") for c in ("PackedDataset", "hf_inputs")],
    *[(c, "check_vocab", True) for c in ("WindowDataset", "PackedDataset")],
    *[(c, "mixed_tokenizers", False) for c in ("Mixture", "join")],
    *[(c, "ignore_index", -100) for c in ("Collator", "StreamingPacker")],
]


def _same_default(got, want) -> bool:
    if want == "int64" and got is not REQUIRED and got is not None:
        import numpy as np

        return np.dtype(str(got).removeprefix("torch.")) == np.int64  # "int64" or torch.int64
    return type(got) is type(want) and got == want or got is want


@pytest.mark.parametrize(("owner", "name", "default"), SHARED)
def test_shared_concepts_have_one_name_and_one_default(owner, name, default):
    params = _parameters(_public_callables()[owner])
    assert name in params, f"{owner} has no {name}= (it takes {sorted(params)})"
    got = params[name].default
    assert _same_default(got, default), f"{owner}({name}=) defaults to {got!r}, not {default!r}"


# Other spellings of those concepts, in no public signature (a bool about an eot is add_eot, an
# eot argument is never a bool).
OTHER_SPELLINGS = {"seq_len", "max_len", "out_pseq_len", "eot_id", "pad_token_id", "pad", "rng"}


@pytest.mark.parametrize(
    "owner",
    sorted(_public_callables()),
)
def test_no_other_spelling_of_a_shared_concept(owner):
    params = _parameters(_public_callables()[owner])
    assert not OTHER_SPELLINGS & set(params), sorted(OTHER_SPELLINGS & set(params))
    if "eot" in params:
        assert not isinstance(params["eot"].default, bool), f"{owner}(eot=bool): use add_eot"
    for name in ("eot", "pad_id"):  # ids of the views: an int, "store" or (eot) None
        assert params.get(name, inspect.Parameter("x", 1, default=0)).default in (0, None, "store")


def test_the_views_take_an_id_store_or_none(tmp_path):
    """Every store-backed view accepts the same values for ``eot`` and ``pad_id`` and shows the
    ids in use."""
    store = mmpack.build(tmp_path / "s", [[1, 2, 3], [4, 5]])
    for view in (mmpack.WindowDataset, mmpack.PackedDataset):
        for eot, pad_id, want in [
            (9, 8, (9, 8)),
            ("store", "store", (None, 0)),
            (None, 7, (None, 7)),
        ]:
            ds = view(store, 4, eot=eot, pad_id=pad_id)
            assert (ds.eot, ds.pad_id) == want and f"eot={want[0]}, pad_id={want[1]}" in repr(ds)
        assert view(str(tmp_path / "s"), 4).store.fingerprint == store.fingerprint  # a path too
    views = [mmpack.WindowDataset(store, 2), mmpack.PackedDataset(store, 4)]
    for view in (*views, mmpack.Mixture(views[:1], [1.0])):  # every view's stats(): one shape
        stats = view.stats()
        assert dataclasses.is_dataclass(stats) and type(stats).__dataclass_params__.frozen
        assert isinstance(stats.as_dict(), dict)


# -- the public surface: the root and the modules beside mmpack._src ---------------------------------
FACADES = sorted(
    p.stem for p in (ROOT / "mmpack").glob("*.py") if p.stem not in ("__init__", "__main__")
)
PUBLIC_MODULES = ["mmpack", *(f"mmpack.{name}" for name in FACADES)]
MAX_PUBLIC_NAMES = 120
"""Names the public modules export beyond the root's (issue: a small surface, grain's pattern)."""


def test_public_modules_re_export_the_implementation_and_stay_small():
    beyond = set()
    for name in PUBLIC_MODULES:
        module = importlib.import_module(name)
        for attr in module.__all__:
            value = getattr(module, attr)
            home = getattr(value, "__module__", None)
            if name != "mmpack.errors" and home is not None and not isinstance(value, (int, str)):
                assert home.startswith(("mmpack._src.", "mmpack.errors")), (name, attr, home)
        if name != "mmpack":
            beyond |= set(module.__all__) - set(mmpack.__all__)
    assert len(beyond) <= MAX_PUBLIC_NAMES, sorted(beyond)


BENCHMARK_INTERNALS = {
    "bench_block_fetch.py": "sizes its store in the fetcher's units (FETCH_BLOCK_BYTES, "
    "WINDOW_BLOCKS) and times the stripe digests against the link",
    "bench_cold.py": "drops a memmap store's mapping (mapping_of) to time a cold read",
    "bench_foreign.py": "writes Megatron files by hand (MAGIC) and waits out the index's "
    "settle time (INDEX_SETTLE_NS)",
    "bench_getitem.py": "times the one-sample kernels (one_bin, one_window) beside the views",
    "bench_megatron_order.py": "writes Megatron files by hand (MAGIC)",
    "bench_regions.py": "sweeps region sizes around the default (DEFAULT_REGION_BINS)",
    "bench_remote.py": "counts the check table's bytes its S3 client fetches (S3Transport)",
    "bench_remote_zarr.py": "empties the Zarr backend's chunk cache between runs (get_cache)",
    "bench_store.py": "times the store's stripe writer and digests (StripeWriter, STRIPE_BYTES, "
    "stripe_digest) alone",
    "bench_streaming.py": "times the best-fit placement kernel alone (place_batch)",
    "bench_window.py": "times the window kernel alone and the Zarr backend's chunk cache",
    "gpu_check.py": "loads collate and the attention masks without the package's __init__ "
    "where numba and zarr are not installed",
    "trust_costs.py": "sizes a plan from its arrays (ARRAYS)",
}
"""Benchmarks that time a kernel or a layer alone import it from the implementation, each with
why; the test below fails on any other private import outside the package, and on an entry
that no longer needs one (the list only shrinks)."""


def _code_blocks(path: Path) -> list[str]:
    """The Python code of a benchmark, a notebook's code cells, or a page's Python blocks (run
    or not: test_docs finds them)."""
    if path.suffix == ".py":
        return [path.read_text()]
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text())["cells"]
        return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    return [code for lang, _, code, _ in _blocks(path) if lang in ("python", "py", "python3")]


def private_uses(source: str) -> list[str]:
    """What ``source`` reaches of mmpack that is private: an import of a module with a ``_``
    component or of a ``_`` name, an attribute chain, or a string that is the name of a module
    of ``mmpack._src`` (what ``importlib`` would import; prose in docstrings is not a use)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:  # a block shown, not run (a sketch): its import lines still count
        paths = re.findall(r"(?:from|import)\s+(mmpack(?:\.\w+)+)", source)
        return sorted({p for p in paths if any(c.startswith("_") for c in p.split("."))})
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if re.match(r"mmpack(\.\w+)*\._", a.name)]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "mmpack":
            if re.match(r"mmpack(\.\w+)*\._", node.module or ""):
                found.append(node.module or "")
            found += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.Attribute) and ast.unparse(node).startswith("mmpack._"):
            found.append(ast.unparse(node))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if re.fullmatch(r"mmpack\._src(?:\.\w+)*(?::\w+)?", node.value):  # a module's name
                found.append(node.value)
    return sorted({f for f in found if not any(g.startswith(f"{f}.") for g in found)})


def test_outside_code_uses_only_the_public_modules():
    paths = [*PAGES, *sorted((ROOT / "notebooks").glob("*.ipynb"))]
    paths += sorted((ROOT / "benchmarks").glob("*.py"))
    offenders, internals = {}, set()
    for path in paths:
        uses = [u for block in _code_blocks(path) for u in private_uses(block)]
        if path.parent.name == "benchmarks" and path.name in BENCHMARK_INTERNALS:
            internals.add(path.name) if uses else None
        elif uses:
            offenders[str(path.relative_to(ROOT))] = sorted(set(uses))
    assert not offenders, f"private mmpack paths used outside the package: {offenders}"
    assert internals == set(BENCHMARK_INTERNALS), set(BENCHMARK_INTERNALS) - internals


def test_private_uses_sees_every_form():
    source = (
        "import mmpack._src.store.reader\n"
        "from mmpack._src.kernels import window\n"
        "from mmpack.torch import _KIND, loader\n"
        "x = mmpack._src.views\n"
        "m = importlib.import_module('mmpack._src.torch.collate')\n"
        "from mmpack.torch import collate\n"
    )
    assert private_uses("from mmpack._src.views import x\n>>> not python") == ["mmpack._src.views"]
    assert private_uses(source) == [
        "mmpack._src.kernels",
        "mmpack._src.store.reader",
        "mmpack._src.torch.collate",
        "mmpack._src.views",
        "mmpack.torch._KIND",
    ]


def test_the_api_reference_documents_the_public_modules_only():
    pages = sorted((ROOT / "docs" / "api").glob("*.md"))
    documented = [m for p in pages for m in re.findall(r"^::: ([\w.]+)", p.read_text(), re.M)]
    assert sorted(documented) == sorted(PUBLIC_MODULES)
