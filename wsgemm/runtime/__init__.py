"""Building blocks the kernels share: pipelines and their arrive counts, tile schedulers,
register and shared-memory budgets. Plain Python or CuTe DSL; no torch."""
