"""Benchmarks: checkpointer against the floor and against what users pick instead.

``python -m benchmarks`` runs every case in ``benchmarks.__main__.CASES``,
prints one table per case and each ratio with its bar, writes the raw
figures to ``benchmarks/results/<mode>.json`` and, when matplotlib is
installed, draws the charts next to it.  ``--quick`` runs every case, at smaller
sizes and with fewer repeats, in 10-20 seconds.

A case is a module ``benchmarks/bench_<name>.py`` with::

    def main(quick: bool) -> dict[str, Any]: ...

Adding a case is one entry in ``CASES``.  The dict is free-form; the runner
prints it nicely when it follows the shape of ``benchmarks._harness.Report``
(``msgspec.to_builtins(Report(...))``):

* ``tables``: ``{"title", "columns", "rows"}``, where a cell is a number, a
  string, or a ``Stat`` (``median``, ``p10``, ``p90``, ``unit``, ``samples``);
* ``ratios``: ``{"name", "value", "op", "bar", "ok", "note"}``, printed as
  ``ratio <case>: <name> = <value>x (bar <op> <bar>x: met|MISSED|n/a)``;
* ``series``: named lists of ``[x, Stat]`` points for the charts
  (``growth/<store>`` for checkpoint cost against history length,
  ``stall/<approach>`` for the event-loop stall per approach);
* ``notes``: lines printed under the case.

Rules every case keeps: ratios against a baseline measured in the same run,
in the same process; absolute times only as context; a warm-up before the
measured repeats; medians with the p10-p90 spread.
"""
