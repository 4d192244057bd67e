"""The compile-time choice of a fused epilogue (``wsgemm.support.Epilogue``: plain Python that the
host's compile key reads without importing a kernel module), under the epilogue package's
name."""

from wsgemm.support import ACTIVATIONS, BIAS_MODES, PLAIN, Epilogue

__all__ = ["ACTIVATIONS", "BIAS_MODES", "PLAIN", "Epilogue"]
