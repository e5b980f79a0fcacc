"""The PostgreSQL stores, one concern a file: ``schema``, ``connection``, ``locks``,
``store`` (``PostgresStore``) and ``journal`` (``PostgresJournalStore``); psycopg
is imported only when a store is made."""
