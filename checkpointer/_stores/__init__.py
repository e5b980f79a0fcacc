"""Where checkpoints live: the store protocols and every store.

* ``base``: the protocols (``Store``, ``StateStore``, ``LockingStore``,
  ``ProbingStore``), in one file, and the key rule;
* ``atomic``: durable atomic replace; the only module that calls fsync;
* ``safefs``: opening files under a root so nothing planted redirects a write;
* ``flock``: one writer per key on a local disk;
* ``encoding``: a state encoded message by message (``Transcript``);
* ``envelopes``: any bytes store as a ``StateStore`` (one envelope a key);
* ``files``: ``FileStore``;
* ``summaries``: summary checkpoints on disk;
* ``journal/``: the journal core and ``JournalStore``;
* ``postgres/``: ``PostgresStore`` and ``PostgresJournalStore``;
* ``s3/``: ``S3Store`` and ``S3JournalStore`` (object storage).

Stores are synchronous: none imports anyio, the writer or the CLI, and none
prints (``tests/test_layers.py``).
"""
