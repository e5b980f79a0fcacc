"""Encryption at rest: what sealing costs per MiB, and a writer's checkpoint with it.

The first table seals and opens a record of each size (``Encryption.seal`` and
``open``: the join, the AEAD, the header) with AES-256-GCM and ChaCha20-Poly1305,
in MiB per second.  The second times ``flush_sync()`` of a ``FileStore`` with
encryption and of one without, interleaved in pairs on the same state (a
transcript of that size), and gives the median of the paired ratios: what
encryption adds to a durable checkpoint, fsync included.  No bar: a figure for
the performance page.  ``--quick`` runs the smaller sizes only.
"""

from __future__ import annotations

import argparse
import functools
import os
import time
from typing import Any

import msgspec

from checkpointer import CheckpointWriter, FileStore, Snapshot, Written
from checkpointer.stores import Encryption

from ._harness import Report, Table, paired, ratio, scratch_dir, stat
from ._recipes import transcript_of

SIZES = [("100 KiB", 100 << 10), ("1 MiB", 1 << 20), ("10 MiB", 10 << 20)]
QUICK_SIZES = SIZES[:2]
MiB = float(1 << 20)


def _keys(algorithm: Any) -> Encryption:
    return Encryption(os.urandom(32), key_id="bench", algorithm=algorithm)


def _aead_rows(sizes: list[tuple[str, int]], n: int) -> list[list[Any]]:
    rows: list[list[Any]] = []
    for algorithm in ("aes-256-gcm", "chacha20-poly1305"):
        keys = _keys(algorithm)
        for label, nbytes in sizes:
            data = os.urandom(nbytes)
            seals, opens = [], []
            for _ in range(n):
                t0 = time.perf_counter()
                record = b"".join(keys.seal([data], key="k", position="r", meta=None))
                t1 = time.perf_counter()
                keys.open(record, key="k", position="r", where="bench")
                seals.append(t1 - t0)
                opens.append(time.perf_counter() - t1)
            s_seal, s_open = stat(seals), stat(opens)
            rows.append(
                [
                    algorithm,
                    label,
                    s_seal,
                    f"{nbytes / MiB / s_seal.median:.0f}",
                    s_open,
                    f"{nbytes / MiB / s_open.median:.0f}",
                ]
            )
    return rows


def _source(state: dict[str, Any]) -> Snapshot:
    return Snapshot("enc", state)


def _pairs(nbytes: int, n: int) -> tuple[list[float], list[float]]:
    """Paired flush_sync times: (encrypted, plain), alternating which goes first."""
    state = transcript_of(nbytes)
    sealed_t: list[float] = []
    plain_t: list[float] = []
    with scratch_dir("encryption-") as root:
        stores = [
            FileStore(os.path.join(root, "sealed"), encryption=_keys("aes-256-gcm")),
            FileStore(os.path.join(root, "plain")),
        ]
        writers = [
            CheckpointWriter(
                functools.partial(_source, state), store, write_on_start=False, exit_hooks=False
            )
            for store in stores
        ]
        for writer in writers:
            writer.open()
        try:
            for i in range(n):
                state["rev"] = i  # a change, or flush_sync would skip as unchanged
                for which in (0, 1) if i % 2 else (1, 0):
                    t0 = time.perf_counter()
                    result = writers[which].flush_sync()
                    assert isinstance(result, Written), result
                    (sealed_t if which == 0 else plain_t).append(time.perf_counter() - t0)
        finally:
            for writer in writers:
                writer.close()
    return sealed_t, plain_t


def main(quick: bool) -> dict[str, Any]:
    sizes = QUICK_SIZES if quick else SIZES
    report = Report(title="Encryption at rest: seal and open per MiB; a checkpoint with it")
    report.tables.append(
        Table(
            title="Encryption.seal / open of one record",
            columns=["algorithm", "size", "seal", "seal MiB/s", "open", "open MiB/s"],
            rows=_aead_rows(sizes, 5 if quick else 15),
        )
    )
    rows: list[list[Any]] = []
    for label, nbytes in sizes:
        n = (5 if quick else 21) if nbytes <= 1 << 20 else (3 if quick else 9)
        sealed_t, plain_t = _pairs(nbytes, n)
        value = paired(sealed_t, plain_t)
        rows.append([label, stat(sealed_t), stat(plain_t), f"{value:.2f}x", n])
        report.ratios.append(
            ratio(f"{label}: flush_sync encrypted / plain", value, note=f"median of {n} pairs")
        )
    report.tables.append(
        Table(
            title="flush_sync() of a FileStore, AES-256-GCM vs plain (fsync included)",
            columns=["state", "encrypted", "plain", "ratio", "pairs"],
            rows=rows,
        )
    )
    return msgspec.to_builtins(report)  # type: ignore[no-any-return]


if __name__ == "__main__":
    from .__main__ import render

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_encryption", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="the smaller sizes only")
    quick = parser.parse_args().quick
    out = main(quick)
    print(f"== encryption ({'quick' if quick else 'full'}): {out['title']}")
    print("\n".join(render("encryption", out)))
