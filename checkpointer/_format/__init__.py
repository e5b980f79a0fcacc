"""The on-disk formats: bytes to values and back, with no I/O."""
