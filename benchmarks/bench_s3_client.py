"""Which S3 client the S3 stores use: botocore against obstore, measured.

Run from the repository root (both installed: ``pip install botocore obstore``;
moto's S3 server, the ``[test]`` extra, is started on 127.0.0.1)::

    python -m benchmarks.bench_s3_client

Prints, per library: the import time in a fresh interpreter (median of 5),
the time to make a client, the latency of one conditional PUT (``If-Match``
on the object's ETag, 1 KiB, median and p90 of 200 against the local
server), the distributions it brings (itself and its dependencies, and
their size on disk), and whether a forked child can PUT with a client it
makes itself after its parent used the library (a 15 s guard).
"""

from __future__ import annotations

import importlib.metadata
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

_IMPORTS = {
    "botocore": "import botocore.session, botocore.config",
    "obstore": "import obstore, obstore.store",
}
_DISTRIBUTIONS = {"botocore": "botocore", "obstore": "obstore"}
_REPEATS = 200


def import_seconds(library: str) -> float:
    code = f"import time; t = time.perf_counter(); {_IMPORTS[library]}"
    code += "; print(time.perf_counter() - t)"
    command = [sys.executable, "-c", code]
    runs = [
        float(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
        for _ in range(5)
    ]
    return statistics.median(runs)


def closure(name: str) -> tuple[list[str], int]:
    """The distributions ``name`` installs (itself first) and their size on disk, bytes."""
    seen: list[str] = []
    todo = [name]
    while todo:
        dist = importlib.metadata.distribution(todo.pop())
        if dist.metadata["Name"].lower() in seen:
            continue
        seen.append(dist.metadata["Name"].lower())
        for requirement in dist.requires or []:
            if "extra ==" in requirement:
                continue
            base = requirement.split(";")[0].split("[")[0]
            for sep in "<>=!~ (":
                base = base.split(sep)[0]
            try:
                importlib.metadata.distribution(base.strip())
            except importlib.metadata.PackageNotFoundError:
                continue
            todo.append(base.strip())
    size = 0
    for dist_name in seen:
        for file in importlib.metadata.distribution(dist_name).files or []:
            path = file.locate()
            if os.path.isfile(path):
                size += os.path.getsize(path)
    return seen, size


def _botocore(url: str, bucket: str) -> tuple[Callable[[], Any], Callable[[Any, str | None], str]]:
    import botocore.config
    import botocore.session

    def make() -> Any:
        return botocore.session.get_session().create_client(
            "s3",
            endpoint_url=url,
            region_name="us-east-1",
            config=botocore.config.Config(s3={"addressing_style": "path"}),
        )

    def put(client: Any, etag: str | None) -> str:
        extra = {"IfMatch": etag} if etag else {"IfNoneMatch": "*"}
        answer = client.put_object(Bucket=bucket, Key="bench", Body=b"x" * 1024, **extra)
        return str(answer["ETag"])

    return make, put


def _obstore(url: str, bucket: str) -> tuple[Callable[[], Any], Callable[[Any, str | None], str]]:
    import obstore
    from obstore.store import S3Store

    def make() -> Any:
        return S3Store(
            bucket, endpoint=url, region="us-east-1", client_options={"allow_http": True}
        )

    def put(client: Any, etag: str | None) -> str:
        mode: Any = {"e_tag": etag} if etag else "create"
        answer = obstore.put(client, "bench-obstore", b"x" * 1024, mode=mode)
        return str(answer["e_tag"])

    return make, put


def measure(library: str, url: str, bucket: str) -> dict[str, Any]:
    make, put = (_botocore if library == "botocore" else _obstore)(url, bucket)
    started = time.perf_counter()
    client = make()
    made = time.perf_counter() - started
    etag = put(client, None)
    latencies = []
    for _ in range(_REPEATS):
        started = time.perf_counter()
        etag = put(client, etag)
        latencies.append(time.perf_counter() - started)
    latencies.sort()
    return {
        "client": made,
        "put_median": statistics.median(latencies),
        "put_p90": latencies[int(0.9 * len(latencies))],
        "fork": fork_check(make, put),
    }


def fork_check(make: Callable[[], Any], put: Callable[[Any, str | None], str]) -> str:
    """Fork (the parent has used the library); the child makes a client and PUTs."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            client = make()
            try:
                put(client, None)
            except Exception as exc:  # 412: the object exists; the server answered
                code = 0 if "412" in str(exc) or "Precondition" in str(exc) else 2
            else:
                code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return "works" if os.waitstatus_to_exitcode(status) == 0 else "fails"
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return "hangs (killed after 15 s)"


def main() -> None:
    from tests.s3 import ENV, Server, new_bucket

    os.environ.update(ENV)
    server = Server()
    server.start()
    try:
        bucket = new_bucket(server)
        print("python -m benchmarks.bench_s3_client")
        print(f"{_REPEATS} conditional PUTs of 1 KiB against moto's S3 server on 127.0.0.1\n")
        print("| library | import | client | PUT median | PUT p90 | distributions (size) | fork |")
        print("|---|---|---|---|---|---|---|")
        for library in ("botocore", "obstore"):
            try:
                seen, size = closure(_DISTRIBUTIONS[library])
            except importlib.metadata.PackageNotFoundError:
                print(f"| {library} | not installed |")
                continue
            imported = import_seconds(library)
            got = measure(library, server.url, bucket)
            print(
                f"| {library} | {imported * 1e3:.0f} ms | {got['client'] * 1e3:.0f} ms | "
                f"{got['put_median'] * 1e3:.1f} ms | {got['put_p90'] * 1e3:.1f} ms | "
                f"{len(seen)}: {', '.join(seen)} ({size / 2**20:.1f} MiB) | {got['fork']} |"
            )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
