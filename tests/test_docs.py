"""The documentation: every Python example runs, every page is reachable, the generated parts
are current.

- Every ```` ```python ```` block of ``README.md`` and ``docs/**/*.md`` runs: the blocks of one
  page in order, sharing one namespace, in a fresh folder (with ``MMPACK_CACHE_DIR`` inside it),
  and their asserts hold.  A block preceded by ``<!-- docs-test: needs NAME -->`` needs ``s3``
  (the real S3 server of ``tests/_s3.py``, started here, its endpoint and credentials in the
  ``AWS_*`` variables) or the importable module ``NAME`` (the page is skipped, saying so, only
  when that module is missing).  A block of Python under another fence name (```` ```py ````)
  must be preceded by ``<!-- docs-test: not run: REASON -->``: no example is left out silently.
- Every relative link of those pages resolves (the file, and the heading for a ``#anchor``), and
  every page under ``docs/`` is reachable from ``README.md`` through such links.
- ``docs/benchmarks.md`` holds the tables ``python -m benchmarks.docs_page`` renders from the
  committed results, and the README stays a front door (at most 250 lines).
"""

from __future__ import annotations

import importlib.util
import re
import unicodedata
from pathlib import Path

import pytest
from _pages import _FENCE, DOCS, PAGES, README, ROOT, _blocks

_LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)
_PYTHON_FENCES = {"py", "python3", "pycon", "ipython"}


def _rel(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _prose(page: Path) -> str:
    """``page`` without its fenced blocks and inline code (where links are not links)."""
    text = _FENCE.sub("", page.read_text())
    return re.sub(r"(`+).*?\1", "", text, flags=re.S)


def _slug(heading: str) -> str:
    """The anchor Python-Markdown's ``toc`` (what mkdocs uses) gives a heading."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(page: Path) -> set[str]:
    return {_slug(m.group(2)) for m in _HEADING.finditer(_FENCE.sub("", page.read_text()))}


def _links(page: Path) -> list[str]:
    return [
        target
        for target in _LINK.findall(_prose(page))
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target)  # http:, https:, mailto:
    ]


# ------------------------------------------------------------------------------- examples
_EXAMPLE_PAGES = [p for p in PAGES if any(lang == "python" for lang, *_ in _blocks(p))]


@pytest.mark.parametrize("page", _EXAMPLE_PAGES, ids=_rel)
def test_examples_run(page, tmp_path, monkeypatch, request):
    blocks = [
        (line, code, marker) for lang, line, code, marker in _blocks(page) if lang == "python"
    ]
    needs = {
        name.strip()
        for *_, marker in blocks
        if marker.startswith("needs ")
        for name in marker[len("needs ") :].split(",")
    }
    for name in sorted(needs - {"s3"}):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{_rel(page)} has an example that needs {name}, which is not installed")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MMPACK_CACHE_DIR", str(tmp_path / "mmpack-cache"))
    if "s3" in needs:
        from _s3 import isolate_cache_and_env, use_server_env

        isolate_cache_and_env(tmp_path, monkeypatch)
        use_server_env(monkeypatch, request.getfixturevalue("s3_server"))
    namespace: dict = {"__name__": "__docs__"}
    for line, code, _ in blocks:
        # Padded so that a traceback names the page's own line numbers.
        exec(compile("\n" * (line - 1) + code, str(page), "exec"), namespace)


def test_every_python_example_runs_or_says_why_not():
    for page in PAGES:
        for lang, line, _, marker in _blocks(page):
            if lang in _PYTHON_FENCES:
                assert marker.startswith("not run: "), (
                    f"{_rel(page)}:{line}: a ```{lang} block is not run by the tests; make it "
                    "```python, or say why above it: <!-- docs-test: not run: REASON -->"
                )
            if marker:
                assert lang in _PYTHON_FENCES | {"python"}, f"{_rel(page)}:{line}: {marker!r}"
                assert re.fullmatch(r"needs [\w, ]+|not run: .+", marker), (
                    f"{_rel(page)}:{line}: unknown docs-test marker {marker!r}"
                )


def test_readme_is_a_front_door():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail to docs/"
    assert sum(lang == "python" for lang, *_ in _blocks(README)) >= 4


# ---------------------------------------------------------------------------------- links
def test_relative_links_resolve():
    broken = []
    for page in PAGES:
        for target in _links(page):
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{_rel(page)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{_rel(page)}: {target} (no heading #{anchor})")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_every_docs_page_is_reachable_from_the_readme():
    seen, todo = {README}, [README]
    while todo:
        page = todo.pop()
        for target in _links(page):
            path = target.partition("#")[0]
            dest = (page.parent / path).resolve()
            if path.endswith(".md") and dest.is_file() and dest not in seen:
                seen.add(dest)
                todo.append(dest)
    unreached = sorted(_rel(p) for p in DOCS.rglob("*.md") if p.resolve() not in seen)
    assert not unreached, f"pages no link from README.md leads to: {unreached}"


# ------------------------------------------------------------------------- generated parts
def test_benchmarks_page_matches_the_committed_results():
    from benchmarks.docs_page import DOC, expected_page

    assert DOC.read_text() == expected_page(), (
        "docs/benchmarks.md is stale: run python -m benchmarks.docs_page"
    )
