"""The fused epilogue's host path on the CPU (issue #25, step 1): its checks, the route's kernel
variant (the epilogue in the compile key, swapped under swap-AB), the bias vector each launch
gets (a row bias repeated when a batch folds into M), sm80's epilogue applied by torch, and
``explain``. Stand-in kernels compute the kernel contract in float64 (``stand_ins``)."""

import re

import pytest
import torch
from stand_ins import LAYOUTS, cpu_dispatcher

import wsgemm
from wsgemm.api import dispatch
from wsgemm.api.epilogue import Epilogue, bias_mode, torch_activation
from wsgemm.host import Variant, registry

F16, F32 = torch.float16, torch.float32


@pytest.fixture(autouse=True)
def fusing(monkeypatch):
    """The sm90 fused-epilogue kernels switched on (``registry.FUSING_FAMILIES``: off on main
    until their first GPU check), so these tests drive the fused path."""
    monkeypatch.setattr(registry, "FUSING_FAMILIES", registry.EPILOGUE_FAMILIES)


def call(d, a, b, *, bias=None, activation=None, out=None, backend="auto", out_dtype=None):
    return dispatch.call(d, a, b, out, out_dtype, F32, backend, None, bias, activation)


def operands(sa, sb, a_col, b_col, seed=0):
    g = torch.Generator().manual_seed(seed)

    def make(shape, col):
        t = torch.randn(shape, generator=g).to(F16)
        return t.mT.contiguous().mT if col else t

    return make(sa, a_col), make(sb, b_col)


def make_bias(form, m, n, seed=1):
    g = torch.Generator().manual_seed(seed)
    shape = {"col": (n,), "col2": (1, n), "row": (m, 1), "scalar": (), "none": None}[form]
    return None if shape is None else torch.randn(shape, generator=g).to(F16)


def expected(a, b, bias, activation, dtype=F16):
    pre = torch.matmul(a.double(), b.double()) + (0 if bias is None else bias.double())
    return torch_activation(activation or "none", pre).to(dtype)


# every bias form with every activation, less the plain call (no bias, no activation)
EPILOGUE_FORMS = [
    (form, act)
    for form in ("col", "col2", "row", "scalar", "none")
    for act in (None, "gelu_tanh", "relu2")
    if (form, act) != ("none", None)
]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("form, activation", EPILOGUE_FORMS)
@pytest.mark.parametrize("backend", ["auto", "sm90-pingpong", "sm80"])
def test_results_on_every_route(layout, form, activation, backend):
    sa, sb, a_col, b_col, use_out = layout
    a, b = operands(sa, sb, a_col, b_col)
    m, n = sa[-2], sb[-1]
    bias = make_bias(form, m, n)
    d = cpu_dispatcher()
    want = expected(a, b, bias, activation)
    out = torch.full(want.shape, float("nan"), dtype=F16) if use_out else None
    # sm80: torch applies the epilogue to the rounded product (one more rounding, which
    # relu2 doubles)
    tol = 1e-2 if backend == "sm80" else 2e-3
    for _attempt in range(2):  # the second call runs the signature's launcher
        got = call(d, a, b, bias=bias, activation=activation, out=out, backend=backend)
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
        if bias is not None:  # another bias's values through the same launcher
            bias = torch.randn_like(bias.float()).to(F16)
            want = expected(a, b, bias, activation)
    fused = [v for v in d.cache.variants if v.epilogue != "none"]
    if backend == "sm80":
        assert not fused, "sm80 kernels do not fuse: torch applies the epilogue"
    else:
        assert fused and all(v.backend.startswith("sm90") for v in fused)


def test_swap_ab_turns_a_column_bias_into_the_kernels_row_bias():
    a, b = operands((8, 256), (256, 512), False, False)  # 8 tokens: auto swaps A and B
    bias = make_bias("col", 8, 512)
    d = cpu_dispatcher()
    got = call(d, a, b, bias=bias, activation="silu")
    torch.testing.assert_close(got, expected(a, b, bias, "silu"), rtol=2e-3, atol=2e-3)
    (v,) = [v for v in d.cache.variants if v.epilogue != "none"]
    assert v.kernel_config().swap_ab and v.epilogue == "bias_row+silu"
    mode, vector = d.cache.kernel.biases[-1]
    assert mode == "row" and torch.equal(vector, bias)


def test_a_row_bias_repeats_when_the_batch_folds_into_m():
    a, b = operands((3, 16, 24), (24, 40), False, False)  # (48, 24) @ (24, 40): one launch
    bias = make_bias("row", 16, 40)
    d = cpu_dispatcher()
    got = call(d, a, b, bias=bias, backend="sm90")
    torch.testing.assert_close(got, expected(a, b, bias, None), rtol=2e-3, atol=2e-3)
    mode, vector = d.cache.kernel.biases[-1]
    assert mode == "row" and torch.equal(vector, bias.reshape(-1).repeat(3))


def test_k_zero_gives_the_epilogue_of_zeros():
    a, b = torch.empty(5, 0, dtype=F16), torch.empty(0, 7, dtype=F16)
    bias = make_bias("col", 5, 7)
    got = call(cpu_dispatcher(), a, b, bias=bias, activation="relu")
    torch.testing.assert_close(got, torch.relu(bias.float()).expand(5, 7).to(F16))


def test_the_epilogue_is_part_of_the_compile_key():
    plain = Variant("sm90", "sm_90a")
    fused = Variant("sm90", "sm_90a", epilogue="bias_col+gelu")
    assert plain.key() == "sm90-sm_90a-float16-float16-float32-k-k"  # unchanged by epilogues
    assert fused.key() != plain.key() and fused.key().endswith("epilogue=bias_col+gelu")
    with pytest.raises(ValueError, match="only the sm90 family"):
        Variant("sm80", "sm_80", epilogue="silu")
    with pytest.raises(ValueError, match="activation"):
        Variant("sm90", "sm_90a", epilogue="bias_col+tanh")


def test_epilogue_names_round_trip():
    for bias in ("none", "row", "col"):
        for act in ("none", "relu", "relu2", "gelu", "gelu_tanh", "silu"):
            e = Epilogue(bias, act)
            assert Epilogue.parse(e.name) == e
            assert e.swapped().swapped() == e
    for e in (Epilogue(row_scale="fp32"), Epilogue(activation="silu", gated=True,
                                                   row_scale="input")):  # fmt: skip
        assert Epilogue.parse(e.name) == e and not e.plain
        with pytest.raises(ValueError, match="no swap-AB form"):
            e.swapped()
    with pytest.raises(ValueError, match="row scale 'fp16'"):
        Epilogue(row_scale="fp16")


@pytest.mark.parametrize(
    "bias_shape, mode",
    [((40,), "col"), ((1, 40), "col"), ((), "col"), ((1,), "col"), ((16, 1), "row"),
     ((1, 1, 40), "col"), ((1, 16, 1), "row")],
)  # fmt: skip
def test_bias_modes(bias_shape, mode):
    assert bias_mode(bias_shape, (3, 16, 40)) == mode


def test_a_bias_may_not_widen_a_vector_or_scalar_result():
    """A 1-D or 0-D result (a vector operand) takes a bias of its own shape, (1,) or (); one
    of more dimensions would make ``a @ b + bias`` wider than the product, so it is refused
    (it ran as if it had the result's rank)."""
    assert bias_mode((4,), (4,)) == bias_mode((1,), (4,)) == bias_mode((), ()) == "col"
    for bias_shape, out_shape in (((1, 4), (4,)), ((1,), ()), ((1, 1, 40), (16, 40))):
        with pytest.raises(ValueError, match=rf"output of shape {re.escape(str(out_shape))}"):
            bias_mode(bias_shape, out_shape)
    a, v = torch.randn(4, 5, dtype=F16), torch.randn(5, dtype=F16)
    with pytest.raises(ValueError, match=r"bias has shape \(1, 4\)"):
        wsgemm.matmul(a, v, bias=torch.zeros(1, 4, dtype=F16))
    assert wsgemm.matmul(a, v, bias=torch.zeros(4, dtype=F16)).shape == (4,)


@pytest.mark.parametrize(
    "bias, activation, error, match",
    [
        (torch.zeros(16, 40, dtype=F16), None, ValueError, "varies along one|must be"),
        (torch.zeros(41, dtype=F16), None, ValueError, "must be"),
        (torch.zeros(2, 1, 40, dtype=F16), None, ValueError, "same for every batch"),
        (torch.zeros(40, dtype=F32), None, TypeError, "inputs' dtype"),
        ([0.0] * 40, None, TypeError, "torch.Tensor"),
        (None, "tanh", ValueError, "relu, relu2, gelu, gelu_tanh, silu"),
        (None, 3, TypeError, "str or None"),
    ],
)
def test_bad_epilogues_are_refused(bias, activation, error, match):
    a, b = operands((16, 24), (24, 40), False, False)
    with pytest.raises(error, match=match):
        call(cpu_dispatcher(), a, b, bias=bias, activation=activation)


def test_out_may_not_overlap_the_bias():
    a, b = operands((16, 24), (24, 40), False, False)
    out = torch.empty(16, 40, dtype=F16)
    with pytest.raises(ValueError, match="out overlaps bias"):
        call(cpu_dispatcher(), a, b, bias=out[0], out=out)


def test_a_bias_that_requires_grad_is_refused_by_the_core():
    a, b = operands((16, 24), (24, 40), False, False)
    bias = make_bias("col", 16, 40).requires_grad_()
    with pytest.raises(ValueError, match="bias requires grad"):
        call(cpu_dispatcher(), a, b, bias=bias)


def test_explain_says_where_the_epilogue_runs():
    a, b = operands((64, 32), (32, 48), False, False)
    bias = make_bias("col", 64, 48)
    text = dispatch.explain(cpu_dispatcher(), a, b, None, None, F32, "auto", bias, "gelu")
    assert "epilogue: a bias per column then gelu, fused" in text
    sm80 = cpu_dispatcher((8, 0), against_torch=False)  # the kernel, not the race's default
    text = dispatch.explain(sm80, a, b, None, None, F32, "auto", bias, "gelu")
    assert "not fused: sm80 has no fused epilogue" in text
    plain = dispatch.explain(cpu_dispatcher(), a, b, None, None, F32, "auto")
    assert "epilogue" not in plain


def test_the_torch_route_applies_the_epilogue_too():
    """fp32 inputs under auto run torch.matmul (api.fallback): the bias and activation still
    apply, in the inputs' precision."""
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(16, 24, generator=g), torch.randn(24, 40, generator=g)
    bias = torch.randn(40, generator=g)
    d = cpu_dispatcher()
    for _ in range(2):  # the signature's kept launcher takes the bias too
        got = call(d, a, b, bias=bias, activation="silu")
        torch.testing.assert_close(got, torch.nn.functional.silu(a @ b + bias))
    text = dispatch.explain(d, a, b, None, None, F32, "auto", bias, "silu")
    assert "torch.matmul (fallback)" in text and "epilogue: a bias per column then silu" in text


def test_until_switched_on_the_fused_kernels_stay_off(monkeypatch):
    """On main the sm90 epilogue kernels are built but off: a call with a bias runs the plain
    kernel and torch's epilogue (correct), and explain says why."""
    monkeypatch.setattr(registry, "FUSING_FAMILIES", frozenset())
    a, b = operands((64, 32), (32, 48), False, False)
    bias = make_bias("col", 64, 48)
    d = cpu_dispatcher()
    got = call(d, a, b, bias=bias, activation="gelu")
    torch.testing.assert_close(got, expected(a, b, bias, "gelu"), rtol=1e-2, atol=1e-2)
    assert all(v.epilogue == "none" for v in d.cache.variants)
    text = dispatch.explain(d, a, b, None, None, F32, "auto", bias, "gelu")
    assert "not yet switched on" in text


def test_a_vector_result_takes_a_bias_along_it():
    """(M, K) @ (K,) is a vector of M: a bias of (M,) or () runs along it, on the fake road
    (the op's shape check) as in torch's ``a @ b + bias``."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    import wsgemm

    assert bias_mode((7,), (7,)) == "col" and bias_mode((), ()) == "col"
    with FakeTensorMode():
        a = torch.empty(7, 16, dtype=F16, device="cuda")
        b = torch.empty(16, dtype=F16, device="cuda")
        out = wsgemm.matmul(a, b, bias=torch.empty(7, dtype=F16, device="cuda"), activation="silu")
    assert out.shape == (7,)


def test_a_fused_activation_is_priced_in_the_choice():
    """On a short-K problem a cooperative tile's epilogue is most of a unit's time: with a
    logistic activation fused, the policy takes a ping-pong tile, whose epilogue runs under
    the other warpgroup's mainloop (``choosing.with_epilogue``); the plain call and a relu
    (no special-function work) keep the cooperative tile; explain names the move. Values in
    float64 either way."""
    m, n, k = 3858, 2048, 352
    a, b = operands((m, k), (k, n), False, False, seed=3)
    ran = {}
    for act in (None, "relu", "silu"):
        d = cpu_dispatcher()
        out = call(d, a, b, activation=act)
        ref = torch_activation(act or "none", a.double() @ b.double())
        assert (out.double() - ref).abs().max() <= 1e-2 * ref.abs().max()
        [variant] = d.cache.variants
        ran[act] = (variant.backend, variant.config.schedule if variant.config else None)
    assert ran[None][0] == ran["relu"][0] == "sm90"
    assert ran["silu"][0] == "sm90-pingpong"
    text = dispatch.explain(cpu_dispatcher(), a, b, None, None, F32, "auto", None, "silu")
    assert "with its activation:" in text and "MUFU" in text
    assert "with its activation" not in dispatch.explain(
        cpu_dispatcher(), a, b, None, None, F32, "auto", None, "relu"
    )
