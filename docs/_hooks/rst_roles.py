"""The docstrings' Sphinx roles as links in the API reference: a griffe extension (``mkdocs.yml``).

The docstrings are NumPy style with Sphinx cross-reference roles (``:class:`~mmpack.x.Y```,
``:func:``, ``:meth:``, ``:mod:``, ``:attr:``, ``:data:``, ``:exc:``, ``:obj:``, optionally with a
title: ``:func:`title <mmpack.x.f>```).  mkdocstrings renders Markdown, where a role would be
text; each becomes an optional mkdocs-autorefs reference instead: a link when its target is in
the reference, the name in code otherwise (never a warning).  ``~`` keeps the last component of
the name, as in Sphinx; a name that does not start with ``mmpack`` is looked up in the module of
the object whose docstring holds it.  Cost: one regular-expression pass per docstring, at build.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

ROLE = re.compile(
    r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj):`(?P<tilde>~?)"
    r"(?:(?P<title>[^`<]+?)\s*<(?P<target>[^`>]+)>|(?P<name>[^`]+))`"
)


def _reference(match: re.Match[str], module: str) -> str:
    target = (match["target"] or match["name"]).strip().lstrip(".")
    title = match["title"] or (target.rsplit(".", 1)[-1] if match["tilde"] else target)
    if not target.startswith("mmpack"):
        target = f"{module}.{target}"
    return (
        f'<autoref identifier="{html.escape(target)}" optional>'
        f"<code>{html.escape(title)}</code></autoref>"
    )


class RstRoles(griffe.Extension):
    """Rewrite every role of every docstring once the object tree is built."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            module = obj.module.path
            obj.docstring.value = ROLE.sub(lambda m: _reference(m, module), obj.docstring.value)
