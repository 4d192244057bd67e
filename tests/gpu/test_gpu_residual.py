"""GPU correctness of the fused residual and alpha, ``act(alpha · a @ b + beta · c + bias)``
(issue #25), with the sm90 kernels that read C switched on for this module: from their output
(``registry.RESIDUAL_FAMILIES``) and from a C of its own where it lies
(``registry.C_TENSOR_FAMILIES``: the "copied" cases of dense row-major 2-D calls; empty on main
until these tests pass on a GPU).

Against a float64 reference of the same formula, within twice the error of torch's own unfused
path (``alpha * torch.matmul(a, b) + beta * c + bias``, then the activation) plus the fp32
accumulation bound where the output is fp32. Ragged shapes (C's edge subtiles, which TMA
clips), both schedules through ``auto``, swap-AB (C M-major), split-K and
stream-K (the epilogue once, after the fix-up), batched, ``out=c`` in place, a copied and a
broadcast ``c``, ``beta == 0`` with a NaN ``c`` (never read), and the signature's launcher on a
second call with new values of C.
"""

import random

import pytest
import torch
from operands import assert_within_torch_error, fp32_accumulation_bound, make

import wsgemm
from wsgemm import api
from wsgemm.api.epilogue import torch_activation

pytestmark = pytest.mark.gpu

DIMS = [1, 7, 8, 16, 31, 64, 97, 128, 129, 257, 383, 640, 1021]
CASES = 48


@pytest.fixture(autouse=True, scope="module")
def fusing():
    from wsgemm.host import registry

    saved = registry.FUSING_FAMILIES, registry.RESIDUAL_FAMILIES, registry.C_TENSOR_FAMILIES
    registry.FUSING_FAMILIES = registry.RESIDUAL_FAMILIES = registry.EPILOGUE_FAMILIES
    registry.C_TENSOR_FAMILIES = registry.EPILOGUE_FAMILIES
    api.DISPATCHER.forget()
    yield
    registry.FUSING_FAMILIES, registry.RESIDUAL_FAMILIES, registry.C_TENSOR_FAMILIES = saved
    api.DISPATCHER.forget()


def _cases(seed):
    rng = random.Random(seed)
    out = []
    for i in range(CASES):
        m, n, k = (rng.choice(DIMS) for _ in range(3))
        if i % 12 == 0:
            m, n, k = rng.choice([(2048, 1536, 1024), (1031, 2053, 777), (16, 4096, 4096)])
        out.append(dict(
            m=m, n=n, k=k, ab=(torch.float16, torch.bfloat16)[i % 2],
            out_dtype=None if i % 5 else torch.float32,
            alpha=rng.choice([1.0, 0.5, -2.0]), beta=rng.choice([1.0, 0.25, -1.0]),
            c_form=("in_place", "copied", "row", "column")[i % 4],
            act=(None, "silu", "gelu_tanh")[i % 3], bias=i % 2 == 0,
            a_col=rng.random() < 0.5, b_col=rng.random() < 0.5, batch=rng.random() < 0.25,
        ))  # fmt: skip
    return out


def check(case, gen, backend="auto", config=None):
    ab, m, n, k = case["ab"], case["m"], case["n"], case["k"]
    lead = (3,) if case["batch"] else ()
    a = make(lead + (m, k), ab, "cuda", col_major=case["a_col"], gen=gen)
    b = make((k, n), ab, "cuda", col_major=case["b_col"], gen=gen)
    want = case["out_dtype"] or ab
    shape = lead + (m, n)
    c_shape = {"in_place": shape, "copied": shape, "row": (n,), "column": (m, 1)}[case["c_form"]]
    bias = torch.randn(n, generator=gen).to(ab).cuda() if case["bias"] else None
    act, alpha, beta = case["act"], case["alpha"], case["beta"]
    kw = dict(out_dtype=case["out_dtype"], bias=bias, activation=act, alpha=alpha, beta=beta)
    call = wsgemm.matmul
    if config is not None:
        call, kw["backend"], kw["config"] = api.matmul, "sm90", config
    else:
        kw["backend"] = backend
    for _ in range(2):  # the second: the signature's launcher, new values of C
        c = torch.randn(c_shape, generator=gen).to(want).cuda()
        pre = alpha * torch.matmul(a.double(), b.double()) + beta * c.double()
        pre = pre + (0 if bias is None else bias.double())
        ref = torch_activation(act or "none", pre)
        theirs = (torch.matmul(a, b) if want != torch.float32 else
                  torch.matmul(a.float(), b.float())).to(want)  # fmt: skip
        theirs = alpha * theirs + beta * c + (0 if bias is None else bias.to(want))
        theirs = torch_activation(act or "none", theirs)
        if case["c_form"] == "in_place":
            out = c.clone()
            got = call(a, b, c=out, out=out, **kw)
            assert got is out
        else:
            kept = c.clone()
            got = call(a, b, c=c, **kw)
            assert torch.equal(c, kept), "c was written"  # read where it lies, never changed
        assert got.shape == ref.shape and got.dtype == want
        slack = fp32_accumulation_bound(a, b) * abs(alpha) if want == torch.float32 else 0.0
        assert_within_torch_error(got, ref, theirs, slack=slack * 1.2)


@pytest.mark.parametrize("index", range(CASES))
def test_fused_residual(index):
    check(_cases(5151)[index], torch.Generator().manual_seed(index))


@pytest.mark.parametrize("backend", ["sm90", "sm90-pingpong"])
@pytest.mark.parametrize("index", range(0, CASES, 3))
def test_fused_residual_named_backends(backend, index):
    check(_cases(5151)[index], torch.Generator().manual_seed(index), backend=backend)


@pytest.mark.parametrize("form", ["split_k", "stream_k", "swap_ab", "swap_ab_8"])
@pytest.mark.parametrize("index", range(0, CASES, 4))
def test_fused_residual_split_and_swap(form, index):
    from wsgemm.host import choosing
    from wsgemm.kernels.sm90.config import Sm90Config

    case = dict(_cases(5151)[index], batch=False)
    if form == "swap_ab":  # C M-major: the residual's vectors run along M
        config = choosing.entry("swap-cooperative-128x160-c2x1").variant_config()
    elif form == "swap_ab_8":  # 64 vectors a subtile for 128 threads
        config = choosing.entry("swap-pingpong-64x8x128-c1x1").variant_config()
    else:
        case["k"] = max(case["k"], 300)
        config = Sm90Config(split_k=3) if form == "split_k" else Sm90Config(stream_k=True)
    check(case, torch.Generator().manual_seed(index), config=config)


def test_beta_zero_never_reads_c():
    gen = torch.Generator().manual_seed(0)
    a = make((300, 200), torch.float16, "cuda", gen=gen)
    b = make((200, 260), torch.float16, "cuda", gen=gen)
    out = torch.full((300, 260), float("nan"), dtype=torch.float16, device="cuda")
    wsgemm.matmul(a, b, c=out, out=out, beta=0.0, alpha=2.0)
    assert not torch.isnan(out).any()
    ref = 2.0 * torch.matmul(a.double(), b.double())
    assert_within_torch_error(out, ref, 2.0 * torch.matmul(a, b))
