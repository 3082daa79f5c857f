"""The documentation pages (the README and every page under docs/) and the fenced blocks of a page."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]


def _blocks(page: Path) -> list[tuple[str, int, str, str]]:
    """``(language, first line of the code, code, marker)`` of every fenced block of ``page``;
    ``marker`` is the ``docs-test:`` comment just above the fence, or ``""``."""
    text = page.read_text()
    out = []
    for m in _FENCE.finditer(text):
        before = text[: m.start()]
        marker = _MARKER.search(before[-300:])
        line = before.count("\n") + 1  # the fence's line; the code starts on the next
        out.append((m.group(1), line + 1, m.group(2), marker.group(1) if marker else ""))
    return out


_FENCE = re.compile(r"^```([\w+-]*)[^\n]*\n(.*?)^```\s*$", re.M | re.S)


_MARKER = re.compile(r"<!--\s*docs-test:\s*(.*?)\s*-->\s*\n\s*$")
