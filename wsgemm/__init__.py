"""wsgemm: warp-specialized half-precision GEMM kernels in CuTe DSL, with a torch API.

>>> import torch, wsgemm
>>> a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
>>> b = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
>>> c = wsgemm.matmul(a, b)          # same meaning as torch.matmul(a, b), differentiable
>>> wsgemm.nn.replace_linear(model)  # model's nn.Linear layers now run on wsgemm

The user API is ``__all__``; the layers below (``wsgemm.api``, ``wsgemm.host``,
``wsgemm.kernels``, ...) stay importable by their module paths.
"""

from . import nn
from .api import available_backends
from .ops import linear, matmul

__version__ = "0.1.0"
__all__ = ["matmul", "linear", "nn", "available_backends"]
