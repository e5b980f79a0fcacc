"""Benchmarks (the harness lives in ``python -m benchmarks``)."""
