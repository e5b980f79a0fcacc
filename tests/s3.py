"""A local S3 server and a fault proxy in front of it, for tests and benchmarks.

``Server`` runs moto's S3 server (``python -m moto.server``, the ``[test]``
extra) as a child process on a free port of 127.0.0.1; ``start_error()``
says why it cannot start (moto not installed), and only then do the S3
tests skip.  ``Proxy`` is a TCP proxy of our own between a store and the
server: it counts the requests and bytes that cross it, and makes the
network faults of the tests (``cut``: connections refused and open ones
reset; ``hang``: accepted and never answered; ``delay``: every answer
late by that many seconds; ``drop_after``: a request cut after that many
bytes of its upload).

The store under test gets ``proxy.url`` as its ``endpoint_url`` and any
credentials (moto accepts all): ``ENV`` holds them for child processes.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

from .pg import free_port

__all__ = [
    "ENV",
    "Place",
    "Proxy",
    "Server",
    "make_s3_store",
    "new_bucket",
    "serve_for_children",
    "shared_server",
    "start_error",
    "unconditional",
]

ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_MAX_ATTEMPTS": "2",  # a fault shows within a couple of attempts
}
"""What a process needs to reach the local server (moto accepts any credentials)."""


def start_error() -> str | None:
    """Why the server cannot start here, or None."""
    try:
        import botocore  # noqa: F401
        import moto.server  # noqa: F401
    except ImportError as exc:
        return f"moto's S3 server is not installed ({exc}); pip install 'moto[server]' ([test])"
    return None


class Server:
    """moto's S3 server as a child process on 127.0.0.1: ``start()``, ``stop()``, ``url``."""

    def __init__(self, *, checks_credentials: bool = False) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.env = {**os.environ, **ENV}
        if checks_credentials:  # moto then checks every request against its IAM users
            self.env["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"

    def start(self) -> None:
        args = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        self.proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=self.env
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port)):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"moto's S3 server did not start on port {self.port}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def client(self) -> Any:
        """A botocore client of the server itself (no proxy), for setting up and checking."""
        import botocore.config
        import botocore.session

        session = botocore.session.get_session()
        return session.create_client(
            "s3",
            endpoint_url=self.url,
            region_name=ENV["AWS_DEFAULT_REGION"],
            aws_access_key_id=ENV["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=ENV["AWS_SECRET_ACCESS_KEY"],
            config=botocore.config.Config(s3={"addressing_style": "path"}),
        )


def new_bucket(server: Server) -> str:
    """A new empty bucket on ``server``."""
    name = "t-" + uuid.uuid4().hex[:20]
    server.client().create_bucket(Bucket=name)
    return name


class Proxy:
    """A TCP proxy to ``port`` on 127.0.0.1 that counts traffic and makes faults.

    ``requests`` and ``sent`` count the HTTP requests and their bytes
    (headers and bodies) from the store, ``received`` the bytes back.
    """

    def __init__(self, port: int) -> None:
        self.target = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.mode = "pass"  # "pass", "cut", "hang"
        self.drop_after: int | None = None  # cut after forwarding this many more bytes up
        self.delay = 0.0  # seconds each answer waits before it is passed on (slow)
        self.requests = 0
        self.sent = 0
        self.received = 0
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="s3-proxy").start()

    def reset_counts(self) -> None:
        with self._lock:
            self.requests = self.sent = self.received = 0

    def counts(self) -> tuple[int, int, int]:
        with self._lock:
            return self.requests, self.sent, self.received

    def cut(self) -> None:
        """Refuse new connections and reset the open ones (the endpoint is gone)."""
        self.mode = "cut"
        self._reset_all()

    def hang(self) -> None:
        """Accept connections and never answer (a silent endpoint)."""
        self.mode = "hang"
        self._reset_all()

    def heal(self) -> None:
        self.mode = "pass"

    def close(self) -> None:
        self._closed = True
        self.listener.close()
        self._reset_all()

    def _reset_all(self) -> None:
        with self._lock:
            socks, self._open = list(self._open), set()
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
                sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.mode == "cut":
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
                client.close()
                continue
            with self._lock:
                self._open.add(client)
            if self.mode == "hang":
                continue  # held open, never read
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open.add(upstream)
            threading.Thread(target=self._up, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._down, args=(upstream, client), daemon=True).start()

    def _up(self, client: socket.socket, upstream: socket.socket) -> None:
        """Store -> server: count requests (each starts with its request line) and bytes."""
        parser = _Requests()
        try:
            while data := client.recv(65536):
                drop = self.drop_after
                if drop is not None:
                    if len(data) > drop:  # forward the first bytes, then cut
                        self.drop_after = None
                        upstream.sendall(data[:drop])
                        raise OSError("dropped mid-upload")
                    self.drop_after = drop - len(data)
                started = parser.feed(data)
                with self._lock:
                    self.requests += started
                    self.sent += len(data)
                upstream.sendall(data)
        except OSError:
            pass
        finally:
            _close(client, upstream)

    def _down(self, upstream: socket.socket, client: socket.socket) -> None:
        try:
            while data := upstream.recv(65536):
                with self._lock:
                    self.received += len(data)
                if self.delay:
                    time.sleep(self.delay)
                client.sendall(data)
        except OSError:
            pass
        finally:
            _close(client, upstream)


_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a reset


def _close(*socks: socket.socket) -> None:
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            sock.close()


class _Requests:
    """Finds where HTTP/1.1 requests start in a byte stream (Content-Length framing)."""

    def __init__(self) -> None:
        self.head = b""
        self.left = 0  # body bytes still to come

    def feed(self, data: bytes) -> int:
        started = 0
        while data:
            if self.left:
                n = min(self.left, len(data))
                self.left -= n
                data = data[n:]
                continue
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return started
            started += 1
            head, data = self.head[: end + 4], self.head[end + 4 :]
            self.head = b""
            self.left = _content_length(head)
        return started


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return 0


_SHARED: list[Server] = []


def shared_server() -> Server:
    """This test process's server, started on first use (skips, saying why, if it cannot)."""
    import atexit

    import pytest

    why = start_error()
    if why is not None:
        pytest.skip(why)
    os.environ.update(ENV)  # this test process reaches the server as its children do
    if not _SHARED:
        server = Server()
        server.start()
        atexit.register(server.stop)
        _SHARED.append(server)
    return _SHARED[0]


class Place:
    """A bucket on the shared server, behind a proxy of its own; stores made on it."""

    def __init__(self) -> None:
        self.server = shared_server()
        self.bucket = new_bucket(self.server)
        self.proxy = Proxy(self.server.port)
        self.env = {**os.environ, **ENV}

    def store(self, kind: str = "s3", **options: Any) -> Any:
        from checkpointer import S3JournalStore, S3Store

        cls = S3JournalStore if kind == "s3journal" else S3Store
        options.setdefault("connect_timeout", 2.0)
        options.setdefault("read_timeout", 5.0)
        return cls(self.bucket, "agents", endpoint_url=self.proxy.url, **options)

    def spec(self, kind: str) -> str:
        """The store spec of the tests' child programs: ``s3:BUCKET@URL``."""
        return f"{kind}:{self.bucket}@{self.proxy.url}"

    def close(self) -> None:
        self.proxy.close()


def make_s3_store(spec: str, prefix: str = "agents") -> Any:
    """The store a child's spec names: ``s3:BUCKET@URL`` or ``s3journal:BUCKET@URL``.

    ``BUCKET/PREFIX@URL`` names the prefix (else ``prefix``).

    With ``CHECKPOINTER_S3_MUTANT=unconditional`` in the environment, a store
    whose PUTs carry no condition: the tests of fencing must fail with it.
    With ``CHECKPOINTER_KEYS``, an encrypted one.
    """
    from checkpointer import S3JournalStore, S3Store
    from checkpointer.stores import Encryption

    kind, _, where = spec.partition(":")
    bucket, _, url = where.partition("@")
    bucket, _, named = bucket.partition("/")  # s3:BUCKET/PREFIX@URL names the prefix
    prefix = named or prefix
    cls = S3JournalStore if kind == "s3journal" else S3Store
    keys = os.environ.get("CHECKPOINTER_KEYS")
    encryption = None if keys is None else Encryption.from_text(keys)
    options: dict[str, Any] = {"connect_timeout": 2.0, "read_timeout": 5.0}
    store = cls(bucket, prefix, endpoint_url=url, encryption=encryption, **options)
    if os.environ.get("CHECKPOINTER_S3_MUTANT") == "unconditional":
        unconditional(store)
    return store


PLACE_ENV = "CHECKPOINTER_TEST_S3"
"""For the long runs' children: ``BUCKET@URL`` of the server their parent started."""


def serve_for_children() -> str:
    """Start a server and a bucket for this process's children (once); ``BUCKET@URL``."""
    import atexit

    if PLACE_ENV not in os.environ:
        server = Server()
        server.start()
        atexit.register(server.stop)
        os.environ.update(ENV)
        os.environ[PLACE_ENV] = f"{new_bucket(server)}@{server.url}"
    return os.environ[PLACE_ENV]


def unconditional(store: Any) -> None:
    """Make ``store`` PUT without If-Match / If-None-Match (a mutant, to show tests fail)."""
    call = store.s3.call

    def plain(operation: str, **params: Any) -> Any:
        params.pop("IfMatch", None)
        params.pop("IfNoneMatch", None)
        return call(operation, **params)

    store.s3.call = plain
