"""The sm80 family: cp.async loads, ldmatrix + mma.sync, one CTA per output tile (sm_80 and
later). Two kernels share every piece but the roles:

* ``specialized.Sm80WsGemm`` (backend ``sm80``): a producer warp loads, consumer warps multiply;
* ``multistage.Sm80MultistageGemm`` (backend ``sm80-multistage``): the ablation baseline, every
  warp loads and multiplies.

Pieces: ``config`` (Sm80Config, budgets, shipped configs; plain Python), ``plan`` (the static
plan, layouts, copies, shared-memory carving), ``load`` (global -> shared), ``mma`` (shared ->
registers -> tensor cores), ``epilogue`` (registers -> global), ``kernel`` (the host entry both
kernels share). Nothing is imported here, so ``config`` stays importable without the DSL.
"""
