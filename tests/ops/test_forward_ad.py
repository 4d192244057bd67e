"""Forward-mode AD and functorch's grad / jvp over wsgemm's functions (CPU tensors, which take
torch's road; on a GPU the same routing runs before any kernel is chosen).

The registered ops' autograd formulas are reverse-mode only, and torch drops a tangent through
such an op silently (a zero or missing tangent: a wrong derivative). ``wsgemm.matmul``,
``linear`` and ``gated_linear`` run torch's own ops when a call is differentiated so
(``ops.forward_differentiated``); a direct op call is refused."""

import pytest
import torch
import torch.autograd.forward_ad as fwAD

import wsgemm

F16 = torch.float16
# (torch's own forward-AD decompositions, loaded at the first dual level, are scripted)
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script`:DeprecationWarning")


def _operands(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g).to(F16) for s in shapes]


def _close(x, ref, tol=2e-2):
    assert x.shape == ref.shape
    torch.testing.assert_close(x.double(), ref.double(), rtol=tol, atol=tol)


def test_forward_ad_carries_the_tangents_of_matmul_and_its_epilogue():
    x, w, t, b, tb, c, tc = _operands((4, 5), (5, 6), (4, 5), (6,), (6,), (4, 6), (4, 6))
    xd, wd = x.double(), w.double()
    with fwAD.dual_level():
        y = wsgemm.matmul(fwAD.make_dual(x, t), w)
        _close(fwAD.unpack_dual(y).primal, xd @ wd)
        _close(fwAD.unpack_dual(y).tangent, t.double() @ wd)
        # the bias's tangent through the activation: silu'(pre) * tb
        y = wsgemm.matmul(x, w, bias=fwAD.make_dual(b, tb), activation="silu")
        pre = xd @ wd + b.double()
        s = torch.sigmoid(pre)
        _close(fwAD.unpack_dual(y).tangent, s * (1 + pre * (1 - s)) * tb.double())
        # alpha and beta * c
        y = wsgemm.matmul(x, fwAD.make_dual(w, w), c=fwAD.make_dual(c, tc), alpha=2.0, beta=0.5)
        _close(fwAD.unpack_dual(y).tangent, 2 * xd @ wd + 0.5 * tc.double())
        y = wsgemm.linear(fwAD.make_dual(x, t), w.t())
        _close(fwAD.unpack_dual(y).tangent, t.double() @ wd)


def test_torch_func_jvp_grad_and_jacrev_see_matmul():
    x, w, t = _operands((4, 5), (5, 6), (4, 5))
    _, tangent = torch.func.jvp(lambda x: wsgemm.matmul(x, w), (x,), (t,))
    _close(tangent, t.double() @ w.double())
    g = torch.func.grad(lambda x: wsgemm.matmul(x, w.float()).sum())(x.float())
    _close(g, w.double().sum(1).expand(4, 5))
    jac = torch.func.jacrev(lambda x: wsgemm.matmul(x, w.float(), activation="relu"))(x.float())
    ref = torch.func.jacrev(lambda x: torch.relu(x @ w.float()))(x.float())
    _close(jac, ref)
    # vmap keeps the op's batching rule
    assert torch.func.vmap(lambda r: wsgemm.matmul(r, w))(x.reshape(2, 2, 5)).shape == (2, 2, 6)


def test_gated_linear_carries_its_tangent():
    x, w, t = _operands((3, 8), (6, 8), (3, 8))
    with fwAD.dual_level():
        y = wsgemm.gated_linear(fwAD.make_dual(x, t), w, "silu")
        tangent = fwAD.unpack_dual(y).tangent

    def unit(x):
        y = x @ w.double().t()
        return torch.nn.functional.silu(y[:, :3]) * y[:, 3:]

    _close(tangent, torch.func.jvp(unit, (x.double(),), (t.double(),))[1])


def test_a_direct_op_call_under_forward_ad_is_refused():
    x, w, t = _operands((4, 5), (5, 6), (4, 5))
    with fwAD.dual_level():
        with pytest.raises(NotImplementedError, match="torch.ops.wsgemm.matmul has no forward"):
            torch.ops.wsgemm.matmul(fwAD.make_dual(x, t), w)
        # a dual level with no tangent on the operands is an ordinary call
        torch.testing.assert_close(torch.ops.wsgemm.matmul(x, w), x @ w)


def test_grouped_mm_refuses_a_forward_derivative():
    a, b, t = _operands((6, 4), (2, 4, 3), (6, 4))
    offs = torch.tensor([2, 6], dtype=torch.int32)
    with fwAD.dual_level():
        with pytest.raises(NotImplementedError, match="wsgemm.grouped_mm has no forward-mode"):
            wsgemm.grouped_mm(fwAD.make_dual(a, t), b, offs)
        with pytest.raises(NotImplementedError, match="torch.ops.wsgemm.grouped_mm"):
            torch.ops.wsgemm.grouped_mm(fwAD.make_dual(a, t), b, offs)
    with pytest.raises(NotImplementedError, match="torch.func.jvp"):
        torch.func.jvp(lambda a: wsgemm.grouped_mm(a, b, offs), (a,), (t,))
    with pytest.raises(NotImplementedError, match="torch.func.grad"):
        torch.func.grad(lambda a: wsgemm.grouped_mm(a, b.float(), offs).sum())(a.float())


def test_vmap_inside_a_dual_level_and_fp64_and_vmap_biases():
    """vmap under a dual level runs (a batched tensor's tangent cannot be read: torch's ops
    run it); fp64 operands keep fp64 on the forward-AD road; under vmap a bias is checked
    against a sample's result, and a vector result takes its own bias."""
    x, w = _operands((3, 5), (5, 6))
    with fwAD.dual_level():
        assert torch.func.vmap(lambda r: wsgemm.matmul(r, w))(x).shape == (3, 6)
        xd, wd, t = x.double(), w.double(), torch.randn(3, 5, dtype=torch.float64)
        y = wsgemm.matmul(fwAD.make_dual(xd, t), wd)
        assert y.dtype == torch.float64
        torch.testing.assert_close(fwAD.unpack_dual(y).primal, xd @ wd, rtol=0, atol=1e-12)
        torch.testing.assert_close(fwAD.unpack_dual(y).tangent, t @ wd, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match=r"bias has shape \(1, 6\)"):
        torch.func.vmap(lambda r: wsgemm.matmul(r, w, bias=torch.zeros(1, 6, dtype=F16)))(x[:, :5])
    a, vs, bias = _operands((4, 5), (3, 5), (4,))
    got = torch.func.vmap(lambda v: wsgemm.matmul(a, v, bias=bias))(vs)
    _close(got, (vs.double() @ a.double().t()) + bias.double())


def test_the_forward_ad_road_casts_under_cuda_autocast_as_the_op_does():
    """fp32 CUDA operands (fake) under autocast: fp16 out, as torch.matmul's and the op's.
    (``torch.autocast("cuda")`` turns itself off on a CPU-only build: the switch directly.)"""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a, b, t = (torch.empty(s, device="cuda") for s in ((4, 5), (5, 6), (4, 5)))
        torch._C.set_autocast_enabled("cuda", True)
        try:
            assert torch.get_autocast_dtype("cuda") == F16
            with fwAD.dual_level():
                ad = fwAD.make_dual(a, t)
                assert wsgemm.matmul(ad, b).dtype == F16 == torch.matmul(ad, b).dtype
                assert wsgemm.matmul(ad, b, alpha=2.0).dtype == F16
                assert wsgemm.linear(ad, b.t()).dtype == F16
        finally:
            torch._C.set_autocast_enabled("cuda", False)
