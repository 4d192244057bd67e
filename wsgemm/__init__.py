"""wsgemm: warp-specialized half-precision GEMM kernels in CuTe DSL, with a torch API.

>>> import torch, wsgemm
>>> a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
>>> b = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
>>> c = wsgemm.matmul(a, b)          # same meaning as torch.matmul(a, b), differentiable
>>> wsgemm.nn.replace_linear(model)  # model's nn.Linear layers now run on wsgemm
>>> wsgemm.trace(a, b).plot("timeline.png")  # what each warp role did during one call

The user API is ``__all__`` (``wsgemm.config``: the switches from Python); the layers below
(``wsgemm.api``, ``wsgemm.host``, ``wsgemm.kernels``, ...) stay importable by their module
paths. The torch ops (``torch.ops.wsgemm.matmul``, ``matmul_out``) are registered by ``import
wsgemm`` when torch is already imported, else as soon as torch is (``_AfterTorch``), so that
``torch.export.load`` finds them; ``import wsgemm`` alone imports neither torch nor the DSL.
"""

import importlib
import sys
import threading
import warnings

__version__ = "0.1.0"
__all__ = [
    "matmul", "linear", "gated_linear", "grouped_mm", "nn", "explain", "available_backends",
    "trace", "config", "tune",
]  # fmt: skip

# Where each public name lives (None: the name is a submodule).
_PUBLIC = {
    "matmul": "ops",
    "linear": "ops",
    "grouped_mm": "grouped",
    "gated_linear": "gated",
    "nn": None,
    "explain": "ops",
    "available_backends": "api",
    "trace": "tracing",
    "config": None,
    "tune": "api",
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


# ----------------------------------------------------------------------------- the torch ops


def _register_ops() -> None:
    """Import ``wsgemm.ops``, which registers ``torch.ops.wsgemm.*`` (it loads the API's Python
    layers, not the DSL: about 0.15 s after torch). A failure warns rather than raises: it
    happens inside someone's ``import torch``, and the API raises it again at first use."""
    try:
        importlib.import_module(".ops", __name__)
        importlib.import_module(".grouped", __name__)
        importlib.import_module(".gated", __name__)
        importlib.import_module(".mlp", __name__)
    except Exception as exc:
        warnings.warn(
            f"wsgemm: torch.ops.wsgemm could not be registered ({type(exc).__name__}: {exc}); "
            "a saved program that uses it will not load",
            RuntimeWarning,
            stacklevel=2,
        )


class _AfterTorch:
    """A ``sys.meta_path`` finder that registers the ops when torch has been imported, then
    removes itself.

    It finds nothing itself: it asks the finders after it, and wraps the loader of ``torch``
    and of every ``wsgemm.*`` module to count, per thread, the imports under way. The ops are
    registered when the outermost of them ends with torch imported, not the moment torch's
    own import ends: when a wsgemm module imports torch, that module (and the ones importing
    it) is half-initialized then, and ``wsgemm.ops`` imports them."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        self._done = False

    def find_spec(self, name, path, target=None):
        if self._done or not (name == "torch" or name.startswith(__name__ + ".")):
            return None
        for finder in sys.meta_path:
            find_spec = getattr(finder, "find_spec", None)
            if finder is self or find_spec is None:
                continue
            spec = find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _CountingLoader(spec.loader, self)
        return spec

    def enter(self) -> None:
        self._local.depth = getattr(self._local, "depth", 0) + 1

    def leave(self, imported: bool) -> None:
        self._local.depth -= 1
        if self._local.depth or not imported or "torch" not in sys.modules:
            return  # an import that failed registers nothing: the next one will
        with self._lock:
            if self._done:
                return
            self._done = True
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        _register_ops()


class _CountingLoader:
    """The loader of one module, counted in and out by ``_AfterTorch``; the module and its spec
    get the real loader back before they run."""

    def __init__(self, loader, hook: _AfterTorch) -> None:
        self._loader, self._hook = loader, hook

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__loader__ = module.__spec__.loader = self._loader
        self._hook.enter()
        imported = False
        try:
            self._loader.exec_module(module)
            imported = True
        finally:
            self._hook.leave(imported)

    def __getattr__(self, name: str):  # get_code, get_resource_reader, ... (runpy, resources)
        return getattr(self._loader, name)


def _torch_imported() -> bool:
    """torch is in ``sys.modules`` and done importing (not a half-made module: the import
    system's own mark, ``_initializing``, is set while a module runs)."""
    spec = getattr(sys.modules.get("torch"), "__spec__", None)
    return "torch" in sys.modules and not getattr(spec, "_initializing", False)


if _torch_imported():
    _register_ops()
elif "torch" not in sys.modules:
    sys.meta_path.insert(0, _AfterTorch())
# else: wsgemm is imported from inside torch's own import; the ops register at first use
