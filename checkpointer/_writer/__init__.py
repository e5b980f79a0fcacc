"""The writer: ``CheckpointWriter`` (``service``), the anyio service that keeps a session's
checkpoint on disk.  A write goes forward only: ``notify()`` -> the scheduler
(``_schedule.py``) -> ``timer`` (a write from the event loop, its worker-thread
hop) -> ``commit`` (one write: snapshot, check, build, commit; what each key
holds in ``keystate``, its lock in ``keylocks``) -> ``record`` (counters, log).
``closing`` is the close's final write; ``collapse`` a summary checkpoint.
"""
