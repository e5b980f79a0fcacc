"""The writer: ``CheckpointWriter`` (``service``), the anyio service that keeps a session's
checkpoint on disk.  A write goes forward only: ``notify()`` -> the scheduler
(``_schedule.py``) -> ``timer`` (a write from the event loop, its worker-thread
hop) -> ``commit`` (one write: snapshot, check, build, commit; what each key
holds, and its lock, in ``keystate``) -> ``record`` (counters, log).
``lifecycle`` opens and closes it; ``collapse`` writes a summary checkpoint.
"""
