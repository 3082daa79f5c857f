"""The obstore transport (``gs://``, ``az://``, and ``s3://`` with ``client="obstore"``).

obstore's async runtime does not survive ``fork``: a forked child of a process that used it hung
on its first request (obstore 0.12.1), even with a new store.  So the store is created lazily per
process, and a forked child of a process that used obstore gets a clear ``RuntimeError``
("use multiprocessing_context='spawn'") instead of a hang.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mmpack._src.core.process import PerProcess
from mmpack._src.remote.protocol import (
    OPTION_DEFAULTS,
    ObjectMissing,
    Transport,
    _Transient,
    require_client,
)
from mmpack.errors import RemoteAccessError

__all__ = ["ObstoreTransport"]

_OBSTORE_USED_BY: set[int] = set()
"""Pids of processes that started obstore's runtime; a forked child inherits the set but not
the runtime, so a pid missing from a non-empty set means "forked after obstore was used"."""


class ObstoreTransport(Transport):
    """gs://, az://, and s3:// on request, via ``obstore.store.from_url``."""

    def __init__(self, url: str, options: dict[str, Any]) -> None:
        super().__init__(url, options)
        require_client("obstore", url)
        self._store_options = {
            k: v
            for k, v in options.items()
            if k not in OPTION_DEFAULTS
            and k not in ("client", "multipart_threshold", "multipart_chunk")
        }
        self._store = PerProcess(self._make_store)

    def _obj(self) -> Any:
        return self._store.get()

    def _make_store(self) -> Any:
        """This process's obstore store."""
        pid = os.getpid()
        if _OBSTORE_USED_BY and pid not in _OBSTORE_USED_BY:
            raise RuntimeError(
                f"{self.url}: this process was forked from one that used obstore, whose "
                "runtime does not survive fork; use multiprocessing_context='spawn' (or an "
                "s3:// store with the default client, which is fork-safe)"
            )
        import obstore.store

        opts = dict(self._store_options)
        if opts.pop("allow_http", None) in (True, "true", "1"):
            opts.setdefault("client_options", {})["allow_http"] = True
        for alias, name in (
            ("endpoint_url", "endpoint"),
            ("key", "access_key_id"),
            ("secret", "secret_access_key"),
        ):
            if alias in opts:
                opts[name] = opts.pop(alias)
        client_options = opts.pop("client_options", None)
        store = obstore.store.from_url(self.url, client_options=client_options, **opts)
        _OBSTORE_USED_BY.add(pid)
        return store

    def _wrap(self, key: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except FileNotFoundError:
            raise ObjectMissing(self.key_url(key), "NoSuchKey") from None
        except PermissionError as exc:
            raise RemoteAccessError(f"{self.key_url(key)}: access refused ({exc})") from None
        except (RuntimeError, ValueError, TypeError):
            raise
        except Exception as exc:
            raise _Transient(f"{type(exc).__name__}: {exc}") from None

    def _get(self, key: str, rng: tuple[int, int] | None) -> bytes:
        import obstore

        if rng is None:
            return self._wrap(key, lambda: bytes(obstore.get(self._obj(), key).bytes()))
        return self._wrap(
            key, lambda: bytes(obstore.get_range(self._obj(), key, start=rng[0], end=rng[1]))
        )

    def _get_many(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        import obstore

        starts = [r[0] for r in ranges]
        ends = [r[1] for r in ranges]
        got = self._retry(
            key,
            lambda: self._wrap(
                key, lambda: obstore.get_ranges(self._obj(), key, starts=starts, ends=ends)
            ),
        )
        return [bytes(b) for b in got]

    def _size(self, key: str) -> int:
        import obstore

        return int(self._wrap(key, lambda: obstore.head(self._obj(), key))["size"])

    def _put(self, key: str, data: bytes | None, path: Path | None) -> None:
        import obstore

        payload: Path | bytes = path if path is not None else (data or b"")
        self._wrap(key, lambda: obstore.put(self._obj(), key, payload))

    def _list(self, prefix: str) -> list[tuple[str, int, float]]:
        import obstore

        out = []
        for chunk in self._wrap(prefix, lambda: list(obstore.list(self._obj(), prefix or None))):
            for m in chunk:
                out.append((m["path"], int(m["size"]), m["last_modified"].timestamp()))
        return out

    def _delete(self, key: str) -> None:
        import obstore

        self._wrap(key, lambda: obstore.delete(self._obj(), key))
