"""Agent transcripts: pure functions over messages (no store, no anyio, no I/O)."""
