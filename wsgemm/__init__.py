"""wsgemm: warp-specialized half-precision GEMM kernels in CuTe DSL, with a torch API.

>>> import torch, wsgemm
>>> a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
>>> b = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
>>> c = wsgemm.matmul(a, b)          # same meaning as torch.matmul(a, b)
"""

from .api import available_backends, matmul

__version__ = "0.1.0"
__all__ = ["matmul", "available_backends", "__version__"]
