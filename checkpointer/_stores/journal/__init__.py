"""The journals: a checkpoint costs what changed (new messages appended).

* ``staging``: what a journal knows of a key and what it stages.
* ``core``: staging by prefix and the append/compaction bookkeeping that
  the file, PostgreSQL and S3 journals share.
* ``file``: ``JournalStore``, one JSON Lines file per key.

The rows themselves (the format) are in ``_format/journal.py``.
"""
