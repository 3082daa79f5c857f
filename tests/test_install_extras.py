"""Installs that match the documentation: every top-level import of every Python example of
README.md and docs/**/*.md (```python, and ```py and the like, which tests/test_docs.py does not
run) is provided by mmpack's dependencies or a declared extra, and the
README's install section names every extra and leads with the install that works (from a
checkout: mmpack is on no package index).

An import's distribution comes from ``importlib.metadata.packages_distributions()`` (so the
package must be installed here, as the examples run in tests/test_docs.py); the standard library
and mmpack itself need nothing.

Run: ``pytest tests/test_install_extras.py``.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

import tomllib  # Python >= 3.11 (the test environment's)

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# Every fence of Python, those the docs test runs (python) and those it is told not to (py, ...):
# an example a reader copies needs its imports installable either way.
_FENCE = re.compile(
    r"^```(python|py|python3|ipython|pycon)(?![\w+-])[^\n]*\n(.*?)^```\s*$", re.M | re.S
)
_PROMPT = re.compile(r"^(?:>>>|\.\.\.) ?(.*)$", re.M)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _declared() -> dict[str, str]:
    """Distribution (canonical name) -> where it is declared (``dependencies`` or an extra)."""
    project = _project()
    out = {}
    groups = {"dependencies": project["dependencies"], **project["optional-dependencies"]}
    for group, requirements in groups.items():
        for requirement in requirements:
            name = _canonical(_NAME.match(requirement).group(0).split("[")[0])
            if name != "mmpack":  # an extra made of other extras
                out.setdefault(name, group)
    return out


def _imports() -> dict[str, set[str]]:
    """Top-level module -> the pages whose examples import it."""
    found: dict[str, set[str]] = {}
    for page in PAGES:
        for language, code in _FENCE.findall(page.read_text()):
            if language == "pycon":  # a session: the code is what follows the prompts
                code = "\n".join(_PROMPT.findall(code))
            for node in ast.walk(ast.parse(code)):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    found.setdefault(name.split(".")[0], set()).add(str(page.relative_to(ROOT)))
    return found


def test_the_examples_import_something_beyond_the_standard_library():
    imports = _imports()
    assert {"mmpack", "torch", "torchdata", "lightning", "transformers"} <= set(imports)


def test_blocks_the_docs_test_does_not_run_are_read_too():
    """A ```py block (shown, not run) imports what a reader installs as much as a ```python one."""
    page = "```py\nimport ray\n```\n```pycon\n>>> import dask\n```\n```pythonic\nimport x\n```\n"
    assert [lang for lang, _ in _FENCE.findall(page)] == ["py", "pycon"]


def test_every_import_of_the_examples_is_provided_by_a_declared_extra():
    declared = _declared()
    distributions = importlib.metadata.packages_distributions()
    missing = []
    for module, pages in sorted(_imports().items()):
        if module in sys.stdlib_module_names or module == "mmpack":
            continue
        names = {_canonical(d) for d in distributions.get(module, [])}
        if not names:
            missing.append(f"{module} (imported by {sorted(pages)}) is not installed here")
        elif not names & set(declared):
            missing.append(
                f"{module} (distribution {sorted(names)}, imported by {sorted(pages)}) is in no "
                "extra of pyproject.toml"
            )
    assert not missing, "\n".join(missing)


def test_the_torch_extra_brings_torchdata_and_all_holds_every_training_extra():
    extras = _project()["optional-dependencies"]
    assert {_canonical(_NAME.match(r).group(0)) for r in extras["torch"]} >= {"torch", "torchdata"}
    assert {"torch", "hf", "remote", "distributed", "ingest", "all"} <= set(extras)
    (everything,) = extras["all"]
    inside = set(re.fullmatch(r"mmpack\[(.*)\]", everything).group(1).split(","))
    assert inside == set(extras) - {"all", "notebooks"}


def test_the_readme_install_section_lists_every_extra_leads_with_a_checkout_and_pins_torch():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Install") :]
    section = section[: section.index("\n## ", 1)]
    for extra in _project()["optional-dependencies"]:
        assert f"`{extra}`" in section, f"the README's install section does not list {extra!r}"
    assert "torch==2.13.0" in section
    # mmpack is not on a package index: the install that works is from a checkout, and it leads
    installs = [line for line in section.splitlines() if line.startswith("pip install")]
    ours = [line for line in installs if "mmpack" in line or ".[" in line]
    assert ours and ours[0].startswith('pip install -e ".[torch]"'), ours
    assert not [line for line in ours if re.search(r"mmpack\[", line)], ours
    assert installs[0] == "pip install torch==2.13.0"  # the pinned torch comes first
