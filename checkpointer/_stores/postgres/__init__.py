"""The PostgreSQL stores: ``PostgresStore`` (``store.py``) and ``PostgresJournalStore``.

``PostgresStore`` is built of parts, one concern a file: ``schema``,
``connection``, ``locks``, and ``store`` (the ``Store`` protocol and conditional
writes); ``errors`` are its exceptions; ``journal`` is the row sink of the
journal core.  psycopg is imported only when a store is made.
"""
