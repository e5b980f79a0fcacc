"""The S3 connection of a store: one botocore client per process, every call bounded.

* **The client** is botocore's (the core of boto3), made lazily in the
  process that uses it: credentials, region, retries and the config file
  are read as every AWS SDK reads them (``AWS_ACCESS_KEY_ID``,
  ``AWS_PROFILE``, ``~/.aws/config``, ``AWS_MAX_ATTEMPTS``,
  ``AWS_RETRY_MODE``, instance and container roles).  Why botocore:
  ``docs/guides/object-storage.md`` has the measurements.
* **Forks.**  A forked child never uses its parent's client (whose pooled
  sockets the parent still uses): ``client()`` compares the pid and makes a
  new one, so a store the child inherited, or made, works there.
* **Bounded calls.**  ``connect_timeout`` and ``read_timeout`` bound each
  attempt (botocore's defaults, 60 s each with retries, let a silent
  endpoint hang a call for minutes).  A call made under a flush's deadline
  (``commit_deadline``: the exit and signal flushes) runs in a helper
  thread and is given up when the deadline passes: the flush returns
  ``Failed`` in time, and the request, if it lands later, is a conditional
  write the next one is fenced against.
* **Errors** become ``S3StoreError`` (an ``OSError``) whose message names
  the bucket or object and the way out; a refused condition stays a
  ``ClientError`` for the store to decide (``condition_failed``).
* **After an outage**, ``probe()`` tells a writer in backoff that the
  endpoint answers again (``ProbingStore``).
"""

from __future__ import annotations

import os
import re
import threading
import weakref
from typing import Any

from ..._text import one_line
from ..base import time_left

__all__ = ["S3Client", "S3StoreError", "condition_failed", "error_code", "import_botocore"]

_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_CONDITION = frozenset({"PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey", "404"})
_DENIED = frozenset(
    {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403", "ExpiredToken"}
)
_TRANSIENT = frozenset({"InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout"})
_PROBE_TIMEOUT = 2.0


class S3StoreError(OSError):
    """An S3 call failed: the endpoint cannot be reached, the bucket or the credentials are wrong.

    The message names the bucket (or object), the endpoint and what to do.
    """


def import_botocore() -> Any:
    """The botocore package, or an ImportError naming the extra to install."""
    try:
        import botocore.config
        import botocore.exceptions
        import botocore.session
    except ImportError:
        raise ImportError(
            "S3Store needs botocore (the core of boto3): pip install 'agent-checkpointer[s3]'"
        ) from None
    return botocore


def error_code(exc: BaseException) -> str | None:
    """The S3 error code of a botocore ``ClientError`` (``"PreconditionFailed"``), else None."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None
    code = response.get("Error", {}).get("Code")
    return str(code) if code is not None else None


def condition_failed(exc: BaseException) -> bool:
    """Whether a conditional PUT was refused: 412, a 409 race, or If-Match on a missing key."""
    return error_code(exc) in _CONDITION


class S3Client:
    """Where a store's objects live, and the client that reaches them (one per process).

    Args:
        bucket: the bucket.
        prefix: a folder in it ("" or ending in "/": one is added).
        endpoint_url: an S3-compatible endpoint; None for AWS.
        region: the region; None reads it as the SDKs do.
        connect_timeout: seconds to connect, per attempt.
        read_timeout: seconds to wait for data, per attempt.

    Raises:
        ValueError: a bucket name S3 would refuse, a prefix starting with
            "/", a timeout that is not a positive number.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str,
        *,
        endpoint_url: str | None,
        region: str | None,
        connect_timeout: float,
        read_timeout: float,
    ) -> None:
        if not isinstance(bucket, str) or _BUCKET.fullmatch(bucket) is None:
            raise ValueError(
                f"invalid bucket name {bucket!r}: 3-63 lower-case letters, digits, '.' or '-'"
            )
        if not isinstance(prefix, str) or prefix.startswith("/"):
            raise ValueError(f"prefix must be a str not starting with '/', got {prefix!r}")
        for name, value in (("connect_timeout", connect_timeout), ("read_timeout", read_timeout)):
            if not (isinstance(value, (int, float)) and 0 < value < float("inf")):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        self.botocore = import_botocore()
        self.bucket = bucket
        self.prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
        self.endpoint_url = endpoint_url
        self.region = region
        self.connect_timeout = float(connect_timeout)
        self.read_timeout = float(read_timeout)
        self._lock = threading.Lock()
        self._client: Any = None
        self._probe_client: Any = None
        self._pid = -1
        self.lost = False  # the last call could not reach the endpoint (for probe())
        _clients.add(self)

    @property
    def where(self) -> str:
        """``s3://bucket/prefix``, and the endpoint when it is not AWS."""
        at = f" at {self.endpoint_url}" if self.endpoint_url else ""
        return f"s3://{self.bucket}/{self.prefix}{at}"

    def url(self, name: str) -> str:
        return f"s3://{self.bucket}/{self.prefix}{name}"

    def client(self) -> Any:
        """This process's client: made on first use, and again in a forked child."""
        if self._pid != os.getpid():
            with self._lock:
                if self._pid != os.getpid():
                    self._client = self._make(self.connect_timeout, self.read_timeout, None)
                    self._probe_client = None
                    self._pid = os.getpid()
        return self._client

    def _make(self, connect: float, read: float, attempts: int | None) -> Any:
        botocore = self.botocore
        options: dict[str, Any] = {
            "connect_timeout": connect,
            "read_timeout": read,
            "tcp_keepalive": True,
            "user_agent_extra": "agent-checkpointer",
        }
        if attempts is not None:
            options["retries"] = {"total_max_attempts": attempts, "mode": "standard"}
        if self.endpoint_url:  # S3-compatible services: bucket in the path, not the host
            options["s3"] = {"addressing_style": "path"}
        session = botocore.session.get_session()
        return session.create_client(
            "s3",
            region_name=self.region,
            endpoint_url=self.endpoint_url,
            config=botocore.config.Config(**options),
        )

    def call(self, operation: str, **params: Any) -> Any:
        """Run ``operation`` (``"put_object"``, ...) on the bucket, bounded; return its answer.

        Raises:
            botocore ClientError: the service answered with an error that
                ``condition_failed`` or the caller decides (NoSuchKey, 412).
            S3StoreError: no answer, a wrong bucket or credentials.
            TimeoutError: no answer within the flush's deadline.
        """
        method = getattr(self.client(), operation)
        params.setdefault("Bucket", self.bucket)
        name = params.get("Key", "")
        try:
            answer = self._bounded(method, params)
        except Exception as exc:
            raise self._explain(exc, name) from None
        self.lost = False
        return answer

    def _bounded(self, method: Any, params: dict[str, Any]) -> Any:
        """``method(**params)``; under a flush's deadline, given up when it passes."""
        left = time_left()
        if left < 0:
            return method(**params)
        box: list[Any] = []
        done = threading.Event()

        def run() -> None:
            try:
                box.append((True, method(**params)))
            except BaseException as exc:
                box.append((False, exc))
            finally:
                done.set()

        threading.Thread(target=run, name="checkpointer-s3-call", daemon=True).start()
        if not done.wait(left):
            self.lost = True
            raise TimeoutError(
                f"{self.where}: no answer within the flush's timeout (exit_timeout); "
                "the request may still land, and the next write is fenced against it"
            )
        ok, value = box[0]
        if not ok:
            raise value
        return value

    def _explain(self, exc: Exception, name: str) -> Exception:
        """``exc`` as the caller should see it: a ClientError to decide, or an S3StoreError."""
        if isinstance(exc, TimeoutError):
            return exc
        exceptions = self.botocore.exceptions
        where = f"s3://{self.bucket}/{name}" if name else self.where
        code = error_code(exc)
        if code in _CONDITION:
            return exc
        if code is not None and ((code.isdigit() and code.startswith("5")) or code in _TRANSIENT):
            self.lost = True
            return S3StoreError(f"{where}: the service failed ({code}); will retry")
        if code in ("NoSuchBucket",):
            return S3StoreError(
                f"no bucket {self.bucket!r}{self._at()}: create it, or check the name"
            )
        if code in _DENIED:
            return S3StoreError(
                f"{where}: access denied ({code}): check the credentials (AWS_ACCESS_KEY_ID, "
                "AWS_PROFILE) and that they may read and write this bucket"
            )
        if isinstance(exc, exceptions.NoCredentialsError):
            return S3StoreError(
                f"{where}: no AWS credentials found: set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or run with a role"
            )
        if isinstance(exc, exceptions.ClientError):
            return S3StoreError(f"{where}: {one_line(str(exc))}")
        if isinstance(exc, (exceptions.HTTPClientError, exceptions.ConnectionError)):
            self.lost = True
            return S3StoreError(f"cannot reach {where}: {one_line(str(exc))}")
        if isinstance(exc, exceptions.BotoCoreError):
            return S3StoreError(f"{where}: {one_line(str(exc))}")
        return exc

    def _at(self) -> str:
        return f" at {self.endpoint_url}" if self.endpoint_url else ""

    def probe(self) -> bool:
        """True if the endpoint answers again after a call could not reach it; never raises.

        One HEAD of the bucket, one attempt of at most a couple of seconds:
        any answer (even a refusal) means a write would reach it.
        """
        if not self.lost:
            return False
        self.client()  # the pid check: a probe client of this process
        try:
            with self._lock:
                if self._probe_client is None:
                    timeout = min(_PROBE_TIMEOUT, self.read_timeout)
                    self._probe_client = self._make(timeout, timeout, 1)
                probe = self._probe_client
            probe.head_bucket(Bucket=self.bucket)
        except self.botocore.exceptions.ClientError:
            return True  # it answered
        except Exception:
            return False
        return True


_clients: weakref.WeakSet[S3Client] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # Another thread of the parent may have held a lock at the fork (making a client).
    for client in list(_clients):
        client._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
