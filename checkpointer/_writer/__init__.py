"""The writer: the anyio service that keeps a session's checkpoint on disk.

The data path goes forward only, one module to the next::

    service.CheckpointWriter.notify()
      -> _schedule.Scheduler: when is the next write due?
      -> timer: the write is due (or write_now, flush_sync, a close, an exit hook)
      -> commit.Committer.prepare: snapshot, fingerprint, session.run_prepare,
         the store stages (encodes) the state
      -> one worker-thread hop
      -> commit.Committer.execute: keylocks (the key's lock), keystate (what
         is on disk, the window), the store commits

* ``service``: ``CheckpointWriter``, the anyio shell: configuration,
  ``notify``, both lifecycles, the hops to a thread, ``statistics``;
* ``timer``: the task that starts the writes the scheduler says are due;
* ``commit``: the synchronous core of one write; never calls the service;
* ``keystate``: what the writer knows of each key on disk, conflicts;
* ``keylocks``: the key locks one writer holds;
* ``session``: the prepare step and the meta a write adds;
* ``clock``: the writer's notion of time;
* ``collapse``: the async step of a summary checkpoint.

Exit hooks (atexit, SIGTERM/SIGHUP) are ``_exit.py``: the writer registers
itself there as an ``_exit.Flushable``.
"""
