"""SM clock (MHz) and board power (W) of one GPU, sampled in the background while a row's decode
is timed (:mod:`.sweep`): ``row["clock_mhz"] = {"min", "median"}``, ``row["power_w"] =
{"median", "max"}`` and ``row["gpu_samples"]`` (how many samples those come from).

The source is ``pynvml`` (the nvidia-ml-py package; ``torch.cuda.clock_rate`` and
``power_draw`` use it too), polled from a thread every 10 ms plus once when the window closes.
Without it the rows hold None and the bench adds a note.

Power is NVML's instant reading where the driver offers it (``NVML_FI_DEV_POWER_INSTANT``),
else ``nvmlDeviceGetPowerUsage``, which on recent GPUs averages over up to a second: on a row
shorter than that it lags. The GPU is named by PCI bus id when torch reports one
(``get_device_properties().pci_bus_id``, torch >= 2.5), else by torch's index, which is NVML's
only without a reordering ``CUDA_VISIBLE_DEVICES``.
"""
from __future__ import annotations

import statistics
import threading
from contextlib import contextmanager

NVML_INTERVAL_S = 0.01
#: Field id of NVML's instant power reading (nvml.h NVML_FI_DEV_POWER_INSTANT).
NVML_FI_DEV_POWER_INSTANT = 186


def summarize(samples: list[tuple[float | None, float | None]]) -> dict:
    """``{"clock_mhz": {"min", "median"} or None, "power_w": {"median", "max"} or None,
    "gpu_samples": n}`` of (clock MHz, power W) samples; None entries are skipped."""
    clocks = [c for c, _ in samples if c is not None]
    watts = [w for _, w in samples if w is not None]
    return {
        "clock_mhz": {"min": min(clocks), "median": statistics.median(clocks)} if clocks else None,
        "power_w": {"median": statistics.median(watts), "max": max(watts)} if watts else None,
        "gpu_samples": len(samples),
    }


def nvml_id(device_index: int) -> str:
    """How NVML and ``nvidia-smi -i`` name torch's CUDA device ``device_index``: its PCI bus id
    (``"00000000:18:00.0"``) when torch reports it, else the index as a string."""
    import torch

    props = torch.cuda.get_device_properties(device_index)
    try:
        return f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0"
    except AttributeError:
        return str(device_index)


class Sampler:
    """Samples one GPU between :meth:`start` and :meth:`stop`; reusable, one window at a time.

    ``gpu``: a PCI bus id or NVML index (:func:`nvml_id`). ``.source`` is "pynvml", or None
    when pynvml cannot be imported or cannot read that GPU (:meth:`stop` then returns Nones).
    """

    def __init__(self, gpu: str):
        self.gpu = gpu
        self._handle = None
        self._thread = None
        self._samples: list = []
        self._stop = threading.Event()
        self.source = "pynvml" if self._open_nvml() else None

    def _open_nvml(self) -> bool:
        try:
            import pynvml

            pynvml.nvmlInit()
            if ":" in self.gpu:
                self._handle = pynvml.nvmlDeviceGetHandleByPciBusId(self.gpu)
            else:
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(int(self.gpu))
            self._nvml = pynvml
            self._nvml_sample()   # fails here, not in the thread, if the GPU cannot be read
            return True
        except Exception:  # not installed, no driver, no such GPU: not sampled
            self._handle = None
            return False

    def _nvml_sample(self) -> tuple[float, float]:
        nv, h = self._nvml, self._handle
        clock = float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
        mw = None
        try:
            field = nv.nvmlDeviceGetFieldValues(h, [NVML_FI_DEV_POWER_INSTANT])[0]
            if field.nvmlReturn == 0:
                mw = field.value.uiVal
        except Exception:  # an older driver or nvidia-ml-py without field values
            pass
        if mw is None:
            mw = nv.nvmlDeviceGetPowerUsage(h)
        return clock, mw / 1000.0

    def start(self) -> None:
        """Open a window: start the polling thread. No-op without a source."""
        self._samples = []
        self._stop.clear()
        if self.source is None:
            return
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(NVML_INTERVAL_S):
            try:
                self._samples.append(self._nvml_sample())
            except Exception:  # the GPU stopped answering: the window keeps what it has
                return

    def stop(self) -> dict:
        """Close the window; :func:`summarize` of the samples taken in it (Nones and 0 samples
        without a source)."""
        if self.source is not None:
            self._stop.set()
            self._thread.join()
            try:
                self._samples.append(self._nvml_sample())
            except Exception:  # as in _poll
                pass
        return summarize(list(self._samples))


NO_SOURCE_NOTE = ("SM clock and board power not recorded: pynvml (pip install nvidia-ml-py) "
                  "is not importable or cannot read this GPU")


@contextmanager
def sampled(sampler: Sampler | None):
    """``with sampled(s) as out:`` fills ``out`` with :meth:`Sampler.stop`'s summary on exit
    (also when the block raises); ``out`` holds Nones and 0 samples for ``sampler=None`` or a
    sampler without a source."""
    out = summarize([])
    if sampler is None or sampler.source is None:
        yield out
        return
    sampler.start()
    try:
        yield out
    finally:
        out.update(sampler.stop())


