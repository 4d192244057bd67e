"""The sm90 family: Hopper (sm_90a) persistent warp-specialized GEMM with TMA loads, WGMMA and a
TMA-store epilogue, cooperative or ping-pong consumers (backends ``sm90`` and ``sm90-pingpong``).

Pieces: ``config`` (Sm90Config, budgets, shipped configs; plain Python), ``kernel``
(``Sm90Gemm``: the plan, the host entry ``__call__``, the device entry ``kernel`` and the roles
``load``, ``mma`` and ``epilogue`` as methods), ``split_k`` (the split-K/stream-K fix-up the
consumers run between mainloop and epilogue) and ``traced`` (the roles' loops in a kernel built
with ``trace=True``; ``Sm90Gemm`` inherits them). Nothing is imported here, so ``config`` stays
importable without the DSL.
"""
