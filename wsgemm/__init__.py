"""wsgemm: warp-specialized half-precision GEMM kernels in CuTe DSL, with a torch API.

>>> import torch, wsgemm
>>> a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
>>> b = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
>>> c = wsgemm.matmul(a, b)          # same meaning as torch.matmul(a, b)
"""

__version__ = "0.1.0"
__all__ = ["matmul", "available_backends", "__version__"]


def __getattr__(name: str):
    # torch and the DSL load on first use of the API, not on `import wsgemm`: the command line
    # (`python -m wsgemm --help`, `cache info`) starts without them.
    if name in ("matmul", "available_backends"):
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'wsgemm' has no attribute {name!r}")
