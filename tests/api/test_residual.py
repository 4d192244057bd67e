"""``matmul(a, b, c=, alpha=, beta=)`` on the CPU (issue #25's residual): ``act(alpha · a @ b +
beta · c + bias)`` on every route (the sm90 family's kernels read C from the output they are
about to write; sm80 and the torch route combine in torch), ``c`` the output itself or copied
into it, the checks, a refused call leaving ``out`` as it was, and ``explain``. Stand-in kernels
compute the kernel contract in float64 (``stand_ins``)."""

import pytest
import torch
from op_helpers import addmm_reference
from stand_ins import LAYOUTS, cpu_dispatcher

import wsgemm
from wsgemm.api import dispatch
from wsgemm.api.epilogue import Epilogue
from wsgemm.host import registry

F16, F32 = torch.float16, torch.float32


@pytest.fixture(autouse=True, params=["fused", "torch", "c_tensor"])
def fusing(monkeypatch, request):
    """Every road: the sm90 kernels reading C from the output (``registry.RESIDUAL_FAMILIES``;
    any other ``c`` copied into it), the product combined in torch, and the kernels reading a
    C of its own where it lies (``registry.C_TENSOR_FAMILIES``)."""
    monkeypatch.setattr(registry, "FUSING_FAMILIES", registry.EPILOGUE_FAMILIES)
    monkeypatch.setattr(registry, "C_TENSOR_FAMILIES", frozenset())
    if request.param in ("fused", "c_tensor"):
        monkeypatch.setattr(registry, "RESIDUAL_FAMILIES", registry.EPILOGUE_FAMILIES)
    if request.param == "c_tensor":
        monkeypatch.setattr(registry, "C_TENSOR_FAMILIES", registry.EPILOGUE_FAMILIES)
    return request.param


def call(d, a, b, *, c=None, alpha=1.0, beta=1.0, bias=None, activation=None, out=None,
         backend="auto"):  # fmt: skip
    return dispatch.call_scaled(d, a, b, out, None, F32, backend, None, bias, activation, c,
                                alpha, beta)  # fmt: skip


def rand(shape, seed, col=False):
    t = torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(F16)
    return t.mT.contiguous().mT if col else t


def expected(a, b, c, alpha, beta, bias=None, activation=None):
    return addmm_reference(a, b, c, alpha, beta, bias, activation).to(F16)


def close(got, want):
    torch.testing.assert_close(got.double(), want.double(), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("backend", ["auto", "sm90-pingpong", "sm80"])
@pytest.mark.parametrize("in_place", [False, True])
def test_results_on_every_route(layout, backend, in_place):
    sa, sb, a_col, b_col, _ = layout
    a, b = rand(sa, 0, a_col), rand(sb, 1, b_col)
    shape = torch.matmul(a, b).shape
    c = rand(shape, 2)
    want = expected(a, b, c, 0.5, -2.0)
    d = cpu_dispatcher()
    if in_place:
        out = c.clone()
        got = call(d, a, b, c=out, out=out, alpha=0.5, beta=-2.0, backend=backend)
        assert got is out
    else:
        got = call(d, a, b, c=c, alpha=0.5, beta=-2.0, backend=backend)
    close(got, want)
    again = call(d, a, b, c=out if in_place else c, out=out if in_place else None,
                 alpha=0.5, beta=-2.0, backend=backend)  # fmt: skip
    if not in_place:  # the signature's launcher, from the second call on
        close(again, want)


@pytest.mark.parametrize("fusing", ["fused"], indirect=True)
def test_the_kernel_reads_c_from_its_output_with_alpha_and_beta_as_launch_arguments(fusing):
    a, b = rand((64, 32), 0), rand((32, 48), 1)
    c = rand((64, 48), 2)
    d = cpu_dispatcher()
    out = torch.full((64, 48), float("nan"), dtype=F16)
    call(d, a, b, c=c, out=out, alpha=2.0, beta=0.25, bias=rand((48,), 3), activation="relu")
    kernel_epilogues = [v.epilogue for v in d.cache.variants]
    assert kernel_epilogues and all(
        Epilogue.parse(e).residual and Epilogue.parse(e).scale for e in kernel_epilogues
    )
    close(out, expected(a, b, c, 2.0, 0.25, rand((48,), 3), "relu"))
    # another alpha compiles nothing new: the same variant, another signature
    before = {v.key() for v in d.cache.variants}
    call(d, a, b, c=c, out=out, alpha=3.0, beta=0.25, bias=rand((48,), 3), activation="relu")
    assert {v.key() for v in d.cache.variants} == before


@pytest.mark.parametrize("fusing", ["c_tensor"], indirect=True)
def test_the_kernel_reads_a_c_of_its_own_where_it_lies(fusing):
    """``Epilogue.c_tensor``: a dense row-major ``c`` of the result's shape goes to the kernel
    as its ``residual`` launch argument, never copied into the result; the signature's direct
    launcher hands each later call's own ``c`` (here another tensor) to the kernel."""
    a, b = rand((64, 32), 0), rand((32, 48), 1)
    d = cpu_dispatcher()
    for backend in ("auto", "sm90-pingpong"):
        for seed in (2, 5):  # the first call, then the signature's launcher
            c = rand((64, 48), seed)
            got = call(d, a, b, c=c, alpha=2.0, beta=0.25, bias=rand((48,), 3), backend=backend)
            close(got, expected(a, b, c, 2.0, 0.25, rand((48,), 3)))
            assert d.cache.kernel.residuals[-1] == c.data_ptr()
            assert Epilogue.parse(d.cache.variants[-1].epilogue).c_tensor
    out = torch.full((64, 48), float("nan"), dtype=F16)
    c = rand((64, 48), 7)
    assert call(d, a, b, c=c, out=out, beta=-1.0) is out
    close(out, expected(a, b, c, 1.0, -1.0))
    assert d.cache.kernel.residuals[-1] == c.data_ptr()


@pytest.mark.parametrize(
    "shapes",
    [((3, 16, 32), (32, 48)), ((3, 16, 32), (3, 32, 48)), ((16, 32), (3, 32, 48))],
    ids=["tokens-x-weight", "batched", "a-broadcast"],
)
@pytest.mark.parametrize("fusing", ["c_tensor"], indirect=True)
def test_a_batched_c_of_its_own_is_read_where_it_lies(fusing, shapes):
    """A transformer's ``(batch, tokens, hidden)`` residual: the batch folds into the kernel's
    view of ``c`` as it folds into the output's; a batch the kernel walks as its own mode
    copies ``c`` for now (not yet run on a GPU with C read where it lies)."""
    a, b = rand(shapes[0], 0), rand(shapes[1], 1)
    d = cpu_dispatcher()
    for seed in (2, 3):
        c = rand(torch.matmul(a, b).shape, seed)
        close(call(d, a, b, c=c, beta=-0.5), expected(a, b, c, 1.0, -0.5))
        folded = len(shapes[1]) == 2
        assert (c.data_ptr() in d.cache.kernel.residuals) == folded


def test_explain_on_meta_tensors_names_the_copy():
    from wsgemm.api import explain

    a, b = (torch.empty(s, dtype=F16, device="meta") for s in ((64, 32), (32, 48)))
    text = explain(a, b, c=torch.empty(64, 48, dtype=F16, device="meta"), cc=(9, 0))
    assert "c: " in text


def test_explain_takes_an_out_on_meta_and_fake_tensors():
    """Meta and fake tensors have no memory, so an ``out`` overlaps nothing (every meta
    tensor's data pointer is 0: each was refused as overlapping ``a``)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    m = lambda *s: torch.empty(*s, dtype=F16, device="meta")  # noqa: E731
    out = m(64, 48)
    assert "M=64 N=48 K=32" in wsgemm.explain(m(64, 32), m(32, 48), out=m(64, 48))
    assert "c: " in wsgemm.explain(m(64, 32), m(32, 48), c=out, out=out, alpha=2.0)
    with FakeTensorMode():
        f = lambda *s: torch.empty(*s, dtype=F16, device="cuda")  # noqa: E731
        out = f(64, 48)
        assert "M=64 N=48 K=32" in wsgemm.explain(f(64, 32), f(32, 48), c=out, out=out)


@pytest.mark.parametrize(
    "make_c",
    [
        lambda c: c.mT.contiguous().mT,  # column-major
        lambda c: torch.cat([c, c], 1)[:, :48],  # rows apart
        lambda c: c[0],  # a row that broadcasts
    ],
    ids=["column-major", "strided", "broadcast"],
)
@pytest.mark.parametrize("fusing", ["c_tensor"], indirect=True)
def test_a_c_the_kernel_cannot_read_where_it_lies_is_copied(fusing, make_c):
    a, b = rand((64, 32), 0), rand((32, 48), 1)
    c = make_c(rand((64, 48), 2))
    d = cpu_dispatcher()
    close(call(d, a, b, c=c, beta=0.5), expected(a, b, c, 1.0, 0.5))
    assert not any(Epilogue.parse(v.epilogue).c_tensor for v in d.cache.variants)
    assert d.cache.kernel.residuals == []


@pytest.mark.parametrize("fusing", ["c_tensor"], indirect=True)
def test_a_c_overlapping_out_is_copied_first(fusing):
    """A ``c`` that shares memory with ``out`` without being it: the kernel would read values
    its own stores already changed, so C goes through a copy."""
    a, b = rand((32, 32), 0), rand((32, 48), 1)
    buf = rand((40, 48), 2)
    c, out = buf[:32], buf[8:40]
    want = expected(a, b, c.clone(), 1.0, 1.0)
    d = cpu_dispatcher()
    close(call(d, a, b, c=c, out=out), want)
    assert d.cache.kernel.residuals == []


def test_alpha_alone_and_beta_zero_never_read_c():
    a, b = rand((40, 24), 0), rand((24, 56), 1)
    d = cpu_dispatcher()
    close(call(d, a, b, alpha=-1.5), expected(a, b, None, -1.5, 0.0))
    nan = torch.full((40, 56), float("nan"), dtype=F16)
    close(call(d, a, b, c=nan, beta=0.0), expected(a, b, None, 1.0, 0.0))
    out = torch.full((40, 56), float("nan"), dtype=F16)
    close(call(d, a, b, c=out, out=out, beta=0), expected(a, b, None, 1.0, 0.0))
    assert all(not Epilogue.parse(v.epilogue).residual for v in d.cache.variants)


@pytest.mark.parametrize("c_shape", [(56,), (1, 56), (40, 1), (), (3, 40, 56), (1, 1, 56)])
def test_a_c_that_broadcasts(c_shape):
    batch = len(c_shape) == 3 or c_shape == (1, 1, 56)
    a = rand((3, 40, 24) if batch else (40, 24), 0)
    b = rand((24, 56), 1)
    c = rand(c_shape, 2)
    d = cpu_dispatcher()
    close(call(d, a, b, c=c, beta=2.0), expected(a, b, c, 1.0, 2.0))


def test_k_zero_is_beta_c_plus_the_bias():
    a, b = rand((16, 0), 0), rand((0, 24), 1)
    c, bias = rand((16, 24), 2), rand((24,), 3)
    d = cpu_dispatcher()
    close(call(d, a, b, c=c, beta=3.0, alpha=2.0, bias=bias), expected(a, b, c, 2.0, 3.0, bias))


def test_the_torch_route_takes_them_too():
    a, b = rand((32, 16), 0), rand((16, 24), 1)
    c = rand((32, 24), 2)
    d = cpu_dispatcher(capability=(7, 5))  # no wsgemm kernel: torch.matmul
    close(call(d, a, b, c=c, alpha=0.5, beta=2.0), expected(a, b, c, 0.5, 2.0))
    # alpha alone, no out: torch's route allocates the result (it read a None ``out``)
    close(call(d, a, b, alpha=-1.5), expected(a, b, None, -1.5, 0.0))
    got = wsgemm.matmul(a, b, alpha=2.0)  # CPU tensors: torch's route on the real dispatcher
    assert got.dtype == F16 and got.shape == (32, 24)
    close(got, expected(a, b, None, 2.0, 0.0))
    # a c of its own and an out: CPU tensors are checked as CPU ones (this was refused:
    # "a must be a CUDA tensor")
    out = torch.full((32, 24), float("nan"), dtype=F16)
    assert wsgemm.matmul(a, b, c=c, out=out, alpha=0.5, beta=2.0) is out
    close(out, expected(a, b, c, 0.5, 2.0))


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(alpha=True), TypeError, "alpha must be a real number"),
        (dict(beta="1"), TypeError, "beta must be a real number"),
        (dict(alpha=torch.tensor(2.0)), TypeError, "alpha must be a real number"),
        (dict(c=[1.0]), TypeError, "c must be a torch.Tensor"),
        (dict(c=torch.zeros(32, 24, dtype=F32)), TypeError, "output's dtype"),
        (dict(c=torch.zeros(5, 24, dtype=F16)), ValueError, "does not broadcast"),
        (dict(c=torch.zeros(2, 32, 24, dtype=F16)), ValueError, "does not broadcast"),
    ],
)
def test_bad_arguments_are_refused(kwargs, error, match):
    a, b = rand((32, 16), 0), rand((16, 24), 1)
    with pytest.raises(error, match=match):
        call(cpu_dispatcher(), a, b, **kwargs)


def test_a_refused_call_leaves_out_as_it_was():
    a, b = rand((32, 16), 0), rand((16, 24), 1)
    out = rand((32, 24), 5)
    before = out.clone()
    with pytest.raises(ValueError):
        call(cpu_dispatcher(), a, b, c=rand((32, 24), 2), out=out, backend="no-such-backend")
    with pytest.raises(ValueError, match="overlaps"):  # out overlaps a
        big = rand((64, 24), 6)
        call(cpu_dispatcher(), big[:32, :16], b, c=rand((32, 24), 2), out=big[16:48])
    assert torch.equal(out, before)


def test_c_that_overlaps_out_without_being_it_reads_cs_values_before_the_call():
    a, b = rand((32, 16), 0), rand((16, 24), 1)
    buf = rand((33, 24), 7)
    want = expected(a, b, buf[1:].clone(), 1.0, 1.0)
    call(cpu_dispatcher(), a, b, c=buf[1:], out=buf[:32])
    close(buf[:32], want)


def test_a_call_refused_after_the_checks_leaves_out_as_it_was():
    """The torch route refuses an fp16 accumulator only once routed: after c was copied."""
    a, b = rand((32, 16), 0), rand((16, 24), 1)
    out = rand((32, 24), 5)
    before = out.clone()
    with pytest.raises(ValueError, match="accumulate"):
        dispatch.call_scaled(cpu_dispatcher(capability=(7, 5)), a, b, out, None, F16, "auto",
                             None, None, None, rand((32, 24), 2), 1.0, 1.0)  # fmt: skip
    assert torch.equal(out, before)


@pytest.mark.parametrize("backend", ["sm90-pingpong", "sm80", "auto"])
def test_alpha_scales_a_product_too_large_for_the_output(backend):
    """16 x 16 x 256 = 65536 overflows fp16; alpha = 0.5 brings it back: the product is
    combined in fp32 (or in the kernel), never rounded to fp16 first."""
    a = torch.full((64, 256), 16.0, dtype=F16)
    b = torch.full((256, 64), 16.0, dtype=F16)
    got = call(cpu_dispatcher(), a, b, alpha=0.5, backend=backend)
    assert torch.equal(got, torch.full((64, 64), 32768.0, dtype=F16))


def test_beta_zero_still_checks_c():
    a, b = rand((32, 16), 0), rand((16, 24), 1)
    with pytest.raises(ValueError, match="does not broadcast"):
        call(cpu_dispatcher(), a, b, c=torch.zeros(7, dtype=F16), beta=0.0)


def test_explain_says_how_c_is_read():
    from wsgemm.api import explain

    a, b = torch.empty(64, 32, dtype=F16), torch.empty(32, 48, dtype=F16)
    out = torch.empty(64, 48, dtype=F16)
    text = explain(a, b, c=out, out=out, alpha=2.0, beta=0.5)
    assert "alpha = 2 times the product" in text and "plus beta = 0.5 times C" in text
    assert ("C read by the kernel" in text) == (registry.RESIDUAL_FAMILIES != frozenset())
    assert ("RESIDUAL_FAMILIES" in text) == (registry.RESIDUAL_FAMILIES == frozenset())
    assert "c: out itself" in text
    assert "copied into a new result first" in explain(a, b, c=torch.empty(48, dtype=F16))
    own = explain(a, b, c=torch.empty(64, 48, dtype=F16))
    assert ("read by the kernel where it lies" in own) == (
        registry.C_TENSOR_FAMILIES != frozenset()
    )


def test_a_residual_on_a_cluster_split_route_splits_through_the_workspace(fusing):
    """A decode problem whose plain product the policy runs as a cluster split: with C read by
    the kernel, whose cluster split form has no residual, the same ways go through the
    workspace (``Route.in_workspace``); the plain product keeps its cluster split."""
    d = cpu_dispatcher()
    a, b = rand((5, 4096), 0), rand((4096, 1536), 1, col=True)
    route = d.route("auto", None, (5, 1536, 4096, None), ("float16", "float16", "float32"))
    ways = route.config.cluster_split
    assert ways > 1
    c = rand((5, 1536), 2)
    call(d, a, b, c=c, alpha=1.0, beta=1.0)
    (v,) = d.cache.variants
    if not registry.fuses_epilogues(route.backend, scalars=True):  # the product, then C in torch
        assert v.config.cluster_split == ways and Epilogue.parse(v.epilogue).plain
    else:
        assert Epilogue.parse(v.epilogue).residual
        assert v.config == route.in_workspace().config and v.config.cluster_split == 1


def test_a_bias_on_a_cluster_split_route_waits_for_its_gpu_check(fusing, monkeypatch):
    """A bias (and an activation) rides the cluster split kernel once its GPU check passed:
    with ``CLUSTER_SPLIT_EPILOGUE_FAMILIES`` empty the split goes through the workspace; with
    it on (main's since docs/perf.md entry 104), over the cluster."""
    a, b = rand((5, 4096), 0), rand((4096, 1536), 1, col=True)
    bias = rand((1536,), 3)
    for on, want_cluster in ((frozenset(), False), (registry.EPILOGUE_FAMILIES, True)):
        monkeypatch.setattr(registry, "CLUSTER_SPLIT_EPILOGUE_FAMILIES", on)
        d = cpu_dispatcher()
        route = d.route("auto", None, (5, 1536, 4096, None), ("float16", "float16", "float32"))
        ways = route.config.cluster_split
        call(d, a, b, bias=bias, activation="gelu_tanh", alpha=1.0, beta=0.0)
        (v,) = d.cache.variants
        assert Epilogue.parse(v.epilogue).bias != "none"
        assert (v.config.cluster_split == ways) == want_cluster
        assert want_cluster or v.config == route.in_workspace().config
