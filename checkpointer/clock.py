"""The clock a writer reads and sleeps on: ``CheckpointWriter(clock=)``; tests inject a fake."""

from ._writer.clock import Clock, MonotonicClock

__all__ = ["Clock", "MonotonicClock"]
