"""Agent transcripts: sendable histories, repairs on a copy, fingerprints, the prepare step.

* ``messages``: our own message Structs (chat-completions and messages style),
  the fixed texts, reading a message's fields;
* ``dialects``: the frameworks' message shapes, as data, and detecting them;
* ``history``: the one-pass scan: is a history sendable? (``validate_history``);
* ``repair``: running results settled, dangling calls closed, on a copy;
* ``fingerprint``: the last message's fingerprint (``transcript_fingerprint``);
* ``prepare``: the writer's prepare step, incremental (``transcript_prepare``);
* ``summary``: where a summary checkpoint cuts a history, and resuming from it.

Pure functions over messages: no store, no anyio, no I/O, nothing printed
(``tests/test_layers.py``).  They import only ``_values`` and msgspec.
"""
