"""The connection of the PostgreSQL store: one per store, every call bounded.

Timeouts bound the server's work, TCP keepalives a vanished host, and a watchdog
thread shuts the socket down when a call outlives ``statement_timeout`` by a second,
so a flush in a signal handler never hangs.  A forked child forgets its parent's.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar, final

from ... import _exit
from ..._text import one_line
from .errors import IdleLoss, PostgresStoreError
from .schema import QUERIES, SchemaPart, grants_sql, quote_schema

if TYPE_CHECKING:
    import psycopg

    from ..sealing import Encryption

__all__ = ["SLOW_BYTES_PER_SECOND", "ConnectionPart"]

_T = TypeVar("_T")

# A write gets a second more per 8 MiB it sends (200 MB took 1.8 s to 12.7 s here).
SLOW_BYTES_PER_SECOND = 8 << 20


def seconds(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
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
    """Shuts a connection's socket down when a call on it outlives its deadline (one daemon
    thread per store, on a duplicate of the descriptor: never a number reused meanwhile)."""

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
        """Let the thread exit, waiting ``wait`` s at most for the condition's lock (at
        interpreter exit the daemon thread is frozen wherever it was, maybe holding it)."""
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
                with contextlib.suppress(OSError), socket.socket(fileno=os.dup(self._fd)) as sock:
                    sock.shutdown(socket.SHUT_RDWR)


class ConnectionPart(SchemaPart):
    """The part of ``PostgresStore`` that keeps its one connection and bounds every call
    (in ``_session``: under the store's mutex, watched, errors as ``PostgresStoreError``)."""

    def __init__(
        self,
        dsn: str = "",
        *,
        schema: str = "checkpointer",
        create_schema: bool = True,
        connect_timeout: float = 5.0,
        statement_timeout: float = 10.0,
        lock_timeout: float = 2.0,
        application_name: str = "checkpointer",
        encryption: Encryption | None = None,
    ) -> None:
        self.encryption = encryption
        try:
            import psycopg
        except ImportError as exc:
            raise ImportError(
                "PostgresStore needs psycopg 3: pip install 'psycopg[binary]>=3.1' (the postgres "
                f"extra: pip install -e '.[postgres]' in a clone of agent-checkpointer) ({exc})"
            ) from exc
        self._pg = psycopg
        if not isinstance(dsn, str):
            raise TypeError(f"dsn must be a str (a libpq connection string), got {dsn!r:.80}")
        try:
            params = self._pg.conninfo.conninfo_to_dict(dsn)
        except self._pg.Error as exc:
            raise ValueError(f"invalid PostgreSQL DSN: {one_line(str(exc))}") from None
        self._dsn = dsn
        self.schema = schema
        self._quoted = quote_schema(schema)
        self._create = bool(create_schema)
        self.connect_timeout = seconds("connect_timeout", connect_timeout)
        self.statement_timeout = seconds("statement_timeout", statement_timeout)
        self.lock_timeout = seconds("lock_timeout", lock_timeout)
        self._application_name = str(application_name)
        self._where = describe_dsn(params)
        self._sql = {name: q.format(s=self._quoted).encode() for name, q in QUERIES.items()}
        self._schema_ok = False
        # A call gets no answer a second after the server would have given up.
        self._deadline = self.statement_timeout + 1.0
        self._watching = self._deadline  # the deadline of the call in progress
        self._busy_wait = self.connect_timeout + self._deadline + 1.0
        self._start_fresh()
        _all_stores.add(self)

    def _start_fresh(self) -> None:
        """No connection, lock or watchdog yet: this process's own state (also after a fork)."""
        self._pid = os.getpid()
        self._mutex = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self._backend: int | None = None  # the backend pid of _conn
        self._held: set[str] = set()  # the keys whose lock the connection holds
        self._suspect = False  # the connection may hold a lock we do not know of
        self._lost = False  # the last call lost the server (for probe())
        self._orphans: list[int] = []  # backends of connections dropped mid-call
        self._watchdog = Watchdog(f"checkpointer-pg-watchdog {self._where}")

    def _after_fork(self) -> None:
        """In a forked child: a fresh store; only this process's descriptor of the parent's
        connection is closed (``close()`` would end the parent's session and locks)."""
        if self._conn is not None:
            _inherited.append(self._conn)
            with contextlib.suppress(Exception):
                os.close(self._conn.pgconn.socket)
        if self._watchdog._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._watchdog._fd)
        self._start_fresh()

    def location(self, key: str) -> str:
        return f"{self._where}/{self.schema}/{key}"

    def probe(self) -> bool:
        """Whether the server answers again after this store lost it (``ProbingStore``)."""
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
        """``call(conn)`` in a session; once more after an idle loss (calls safe to repeat)."""
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
        """The live connection, under the store's mutex and the watchdog, ``budget`` seconds
        more than the usual deadline.  A broken connection is dropped, with its locks; one
        kept from an earlier call and found broken fails as ``IdleLoss`` (retry at once)."""
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
                    # The server ends a vanished host's session (and its locks).
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
        """Close and forget the connection and its locks (``orphan``: dropped mid-call, its
        backend may still hold a key's lock, which ``_acquire`` ends)."""
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


_all_stores: weakref.WeakSet[ConnectionPart] = weakref.WeakSet()
_inherited: list[object] = []  # a forked child's copies of its parent's connections


def _after_fork_in_child() -> None:
    for store in list(_all_stores):
        store._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
