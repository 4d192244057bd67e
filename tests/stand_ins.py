"""The call path's stand-ins, shared by the CPU tests of the dispatcher (tests/host) and of
swap-AB (tests/kernels): a dispatcher posing as a GPU whose kernels are float64 products."""

import ctypes
import functools

import torch

from wsgemm.api import Dispatcher, dispatch
from wsgemm.api.epilogue import Epilogue, activation_grad, torch_activation
from wsgemm.host.dispatch import StandInDevices

F16, F32 = torch.float16, torch.float32


class StandInKernel:
    """C[m,n,l] = act(alpha · sum_k A[m,k,l] B[n,k,l] + beta · C[m,n,l] + bias) in float64 (the
    fused epilogue of the variant it was handed for: ``epilogue``; C the output's values, or
    with ``c_tensor`` the ``residual`` launch argument's), remembering what each launch was
    given (and a split kernel's launch arguments: split count, workspace and semaphores; a bias
    vector; a residual's address)."""

    def __init__(self):
        self.launches = []
        self.splits = []
        self.biases = []
        self.residuals = []  # the addresses of the C tensors read (``Epilogue.c_tensor``)

    def __call__(self, a, b, c, clusters, raster_group=0, split=1, workspace=None, sems=None,
                 bias=None, alpha=None, beta=None, residual=None, *, epilogue="none"):  # fmt: skip
        self.launches.append((a.data_ptr(), b.data_ptr(), c.data_ptr(), clusters))
        if workspace is not None:
            self.splits.append((tuple(a.shape), tuple(c.shape), split, workspace, sems.clone()))
        result = torch.einsum("mkl,nkl->mnl", a.double(), b.double())
        spec = Epilogue.parse(epilogue)
        assert (alpha is not None) == (beta is not None) == spec.scalars, (spec, alpha, beta)
        if spec.scale:
            result = alpha * result
        assert (residual is not None) == spec.own_c, (spec, residual)
        if spec.residual:  # C's values before the call: its own tensor, or the output itself
            if spec.c_tensor:
                assert residual.shape == c.shape and residual.stride() == c.stride(), (
                    residual.shape, residual.stride(), c.shape, c.stride())  # fmt: skip
                self.residuals.append(residual.data_ptr())
            result = result + beta * (c if residual is None else residual).double()
        if spec.bias != "none":
            assert bias is not None and bias.dim() == 1 and bias.stride(0) == 1
            self.biases.append((spec.bias, bias.clone()))
            rows = spec.bias == "row"
            assert bias.numel() == c.shape[0 if rows else 1], (spec, bias.shape, c.shape)
            result = result + (bias.double()[:, None, None] if rows else bias.double()[:, None])
        c.copy_(torch_activation(spec.activation, result).to(c.dtype))


class StandInCache:
    def __init__(self):
        self.kernel = StandInKernel()
        self.variants = []

    def get(self, variant):
        self.variants.append(variant)
        if variant.epilogue == "none":
            return self.kernel
        return functools.partial(self.kernel, epilogue=variant.epilogue)


class GatedKernels:
    """A compile cache whose kernels are float64 stand-ins of the gated family's contracts:
    plain products (the unfused roads' matmul), the gated kernel (with a bias, and its preact
    output), the dgated one (``Epilogue.dgated``) and the dact one (``Epilogue.dact``); it
    records the variants it was asked for
    (tests/api/test_gated.py, the training step's tests in tests/ops)."""

    def __init__(self):
        self.variants = []

    def get(self, variant):
        self.variants.append(variant)
        swapped = variant.config is not None and getattr(variant.config, "swap_ab", False)
        return functools.partial(self.run, epilogue=Epilogue.parse(variant.epilogue),
                                 swapped=swapped)  # fmt: skip

    @staticmethod
    def run(a, b, c, clusters, raster=0, split=1, ws=None, sems=None, bias=None, *rest, epilogue,
            swapped=False):  # fmt: skip
        if epilogue.dgated:  # C and the output (M, 2N): their gate halves (M, N, 1) given
            n, pre = c.shape[1], rest[-1]
            assert pre.shape == c.shape and pre.stride(1) == c.stride(1) == 1
            pre = pre.as_strided((pre.shape[0], n, 2), (pre.stride(0), 1, n)).double()
            dh = torch.einsum("mkl,nkl->mn", a.double(), b.double())
            gate, up = pre[..., 0], pre[..., 1]
            dgate = dh * up * activation_grad(epilogue.activation, gate).double()
            dup = dh * torch_activation(epilogue.activation, gate)
            both = c.as_strided((c.shape[0], n, 2), (c.stride(0), 1, n))
            both.copy_(torch.stack([dgate, dup], dim=-1).to(c.dtype))
            return
        if epilogue.dact or epilogue.preact:  # C (the pre-activation) is the last argument
            assert len(rest) == 3 and rest[:2] == (None, None), rest  # (alpha, beta, C)
        if epilogue.dact:  # C and the output (M, N, 1) of one major: dh · act'(pre)
            pre, unit = rest[-1], 0 if swapped else 1  # swap-AB: both M-major
            assert pre.shape == c.shape and pre.stride(unit) == c.stride(unit) == 1
            # the kernel reads memory: a negated view's would be the wrong values
            assert not any(t.is_neg() for t in (a, b, c, pre))
            dh = torch.einsum("mkl,nkl->mnl", a.double(), b.double())
            c.copy_((dh * activation_grad(epilogue.activation, pre).double()).to(c.dtype))
            return
        if epilogue.gated and swapped:  # the swap-AB tile: A's view is the gate's rows
            half = c.shape[0]
            assert a.shape[0] == half and a.stride(1) == 1  # K-major
            assert c.stride(0) == 1  # C^T: M-major
            assert epilogue.bias in ("none", "row") and not epilogue.preact
            a = a.as_strided((2 * half, *a.shape[1:]), a.stride())
            y = torch.einsum("mkl,nkl->mnl", a.double(), b.double())[..., 0]
            if epilogue.bias == "row":  # [b_gate; b_up] along the weights' rows
                y = y + bias.double().reshape(-1, 1)
            y = torch_activation(epilogue.activation, y[:half]) * y[half:]
            c.copy_(y.unsqueeze(-1).to(c.dtype))
            return
        if epilogue.gated:  # B's view is the gate's rows; the up rows follow in memory
            half = c.shape[1]
            assert b.shape[0] == half and b.stride(1) == 1  # K-major
            b = b.as_strided((2 * half, *b.shape[1:]), b.stride())
        y = torch.einsum("mkl,nkl->mnl", a.double(), b.double())
        if epilogue.bias != "none":  # the gated kernel's is [b_gate; b_up], as B's rows
            along = (1, -1, 1) if epilogue.bias == "col" else (-1, 1, 1)
            y = y + bias.double().reshape(along)
        if epilogue.preact and epilogue.gated:  # the product's halves (plus the bias)
            pre = rest[-1]
            assert pre.shape == c.shape and pre.stride(1) == 1
            pre.as_strided((pre.shape[0], 2 * half), (pre.stride(0), 1)).copy_(y[..., 0])
        elif epilogue.preact:  # a plain product's pre-activation, then its activation
            pre = rest[-1]
            assert pre.shape == c.shape and pre.stride(1) == c.stride(1) == 1 and not swapped
            assert not any(t.is_neg() for t in (a, b, c, pre))
            pre.copy_(y.to(pre.dtype))
            y = torch_activation(epilogue.activation, y)
        if epilogue.gated:
            y = torch_activation(epilogue.activation, y[:, :half]) * y[:, half:]
        c.copy_(y.to(c.dtype))


def cpu_dispatcher(capability=(9, 0), **options) -> Dispatcher:
    return Dispatcher(StandInCache(), StandInDevices(capability, 132), **options)


def matmul(d, a, b, out=None, out_dtype=None, accumulate=F32, backend="auto", config=None):
    return dispatch.call(d, a, b, out, out_dtype, accumulate, backend, config)


def reference(a, b, dtype=F16):
    return torch.matmul(a.double(), b.double()).to(dtype)


LAYOUTS = [
    # (a shape, b shape, a column-major, b column-major, out given)
    ((64, 32), (32, 48), False, False, False),
    ((64, 32), (32, 48), True, True, True),
    ((37, 29), (29, 13), False, True, True),  # ragged: copies on the way in and out
    ((3, 16, 24), (24, 40), False, False, False),  # folds into one (48, 24) @ (24, 40)
    ((16, 24), (3, 24, 40), False, True, True),  # a broadcast: materialized per batch
    ((2, 16, 8), (2, 8, 16), True, False, True),
]


def at(address: int, dtype, shape, stride) -> torch.Tensor:
    """The tensor at a raw CPU ``address`` (shared memory, writes go through)."""
    extent = 1 + sum((s - 1) * st for s, st in zip(shape, stride, strict=True))
    size = torch.empty((), dtype=dtype).element_size()
    buf = (ctypes.c_char * (extent * size)).from_address(address)
    flat = torch.frombuffer(buf, dtype=torch.uint8).view(dtype)
    return flat.as_strided(shape, stride)


def address_entry(variant, body):
    """A compiled address entry's stand-in for ``variant`` (``kernels.common.address``'s
    arguments, then the kernel class's launch arguments by name) as the compile cache hands it
    out (a ``KernelCall``, which binds): ``body(a, b, c, launch)`` runs on the (M, K, L),
    (N, K, L) and (M, N, L) views it rebuilds from the addresses, sizes and strides it is given
    (a gated unit's B view, or on a swap-AB tile its A view, reaches the up rows after the
    gate's), ``launch`` the launch
    arguments after ``max_active_clusters`` (which comes first in it) by name."""
    from wsgemm.host.compiling import cache as compile_cache
    from wsgemm.host.compiling.compile import launch_signature, wrap_launch

    names, defaults = launch_signature(variant)
    ab, c_dtype = getattr(torch, variant.ab_dtype), getattr(torch, variant.c_dtype)
    majors = compile_cache.kernel_call(None, variant).majors
    first = names.index("max_active_clusters")

    def raw(*args):
        s = dict(zip(names, args, strict=True))
        m, n, k, l_ = s["m"], s["n"], s["k"], s["l"]

        def view(p, dtype, shape, rows_major, ld, batch):
            strides = (1, ld, batch) if rows_major else (ld, 1, batch)
            return at(p.value, dtype, shape, strides)

        gated = "gated" in variant.epilogue
        swapped = variant.config is not None and getattr(variant.config, "swap_ab", False)
        rows = 2 * m if gated and swapped else m  # the swap-AB tile's up rows: A's
        a = view(s["a"], ab, (rows, k, l_), majors[0] == "m", s["a_ld"], s["a_batch"])[:m]
        rows = 2 * n if gated and not swapped else n
        b = view(s["b"], ab, (rows, k, l_), majors[1] == "n", s["b_ld"], s["b_batch"])[:n]
        c = view(s["c"], c_dtype, (m, n, l_), majors[2] == "m", s["c_ld"], s["c_batch"])
        body(a, b, c, {name: s[name] for name in names[first:]})

    return compile_cache.kernel_call(wrap_launch(raw, (names, defaults)), variant)
