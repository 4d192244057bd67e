"""Fused epilogues: what a kernel does to its fp32 accumulators before it converts and stores
them, ``D = act(acc + bias)``.

Composable pieces, each a small module a family's epilogue calls on one subtile of registers:

* ``Epilogue`` (``wsgemm.support``: plain Python, which the host's compile key reads without
  importing a kernel module): the compile-time choice of bias mode and activation;
* ``activation``: the activations in fp32 (relu, relu², gelu in its tanh and erf forms, silu),
  written for the special-function unit (``ex2.approx``, ``rcp.approx``; no division that
  compiles to a call);
* ``bias``: the bias addend of one accumulator element, per row or per column of the kernel's
  problem, read from global memory at a clamped index (no branch).
* ``row_scale``: one accumulator element's factor of a per-row scale, applied last (a router
  weight), read as the bias is.

Adding an activation is one branch in ``activation.apply`` and one name in
``support.ACTIVATIONS``.
"""

from wsgemm.support import ACTIVATIONS, BIAS_MODES, PLAIN, ROW_SCALES, Epilogue

__all__ = ["ACTIVATIONS", "BIAS_MODES", "PLAIN", "ROW_SCALES", "Epilogue"]
