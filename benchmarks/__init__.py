"""The benchmark suite: one sub-package per comparison (``python -m benchmarks.<comparison>.run``), shared
code in ``common``, ``python -m benchmarks.render`` for benchmarks/RESULTS.md."""
