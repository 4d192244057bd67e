"""Per-role timelines of one traced GEMM call (issue #13)."""
