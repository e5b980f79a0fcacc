"""The PostgreSQL stores (psycopg is imported only when a store is made)."""
