"""The benchmark: every wsgemm speed claim is measured with this one instrument.

``python -m wsgemm bench --quick`` (or ``python -m wsgemm.bench``); docs/benchmarking.md has the
protocol. Modules, each with one job:

* ``suites``: problem sizes (square, llm, decode, ragged, quick, ``--shapes``).
* ``layouts``: TN/NN/NT/TT operand views and the randn operands.
* ``backends``: cuBLAS, wsgemm's backends, our Triton matmul, QuACK behind one interface.
* ``triton_matmul``: the persistent autotuned Triton matmul the benchmark compares against.
* ``check``: the fp32 reference and the tolerance a result must meet before it is timed.
* ``measure``: cold-L2 CUDA-event timing and the per-round statistics.
* ``nvml``, ``hardware``, ``env``: clocks and power, tensor peaks per clock, the record header.
* ``runner``: one run, shape by shape: check, then interleaved rounds.
* ``schema``: the JSON record (versioned), its validation, CSV.
* ``report``, ``plot``: tables and the figure, drawn from a record alone.
* ``cli``: ``add_arguments(parser)`` and ``run(args)`` for ``python -m wsgemm bench``.

Nothing here imports torch, triton, quack or wsgemm's kernels at import time.
"""
