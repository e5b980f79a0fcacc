"""The connection of the PostgreSQL store: one per store, every call bounded.

* **One connection per store**, opened lazily (or by ``open()``), in
  autocommit mode.  It holds this store's locks and carries its writes.
* **Bounded calls.**  ``connect_timeout`` bounds connecting; the session's
  ``statement_timeout`` and ``lock_timeout`` bound the server's work; a
  watchdog thread shuts the socket down when a call outlives
  ``statement_timeout`` by a second (a server that stopped answering, or a
  network that dropped without a reset), and TCP keepalives and
  ``tcp_user_timeout`` catch a vanished host.  So ``flush_sync`` in a signal
  handler never hangs on a dead server.  A write's deadline (and its
  ``statement_timeout``) grows with what it sends, so a large session is not
  taken for a hang.  A broken connection is dropped and the next call
  reconnects (and takes its locks again); one found broken when a call
  starts (lost while idle) is replaced and the call made again at once.  A
  backend of ours that a cut-off call left running, still holding a key, is
  ended when the key is taken again.
* **After an outage**, ``probe()`` tells a writer in backoff that the server
  answers again (``ProbingStore``).

``ConnectionPart`` is the part of ``PostgresStore`` that keeps the
connection (``store.py`` says how the parts fit); ``Watchdog`` cuts off a
call that outlives its deadline.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar, final

from ... import _exit
from ..._text import one_line
from .errors import IdleLoss, PostgresStoreError
from .schema import SchemaPart, grants_sql

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "SLOW_BYTES_PER_SECOND",
    "ConnectionPart",
    "Watchdog",
    "describe_dsn",
    "import_psycopg",
    "seconds",
]

_T = TypeVar("_T")

_INSTALL_HINT = (
    "PostgresStore needs psycopg 3: pip install 'psycopg[binary]>=3.1' "
    "(the postgres extra: pip install -e '.[postgres]' in a clone of agent-checkpointer)"
)

SLOW_BYTES_PER_SECOND = 8 << 20
"""What a write may take longer than a small one: a second per 8 MiB it sends.

Measured: 200 MB sent and stored in 1.8 s (binary, lz4) to 12.7 s (text,
pglz) on one machine; so a large session that is merely large is not cut
off as a hang, while a server that stopped answering still is.
"""


def import_psycopg() -> Any:
    try:
        import psycopg
    except ImportError as exc:
        raise ImportError(f"{_INSTALL_HINT} ({exc})") from exc
    return psycopg


def seconds(name: str, value: float) -> float:
    if not (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and value > 0
        and math.isfinite(value)
    ):
        raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


def describe_dsn(params: dict[str, Any]) -> str:
    """``postgresql://user@host:port/dbname`` for messages: never the password."""
    env = os.environ
    user = params.get("user") or env.get("PGUSER") or ""
    host = params.get("host") or params.get("hostaddr") or env.get("PGHOST") or "localhost"
    port = params.get("port") or env.get("PGPORT") or "5432"
    dbname = params.get("dbname") or env.get("PGDATABASE") or user
    if str(host).startswith("/"):
        host = f"[{host}]"
    return f"postgresql://{user}{'@' if user else ''}{host}:{port}/{dbname}"


@final
class Watchdog:
    """Shuts a connection's socket down when a call on it outlives its deadline.

    A psycopg call blocked on a server that stopped answering then fails at
    once ("server closed the connection"), whichever thread waits.  One
    daemon thread per store, started on first use.  It works on a duplicate
    of the socket's descriptor, taken when the watch starts, so it can never
    hit a descriptor number the process reused meanwhile.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._cond = threading.Condition(threading.Lock())
        self._deadline: float | None = None
        self._fd = -1
        self._stop: threading.Event | None = None  # set: that thread exits
        self.fired = False

    @contextlib.contextmanager
    def watch(self, fd: int, seconds: float) -> Iterator[None]:
        dup = os.dup(fd)
        with self._cond:
            self.fired = False
            self._deadline = time.monotonic() + seconds
            self._fd = dup
            if self._stop is None:
                self._stop = threading.Event()
                threading.Thread(
                    target=self._run, args=(self._stop,), name=self._name, daemon=True
                ).start()
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._deadline = None
                self._fd = -1
            os.close(dup)

    def close(self, *, wait: float = 1.0) -> None:
        """Let the thread exit (a later ``watch`` starts another); never blocks long.

        Called under the store's mutex, as ``watch`` is.  The condition's
        lock is only tried, for at most ``wait`` seconds: at interpreter
        exit the daemon thread is frozen wherever it was, possibly holding
        it, and a blocking wait there hung the process forever.  If it
        cannot be taken, the thread holds it and sees ``stop`` before it
        waits again.
        """
        stop, self._stop = self._stop, None
        if stop is None:
            return
        stop.set()
        if self._cond.acquire(timeout=wait):
            try:
                self._cond.notify_all()
            finally:
                self._cond.release()

    def _run(self, stop: threading.Event) -> None:
        with self._cond:
            while not stop.is_set():
                if self._deadline is None:
                    self._cond.wait()
                    continue
                remaining = self._deadline - time.monotonic()
                if remaining > 0:
                    self._cond.wait(remaining)
                    continue
                self._deadline = None
                self.fired = True
                with contextlib.suppress(OSError):
                    sock = socket.socket(fileno=os.dup(self._fd))
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    finally:
                        sock.close()


class ConnectionPart(SchemaPart):
    """The part of ``PostgresStore`` that keeps its one connection and bounds every call.

    Every call runs in ``_session`` (or ``_run``): under the store's mutex,
    watched by the ``Watchdog``, its psycopg errors turned into
    ``PostgresStoreError`` (``_failure``).  A broken connection is dropped,
    and with it the locks it held (``_held``).
    """

    _dsn: str
    connect_timeout: float
    statement_timeout: float
    lock_timeout: float
    _application_name: str
    _mutex: threading.Lock
    _conn: psycopg.Connection[Any] | None
    _held: set[str]  # the keys whose lock the connection holds
    _suspect: bool  # the connection may hold a lock we do not know of
    _lost: bool  # the last call lost the server (for probe())
    _backend: int | None  # the backend pid of _conn
    _orphans: list[int]  # backends of connections dropped mid-call
    _watchdog: Watchdog
    _deadline: float  # a call gets no answer a second after the server gave up
    _watching: float  # the deadline of the call in progress
    _busy_wait: float
    _pid: int  # the process whose connection _conn is

    def location(self, key: str) -> str:
        return f"{self._where}/{self.schema}/{key}"

    def probe(self) -> bool:
        """Whether the server answers again after this store lost it (``ProbingStore``).

        For a writer waiting out a retry backoff: True means retry now.
        False, without a round trip, when the store did not lose the server
        (its last failure was of another kind: the backoff stands) or a call
        is in progress; otherwise it connects (bounded by
        ``connect_timeout``) and keeps the connection for the retry.  Never
        raises.
        """
        if not self._lost:
            return False
        with _exit.busy():
            if not self._mutex.acquire(blocking=False):
                return False
            try:
                self._connection()
            except Exception:
                return False
            finally:
                self._mutex.release()
        self._lost = False
        return True

    def _run(self, call: Callable[[psycopg.Connection[Any]], _T], *, ensure: bool = True) -> _T:
        """``call(conn)`` in a session; once more on a new connection after an idle loss.

        For calls that are safe to repeat (reads, idempotent statements).
        """
        try:
            with self._session(ensure=ensure) as conn:
                return call(conn)
        except IdleLoss:
            with self._session(ensure=ensure) as conn:
                return call(conn)

    @contextlib.contextmanager
    def _session(
        self, *, ensure: bool = True, budget: float = 0.0
    ) -> Iterator[psycopg.Connection[Any]]:
        """The live connection, under the store's mutex and the watchdog.

        ``budget``: seconds the call may take on top of the usual deadline
        (a large write).  psycopg errors become ``PostgresStoreError``; a
        broken connection is dropped (with it every lock) and the next call
        reconnects.  A connection kept from an earlier call and found broken
        (lost while idle: a server restart, a failover, a pooler's idle
        timeout) fails as ``IdleLoss``, which callers may retry at once.
        A signal that lands on this thread meanwhile is handled once the
        mutex is free again (``_exit.busy``): its flush needs the mutex.
        """
        with _exit.busy():
            if not self._mutex.acquire(timeout=self._busy_wait):
                raise PostgresStoreError(
                    f"{self._where}: the store's connection stayed busy for "
                    f"{self._busy_wait:g}s (a call in another thread is stuck); try again later"
                )
            try:
                reused = self._conn is not None and not self._conn.closed
                conn = self._connection()
                failure: PostgresStoreError | None = None
                try:
                    self._watching = self._deadline + budget
                    with self._watchdog.watch(conn.fileno(), self._watching):
                        if ensure and not self._schema_ok:
                            self._ensure_schema(conn)
                        yield conn
                except self._pg.Error as exc:
                    failure = self._failure(conn, exc, reused=reused)
                if failure is not None:
                    self._lost = conn.closed or conn.broken or self._watchdog.fired
                    if self._lost or self._suspect:
                        self._drop(orphan=True)
                    raise failure
                self._lost = False
            finally:
                self._mutex.release()

    def _connection(self) -> psycopg.Connection[Any]:
        current = self._conn
        if current is not None and not current.closed:
            return current
        self._drop()
        pg = self._pg
        try:
            conn: psycopg.Connection[Any] = pg.connect(
                self._dsn,
                autocommit=True,
                connect_timeout=max(2, math.ceil(self.connect_timeout)),
                application_name=self._application_name,
                keepalives=1,
                keepalives_idle=max(1, round(self.statement_timeout)),
                keepalives_interval=1,
                keepalives_count=3,
                tcp_user_timeout=round(self._deadline * 1000),
            )
        except pg.Error as exc:
            why = self._connect_failure(exc)
            # Not reached (down, restarting, unreachable), not refused (a login
            # or database that is wrong stays wrong): a probe may try again.
            self._lost = not any(w in why for w in ("password", "does not exist"))
            raise PostgresStoreError(why) from None
        try:
            with self._watchdog.watch(conn.fileno(), self._deadline):
                conn.execute(
                    b"SET statement_timeout = %d; SET lock_timeout = %d; "
                    b"SET idle_in_transaction_session_timeout = %d; "
                    # The server ends the session of a vanished host (and frees
                    # its locks) about statement_timeout + 6 s after it went.
                    b"SET tcp_keepalives_idle = %d; SET tcp_keepalives_interval = 2; "
                    b"SET tcp_keepalives_count = 3"
                    % (
                        round(self.statement_timeout * 1000),
                        round(self.lock_timeout * 1000),
                        round(self._deadline * 1000),
                        max(1, round(self.statement_timeout)),
                    )
                )
        except pg.Error as exc:
            conn.close()
            raise PostgresStoreError(
                f"{self._where}: connected, but setting the session up failed: {one_line(str(exc))}"
            ) from None
        info = conn.info
        self._where = describe_dsn(
            {"host": info.host, "port": info.port, "dbname": info.dbname, "user": info.user}
        )
        self._conn = conn
        self._backend = info.backend_pid
        return conn

    def _drop(self, *, orphan: bool = False) -> None:
        """Forget the connection (closing it) and the locks it held.

        ``orphan``: dropped mid-call; its backend may still be running our
        statement (the server notices the closed socket only when it next
        reads or writes it), holding the key's lock a moment longer.
        """
        conn, self._conn = self._conn, None
        if orphan and conn is not None and self._backend is not None:
            self._orphans = [*self._orphans[-7:], self._backend]
        self._held.clear()
        self._suspect = False
        if conn is not None and self._pid == os.getpid():
            with contextlib.suppress(Exception):
                conn.close()

    def _failure(
        self, conn: psycopg.Connection[Any], exc: Exception, *, reused: bool = False
    ) -> PostgresStoreError:
        pg = self._pg
        text = one_line(str(exc)) or type(exc).__name__
        if self._watchdog.fired:
            return PostgresStoreError(
                f"{self._where}: no answer within {self._watching:.3g}s "
                f"(statement_timeout={self.statement_timeout:g}s); dropped the connection, "
                "the next call reconnects"
            )
        if conn.closed or conn.broken:
            lost = IdleLoss if reused else PostgresStoreError
            return lost(f"{self._where}: lost the connection ({text}); the next call reconnects")
        if isinstance(exc, pg.errors.QueryCanceled):
            return PostgresStoreError(
                f"{self._where}: a statement ran longer than statement_timeout="
                f"{self.statement_timeout:g}s ({text})"
            )
        if isinstance(exc, pg.errors.LockNotAvailable):
            return PostgresStoreError(
                f"{self._where}: waited longer than lock_timeout={self.lock_timeout:g}s ({text})"
            )
        if isinstance(exc, pg.errors.InsufficientPrivilege):
            return PostgresStoreError(
                f"{self._where}: permission denied ({text}); the tables need "
                f"`checkpointer pg-schema` once (an administrator), then for this user: "
                f"{grants_sql(self.schema, conn.info.user or 'this_user')}"
            )
        return PostgresStoreError(f"{self._where}: {text}")

    def _connect_failure(self, exc: Exception) -> str:
        text = one_line(str(exc))
        low = text.lower()
        if "password authentication failed" in low or "no password supplied" in low:
            hint = "check the user and password (in the DSN, PGPASSWORD or ~/.pgpass)"
        elif "does not exist" in low and "database" in low:
            hint = "create the database (createdb) or fix dbname in the DSN"
        elif "does not exist" in low and "role" in low:
            hint = "create the role or fix user in the DSN"
        elif any(w in low for w in ("shutting down", "starting up", "recovery mode")):
            hint = "the server is restarting (or failing over); the next try reconnects"
        elif "refused" in low:
            hint = "start the server, or fix host and port in the DSN"  # libpq asks if it runs
        elif "timeout" in low or "timed out" in low:
            hint = f"no answer within connect_timeout={self.connect_timeout:g}s"
        elif "resolve" in low or "name or service not known" in low:
            hint = "check host in the DSN"
        else:
            hint = "check the DSN"
        return f"cannot connect to PostgreSQL at {self._where}: {text}; {hint}"
