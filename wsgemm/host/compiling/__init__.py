"""The compiling room: a kernel variant compiled without a GPU, and kept.

* ``compile``: the fake arguments a variant compiles with (symbolic M, N, K, L; static unit
  strides), ``compile_variant`` (its address entry ``by_address``), the launch defaults a kernel
  loaded from disk gets back;
* ``calls``: ``KernelCall``, a compiled entry called with kernel views (and bound to a call
  signature's sizes and strides once);
* ``cache``: ``CompileCache``, variant -> kernel call, in memory and on disk;
* ``disk`` (entries checked, locked, quarantined, pruned), ``files`` (private copies of bytes),
  ``library`` (an entry's shared library, loaded without the DSL), ``fingerprint`` (the
  toolchain the entries are keyed by);
* ``warming``: compiling many variants ahead of time, in worker processes.

Nothing here chooses a kernel (``host.choosing``) or launches one on a call's tensors
(``wsgemm.api``).
"""
