"""A filesystem that forgets what was not made durable, for the power-cut torture.

The idea of LazyFS (Ramos et al., "When Amnesia Strikes: Understanding and
Reproducing Data Loss Bugs with Fault Injection", VLDB 2024; the FUSE
filesystem Jepsen uses to find data loss in databases): a FUSE passthrough
that keeps track of what an ``fsync`` made durable, and on command drops
everything else, as a power cut would.

* ``disk.py``: ``PowerDisk``, the passthrough and its model of durability
  (``strict``: unsynced data and unsynced directory changes are lost;
  ``ext4``: as strict, but a grown file keeps its size with zeros past its
  synced bytes), with op labels, counters and an armed cut point;
* ``fuse.py``: the FUSE process (mfusepy over Debian's ``fuse3``);
* ``client.py``: ``PowerFS``, which mounts one, cuts its power and waits
  for the durable state; ``unavailable()`` says why FUSE cannot be used
  here (then the tests skip).
"""

from .client import HANG_GUARD, PowerFS, PowerFSError, unavailable
from .disk import MODELS, PowerDisk, label_kind

__all__ = [
    "HANG_GUARD",
    "MODELS",
    "PowerDisk",
    "PowerFS",
    "PowerFSError",
    "label_kind",
    "unavailable",
]
