"""Child programs that the tests run as real processes (``sys.executable path``)."""
