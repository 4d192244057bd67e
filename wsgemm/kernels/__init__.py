"""CuTe DSL kernel classes. No torch here: these modules know tensors only as ``cute.Tensor``.

The contract every GEMM kernel class in this package keeps (the host layer, ``wsgemm.host``,
relies on it and nothing else):

* ``Kernel(config, ab_dtype, c_dtype, acc_dtype)`` where ``config`` is the kernel's own frozen
  dataclass (validated eagerly: a bad value raises ``ValueError`` saying what is allowed) and the
  dtypes are ``cutlass.Float16`` / ``cutlass.BFloat16`` (A and B), ``Float16``/``BFloat16``/
  ``Float32`` (C) and ``Float32``/``Float16`` (accumulator).
* ``kernel(mA, mB, mC, max_active_clusters, stream)`` is a ``@cute.jit`` method computing
  ``C[m, n, l] = sum_k A[m, k, l] * B[n, k, l]`` (CuTe's convention: B is given as (N, K, L)):

  - ``mA``: (M, K, L), ``mB``: (N, K, L), ``mC``: (M, N, L). M, N, K, L are run-time values
    (symbolic at compile time), any of them may be anything >= 1.
  - Exactly one of each tensor's first two modes has a static stride of 1 (its "major" mode);
    the other stride and the batch stride are dynamic multiples of 8 elements (16 bytes) and
    the base pointer is 16-byte aligned. The batch stride may be anything when L == 1.
  - Kernels with ``needs_vector_extent = True`` (cp.async kernels, whose 16-byte copies are
    predicated per vector) additionally require the extent of each major mode to be a multiple
    of 8; the host guarantees it by padding with zeros when needed. TMA kernels zero-fill
    out-of-bounds boxes themselves and take any extent.
  - ``max_active_clusters`` (``cutlass.Int32``): how many CTAs (or clusters) may be resident at
    once, for persistent kernels; others ignore it.
  - ``stream``: a ``cuda.CUstream``.
* Class attributes ``name`` (e.g. ``"sm90-cooperative"``), ``arch`` (``"sm_90a"`` or ``"sm_80"``),
  ``needs_vector_extent``.
* Class docstring: Roles / Pipelines / Per-role timeline.
"""
