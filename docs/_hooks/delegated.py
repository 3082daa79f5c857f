"""The docstrings of ``Delegated`` attributes in the API reference: a griffe extension
(``mkdocs.yml``).

``seqlen = Delegated("config", "int: tokens per row.")`` (:class:`mmpack._src.packing.options.Delegated`)
gives the attribute its docstring at run time (``__doc__``); griffe reads the source, where
the docstring is the call's second argument, so this extension sets it as the attribute's
docstring.  Cost: one look at each class attribute's assignment, at build.
"""

from __future__ import annotations

import ast
from typing import Any

import griffe


def delegated_doc(node: Any) -> str | None:
    """The ``doc`` string of an assignment ``name = Delegated(holder, doc)``, else None."""
    value = getattr(node, "value", None)
    if not (isinstance(value, ast.Call) and len(value.args) == 2):
        return None
    func, doc = value.func, value.args[1]
    named = getattr(func, "id", getattr(func, "attr", None)) == "Delegated"
    return (
        doc.value
        if named and isinstance(doc, ast.Constant) and isinstance(doc.value, str)
        else None
    )


class DelegatedDocs(griffe.Extension):
    """Give each ``Delegated`` attribute without a docstring its ``doc`` argument."""

    def on_attribute_instance(self, *, node: Any, attr: griffe.Attribute, **kwargs: Any) -> None:
        doc = delegated_doc(node)
        if doc is not None and attr.docstring is None:
            attr.docstring = griffe.Docstring(doc, parent=attr)
