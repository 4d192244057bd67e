"""Tensor-core peaks per clock, so a result can be put against the clock it actually ran at.

A datasheet peak assumes one fixed boost clock; under a long GEMM the SM clock moves (our H200
ranges 1.2 to 1.98 GHz), so the benchmark reports the share of ``SMs x FLOP/clock/SM x the SM
clock NVML read during the measurement`` instead.
"""

from __future__ import annotations

# Dense fp16/bf16 tensor-core FLOP per clock per SM (fp32 or fp16 accumulation: the data-center
# parts below run both at one rate), keyed by compute capability, each derived from the
# vendor's dense peak at its quoted clock:
DENSE_FLOP_PER_CLOCK_PER_SM = {
    # A100 SXM: 312 TFLOP/s at 1410 MHz on 108 SMs -> 312e12 / (108 * 1.41e9) = 2049, i.e.
    # 4 tensor cores x 256 FMA x 2 FLOP.
    (8, 0): 2048,
    # H100/H200 SXM: 989.4 TFLOP/s at 1830 MHz on 132 SMs -> 989.4e12 / (132 * 1.83e9) = 4096,
    # i.e. 4 tensor cores x 512 FMA x 2 FLOP.
    (9, 0): 4096,
}
# Left out on purpose: sm_86 and sm_89 parts differ by product (GeForce runs fp32 accumulation
# at half the rate of the workstation parts), so one number per capability would mislead.


def flop_per_clock_per_sm(capability: tuple[int, int] | None) -> int | None:
    """The dense fp16/bf16 rate for a compute capability, or None when we do not know it."""
    if capability is None:
        return None
    return DENSE_FLOP_PER_CLOCK_PER_SM.get(tuple(capability))


def peak_tflops(sm_count: int, flop_per_clock: int | None, clock_mhz: float | None) -> float | None:
    """SMs x FLOP/clock/SM x clock, in TFLOP/s; None when either factor is unknown."""
    if not flop_per_clock or not clock_mhz or not sm_count:
        return None
    return sm_count * flop_per_clock * clock_mhz * 1e6 / 1e12


def pct_of_peak(tflops: float | None, peak: float | None) -> float | None:
    if tflops is None or not peak:
        return None
    return 100.0 * tflops / peak


# HBM bandwidth, TB/s (10^12 bytes/s), from the vendors' datasheets. Keyed by the product name
# the driver reports, not by compute capability as the tensor rate is: an H100 and an H200 are
# both sm_90 with 132 SMs, and differ only in their memory. Matched as a substring of the name,
# most specific first; a GPU matching none gets no % of HBM peak.
HBM_TBPS = (
    ("H200", 4.8),  # "NVIDIA H200": HBM3e, SXM and NVL
    ("H100 PCIe", 2.0),  # "NVIDIA H100 PCIe": HBM2e
    ("H100 80GB HBM3", 3.35),  # "NVIDIA H100 80GB HBM3": the SXM part
)


def hbm_tbps(gpu_name: str | None) -> float | None:
    """The datasheet HBM bandwidth of the GPU named ``gpu_name``, or None when we do not know."""
    if not gpu_name:
        return None
    return next((tbps for key, tbps in HBM_TBPS if key in gpu_name), None)


def ridge_flop_per_byte(
    sm_count: int | None,
    flop_per_clock: int | None,
    clock_mhz: float | None,
    tbps: float | None,
) -> float | None:
    """The roofline's ridge point: peak FLOP/s over peak bytes/s. A GEMM whose arithmetic
    intensity (FLOP per byte moved) is below it cannot reach the tensor peak even with every
    byte at full bandwidth: it is memory-bound. None when either peak is unknown."""
    peak = peak_tflops(sm_count or 0, flop_per_clock, clock_mhz)
    if peak is None or not tbps:
        return None
    return peak / tbps
