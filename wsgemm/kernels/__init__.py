"""CuTe DSL kernel classes, one folder per family. No torch here: these modules know tensors only
as ``cute.Tensor``.

* ``sm80/``: cp.async + mma.sync kernels for sm_80 and later (``specialized``, ``multistage``);
* ``base.py``: ``GemmKernel``, the three host entries below (``__call__``, ``by_address``,
  ``traced``) written once for every kernel class, each ending in the family's ``_call``;
* ``sm90/``: the Hopper TMA + WGMMA persistent kernel (cooperative and ping-pong schedules;
  its split-K fix-up in ``split_k.py``, its traced loops in ``traced.py``);
* ``common/``: what the families share (arrive counts, budgets, the mbarrier ring, the tile
  scheduler, the trace recorder). Rules and hardware facts come from ``wsgemm.support``.

The contract every GEMM kernel class keeps (the host layer, ``wsgemm.host``, relies on it and
nothing else) separates what is compiled from what is launched:

**Compile key** (changes the generated code; one compile each, cached by ``host.Variant``):

* ``Kernel(config, ab_dtype, c_dtype, acc_dtype)``: ``config`` is the family's frozen config
  dataclass (``sm80.config.Sm80Config``: tile, stages, warps; ``sm90.config.Sm90Config``: tile,
  cluster, schedule), validated eagerly (a bad value raises ``ValueError`` saying what is
  allowed); the dtypes are ``cutlass.Float16`` / ``BFloat16`` (A and B), ``Float16`` /
  ``BFloat16`` / ``Float32`` (C) and ``Float32`` / ``Float16`` (accumulator), under the rules of
  ``wsgemm.support`` (``check_dtypes``).
* the target arch the host compiles for, and each operand's major mode (which of its first two
  modes has the static stride 1).

**Launch arguments** (run-time values of the host entry; any value reuses the compiled code):

* ``__call__(mA, mB, mC, max_active_clusters, stream, raster_group, *launch)`` (``launch``:
  the family's ``LAUNCH_EXTRAS``, sm90's ``split_count=1, workspace=None, semaphores=None``) is
  a ``@cute.jit``
  method computing ``C[m, n, l] = sum_k A[m, k, l] * B[n, k, l]`` (CuTe's convention: B is
  given as (N, K, L)):

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
  - ``stream``: a ``cuda.CUstream`` (the compiled function takes the environment's stream).
  - ``raster_group`` (``cutlass.Int32``): the tile order of persistent kernels, in m-tiles
    walked down a column before the next one; 0 is the kernel's default. Others ignore it.
  - sm90 kernels only: ``split_count`` (``cutlass.Int32``, default 1), ``workspace`` and
    ``semaphores`` (tensors, default None): split-K's count and buffers, used only by a kernel
    compiled to split (``Sm90Config.split_k != 1``; ``Sm90Gemm._call`` says what they must
    hold). A stream-K kernel (``Sm90Config.stream_k``) takes the buffers and ignores the
    count (``Sm90Config.stream_k_workspace_elements`` sizes its workspace). Their compiled
    function takes them as run-time values.

  Every kernel takes the same first launch arguments, so the host calls them all alike; a
  family's further trailing launch arguments (``LAUNCH_EXTRAS``) have defaults (0 / None: off)
  that keep the call ``fn(a, b, c, max_active_clusters)`` meaning what it meant, and
  ``fake_launch_extras()`` gives the host a compile-time stand-in for each (none for the sm80
  kernels). The entries carry no Python defaults (the DSL turns the ``*launch`` tail into
  parameters without any, which no defaulted one may precede): every compiled function, loaded
  from disk or compiled in this process, is wrapped with ``launch_defaults()`` by
  ``compiling.compile.wrap_launch``. (Swap-AB is a config field, ``Sm90Config.swap_ab``: the host
  passes the transposed problem, so it needs no launch argument.)

* ``by_address(majors, token, a, b, c, m, n, k, l, a_ld, a_batch, b_ld, b_batch, c_ld,
  c_batch, max_active_clusters, stream, ...)``: the entry the host compiles. ``majors``
  (compile time) is (A's, B's, C's) major mode; ``token`` is any tensor on the device (it
  names the device, and so the stream, to the compiled function); ``a``, ``b``, ``c`` are the
  operands' 16-byte aligned addresses, then M, N, K, L and each operand's non-unit and batch
  strides, then ``__call__``'s launch arguments. It builds ``__call__``'s three tensors
  (``common.address.operands``: the same static unit strides and 16-byte divisibility) and
  runs ``__call__``'s body, so its device code is ``__call__``'s.

* A traced variant (issue #13): ``Kernel(..., trace=True)`` is compiled and launched through
  ``traced(mA, mB, mC, max_active_clusters, stream, raster_group, trace_buffer, ...)`` (the
  same arguments, then an int32 ``(recorders, words)`` buffer in the layout of
  ``wsgemm.trace_format``, then the kernel's further launch arguments); its ``__call__``
  refuses to build, as ``traced`` does on an untraced kernel. ``trace`` is part of the compile
  key; untraced, the kernel's code and ``__call__``'s compiled signature are what they were
  without tracing (a ``None`` buffer argument would stay in the compiled signature, hence the
  separate entry).

* Class attributes ``name`` (its backend name, e.g. ``"sm90-pingpong"``), ``arch`` (the
  family's oldest target: ``"sm_90a"`` or ``"sm_80"``), ``needs_vector_extent``.
* The device entry is ``kernel`` (a ``@cute.kernel`` method that sets up and dispatches), the
  roles are methods ``load``, ``mma`` and ``epilogue`` (a kernel whose warps all load and
  compute says so: ``load_and_mma``).
* Class docstring: Roles / Pipelines / Per-role timeline.
"""
