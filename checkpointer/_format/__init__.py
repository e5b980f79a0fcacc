"""The on-disk formats: bytes to values and back, with no I/O.

* ``envelope``: a checkpoint file (and a PostgreSQL row's bytes);
* ``versions``: the caller's state versions: newer refused, older migrated;
* ``journal``: the journal's rows, read back and built (both journals);
* ``summary``: a summary checkpoint's Markdown file with its front matter.

Imports only ``_values``, ``_version`` and msgspec; the stores and ``load``
build on it (``tests/test_layers.py`` keeps that so).
"""
