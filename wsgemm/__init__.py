"""wsgemm: warp-specialized half-precision GEMM kernels in CuTe DSL, with a torch API.

>>> import torch, wsgemm
>>> a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
>>> b = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
>>> c = wsgemm.matmul(a, b)          # same meaning as torch.matmul(a, b), differentiable
>>> wsgemm.nn.replace_linear(model)  # model's nn.Linear layers now run on wsgemm
>>> wsgemm.trace(a, b).plot("timeline.png")  # what each warp role did during one call

The user API is ``__all__``; the layers below (``wsgemm.api``, ``wsgemm.host``,
``wsgemm.kernels``, ...) stay importable by their module paths. The torch ops
(``torch.ops.wsgemm.matmul``) are registered when ``wsgemm.ops`` is imported: on first use of
``matmul``, ``linear`` or ``nn``.
"""

import importlib

__version__ = "0.1.0"
__all__ = ["matmul", "linear", "nn", "explain", "available_backends", "trace"]

# Where each public name lives (None: the name is a submodule).
_PUBLIC = {
    "matmul": "ops",
    "linear": "ops",
    "nn": None,
    "explain": "api",
    "available_backends": "api",
    "trace": "tracing",
}


def __getattr__(name: str):
    # torch and the DSL load on first use of the API, not on `import wsgemm`: the command line
    # (`python -m wsgemm --help`, `cache info`) starts without them.
    if name not in _PUBLIC:
        raise AttributeError(f"module 'wsgemm' has no attribute {name!r}")
    module = importlib.import_module(f".{_PUBLIC[name] or name}", __name__)
    value = module if _PUBLIC[name] is None else getattr(module, name)
    globals()[name] = value  # later lookups are plain attribute reads, off the per-call path
    return value


def __dir__():
    return sorted({*globals(), *__all__})
