"""The sm90 family: Hopper (sm_90a) persistent warp-specialized GEMM with TMA loads, WGMMA and a
TMA-store epilogue, cooperative or ping-pong consumers (backends ``sm90`` and ``sm90-pingpong``).

Pieces: ``config`` (Sm90Config, budgets, shipped configs; plain Python) and ``kernel``
(``Sm90Gemm``: the plan, the host entry ``__call__``, the device entry ``kernel`` and the roles
``load``, ``mma`` and ``epilogue`` as methods). Nothing is imported here, so ``config`` stays
importable without the DSL.
"""
