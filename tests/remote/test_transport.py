"""The transports of :mod:`mmpack._src.remote.transport` without a server: a URL whose client is not
installed names the extra that brings it.

Run: ``PYTHONPATH=$PWD:$PWD/tests python -m pytest -q tests/remote/test_transport.py``.
"""

from __future__ import annotations

import sys

import pytest

import mmpack
from mmpack.errors import MissingDependencyError


@pytest.mark.parametrize(
    "url, module",
    [
        ("s3://bucket/corpus", "urllib3"),
        ("https://example.invalid/corpus", "urllib3"),
        ("gs://bucket/corpus", "obstore"),
        ("s3://bucket/corpus?obstore", "obstore"),
    ],
)
def test_a_url_without_the_remote_extra_names_it(monkeypatch, tmp_path, url, module):
    """``mmpack.open`` and ``mmpack.build`` of a URL whose client is missing raise one
    ``MissingDependencyError`` (an ``ImportError``) naming the module and the extra, before
    any request: ``pip install -e ".[remote]"``."""
    monkeypatch.setitem(sys.modules, module, None)  # "not installed"
    monkeypatch.setitem(sys.modules, f"{module}.store", None)
    options = {"client": "obstore"} if url.endswith("?obstore") else None
    url = url.removesuffix("?obstore")
    want = rf"{url}.*needs {module}, which is not installed.*pip install -e \"\.\[remote\]\""
    with pytest.raises(MissingDependencyError, match=want) as exc:
        mmpack.open(url, storage_options=options, cache_dir=tmp_path)
    assert isinstance(exc.value, ImportError) and exc.value.extra == "remote"
    with pytest.raises(MissingDependencyError, match=want):
        mmpack.build(url, [[1, 2, 3]], storage_options=options)
