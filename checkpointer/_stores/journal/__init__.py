"""The journals: a checkpoint costs what changed.

``staging`` and ``core`` are shared with the PostgreSQL and S3 journals;
``file`` is ``JournalStore``; the rows are ``_format/journal.py``.
"""
