"""Documents for the streaming packer tests."""

from __future__ import annotations


def make_docs(lengths, base=1):
    return [list(range(base + 1000 * i, base + 1000 * i + n)) for i, n in enumerate(lengths)]
