"""SM clock (MHz) and board power (W) of one GPU, sampled in the background while a row's decode
is timed (:mod:`.sweep`): ``row["clock_mhz"] = {"min", "median"}``, ``row["power_w"] =
{"median", "max"}`` and ``row["gpu_samples"]`` (how many samples those come from).

Sources, in order: ``pynvml`` (the nvidia-ml-py package; ``torch.cuda.clock_rate`` and
``power_draw`` use it too), polled from a thread every 10 ms plus once when the window closes;
else an ``nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits -lms 50``
process started for the window and stopped after it (its first line is awaited, and dropped,
before the window opens; if no line came during the window, the next one is awaited, so a row
shorter than the interval still gets a sample); else none (the rows hold None and the bench
adds a note).

Power is NVML's instant reading where the driver offers it (``NVML_FI_DEV_POWER_INSTANT``),
else ``nvmlDeviceGetPowerUsage`` and nvidia-smi's ``power.draw``, which on recent GPUs average
over up to a second: on a row shorter than that they lag. The GPU is named by PCI bus id when
torch reports one (``get_device_properties().pci_bus_id``, torch >= 2.5), else by torch's index,
which is NVML's only without a reordering ``CUDA_VISIBLE_DEVICES``.
"""
from __future__ import annotations

import shutil
import statistics
import subprocess
import threading
from contextlib import contextmanager

NVML_INTERVAL_S = 0.01
SMI_INTERVAL_MS = 50
SMI_QUERY = "clocks.sm,power.draw"
#: Field id of NVML's instant power reading (nvml.h NVML_FI_DEV_POWER_INSTANT).
NVML_FI_DEV_POWER_INSTANT = 186


def parse_smi_line(line: str) -> tuple[float | None, float | None] | None:
    """``"1980, 412.35"`` (clock MHz, power W: nvidia-smi csv, noheader, nounits) ->
    ``(1980.0, 412.35)``; a field that reads ``[N/A]`` or similar is None; a line that is not
    two comma-separated fields, or has no number at all, gives None."""
    parts = [p.strip() for p in line.strip().split(",")]
    if len(parts) != 2:
        return None
    values = []
    for p in parts:
        try:
            values.append(float(p))
        except ValueError:
            values.append(None)
    return None if values == [None, None] else (values[0], values[1])


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

    ``gpu``: a PCI bus id or NVML index (:func:`nvml_id`). ``source``: "auto" (pynvml, else
    nvidia-smi, else None), or one of "pynvml", "nvidia-smi", None to force it; ``.source``
    then says which one is used (None: :meth:`stop` returns Nones). ``smi_command``: the
    nvidia-smi argv prefix (tests pass a stand-in that prints canned lines).
    """

    def __init__(self, gpu: str, source: str | None = "auto", smi_command: list[str] | None = None):
        self.gpu = gpu
        self.smi_command = smi_command or ["nvidia-smi"]
        self._handle = None
        self._thread = None
        self._proc = None
        self._samples: list = []
        self._reader_done = False
        self._stop = threading.Event()
        self._lines = threading.Condition()
        if source == "auto":
            if self._open_nvml():
                source = "pynvml"
            else:
                source = "nvidia-smi" if shutil.which("nvidia-smi") else None
        elif source == "pynvml" and not self._open_nvml():
            source = None
        self.source = source

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
        except Exception:  # not installed, no driver, no such GPU: try the next source
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
        """Open a window: start the polling thread or the nvidia-smi process (waiting, up to
        5 s, for its first line, which is not kept). No-op without a source."""
        self._samples = []
        self._reader_done = False
        self._stop.clear()
        if self.source == "pynvml":
            self._thread = threading.Thread(target=self._poll, daemon=True)
        elif self.source == "nvidia-smi":
            self._proc = subprocess.Popen(
                [*self.smi_command, f"--query-gpu={SMI_QUERY}", "--format=csv,noheader,nounits",
                 "-lms", str(SMI_INTERVAL_MS), "-i", self.gpu],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self._thread = threading.Thread(target=self._read, daemon=True)
        else:
            return
        self._thread.start()
        if self.source == "nvidia-smi":
            self._wait_lines(1, 5.0)
            with self._lines:
                self._samples.clear()

    def _poll(self) -> None:
        while not self._stop.wait(NVML_INTERVAL_S):
            try:
                self._samples.append(self._nvml_sample())
            except Exception:  # the GPU stopped answering: the window keeps what it has
                return

    def _read(self) -> None:
        for line in self._proc.stdout:
            parsed = parse_smi_line(line)
            if parsed is not None:
                with self._lines:
                    self._samples.append(parsed)
                    self._lines.notify_all()
        with self._lines:   # nvidia-smi ended (stopped, or failed): no one waits for more lines
            self._reader_done = True
            self._lines.notify_all()

    def _wait_lines(self, n: int, timeout_s: float) -> None:
        with self._lines:
            self._lines.wait_for(lambda: len(self._samples) >= n or self._reader_done,
                                 timeout=timeout_s)

    def stop(self) -> dict:
        """Close the window; :func:`summarize` of the samples taken in it (Nones and 0 samples
        without a source, or if nvidia-smi printed nothing)."""
        if self.source == "pynvml":
            self._stop.set()
            self._thread.join()
            try:
                self._samples.append(self._nvml_sample())
            except Exception:  # as in _poll
                pass
        elif self.source == "nvidia-smi":
            self._wait_lines(1, 4 * SMI_INTERVAL_MS / 1000.0)
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._thread.join(timeout=5)
            self._proc.stdout.close()
            self._proc = None
        with self._lines:
            return summarize(list(self._samples))


NO_SOURCE_NOTE = ("SM clock and board power not recorded: neither pynvml (nvidia-ml-py) nor "
                  "nvidia-smi is available")


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


