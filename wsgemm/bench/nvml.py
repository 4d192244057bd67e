"""SM clock and board power from NVML (``nvidia-ml-py``), sampled while a measurement runs.

Every function degrades to None when NVML is missing or refuses a query: a benchmark without
clock readings is still a benchmark, it only loses its %-of-peak column.
"""

from __future__ import annotations

import statistics
import threading
import time


class Nvml:
    """One GPU's NVML handle; ``Nvml.open(index)`` returns None when NVML is unavailable."""

    def __init__(self, pynvml, handle):
        self._nvml = pynvml
        self._handle = handle

    @classmethod
    def open(cls, device_index: int) -> Nvml | None:
        try:
            import pynvml

            pynvml.nvmlInit()
            # NVML counts every GPU; honour CUDA_VISIBLE_DEVICES by matching the PCI bus id.
            handle = _handle_for_cuda_device(pynvml, device_index)
        except Exception:
            return None
        return cls(pynvml, handle)

    def _query(self, fn, *args):
        try:
            return fn(self._handle, *args)
        except Exception:
            return None

    def sm_clock_mhz(self) -> float | None:
        value = self._query(self._nvml.nvmlDeviceGetClockInfo, self._nvml.NVML_CLOCK_SM)
        return None if value is None else float(value)

    def power_w(self) -> float | None:
        # On recent drivers this is a ~1 s moving average of board power, not an instant value.
        value = self._query(self._nvml.nvmlDeviceGetPowerUsage)
        return None if value is None else value / 1000.0

    def info(self) -> dict:
        """Static facts for the record's header."""
        n = self._nvml

        def mhz(fn, clock):
            value = self._query(fn, clock)
            return None if value is None else float(value)

        limit = self._query(n.nvmlDeviceGetEnforcedPowerLimit)
        try:
            driver = n.nvmlSystemGetDriverVersion()
            driver = driver.decode() if isinstance(driver, bytes) else str(driver)
        except Exception:
            driver = None
        return {
            "driver": driver,
            "sm_max_mhz": mhz(n.nvmlDeviceGetMaxClockInfo, n.NVML_CLOCK_SM),
            "mem_max_mhz": mhz(n.nvmlDeviceGetMaxClockInfo, n.NVML_CLOCK_MEM),
            "sm_at_start_mhz": self.sm_clock_mhz(),
            "power_limit_w": None if limit is None else limit / 1000.0,
        }


def _handle_for_cuda_device(pynvml, device_index: int):
    import torch

    props = torch.cuda.get_device_properties(device_index)
    bus = getattr(props, "pci_bus_id", None)
    domain = getattr(props, "pci_domain_id", None)
    device = getattr(props, "pci_device_id", None)
    if bus is not None and domain is not None and device is not None:
        try:
            return pynvml.nvmlDeviceGetHandleByPciBusId(f"{domain:08X}:{bus:02X}:{device:02X}.0")
        except Exception:
            pass
    return pynvml.nvmlDeviceGetHandleByIndex(device_index)


class ClockSampler:
    """Reads the SM clock and power every ``period_s`` on a thread between ``start`` and ``stop``.

    ``stop`` returns the medians of what it read (at least one reading, taken at stop), so a
    measurement reports the clock it ran at rather than one read before or after it.
    """

    def __init__(self, nvml: Nvml | None, period_s: float = 0.001):
        self._nvml = nvml
        self._period = period_s
        self._clocks: list[float] = []
        self._powers: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._clocks, self._powers = [], []
        if self._nvml is None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def stop(self) -> tuple[float | None, float | None]:
        if self._nvml is None:
            return None, None
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._read()
        return _median(self._clocks), _median(self._powers)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._read()
            time.sleep(self._period)

    def _read(self) -> None:
        clock, power = self._nvml.sm_clock_mhz(), self._nvml.power_w()
        if clock is not None:
            self._clocks.append(clock)
        if power is not None:
            self._powers.append(power)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None
