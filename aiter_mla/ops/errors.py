"""Bad index values found on the device, and how they reach the caller (docs/DESIGN.md §5.13).

The decode kernel checks every index it reads (the batch layout, the schedule's records, the
page ids in use) against the buffers it was given and goes on safely: it never reads through a
page id outside the pool (the cp.async loader zero-fills that row, the TMA loader reads the last
page instead) and skips a work record that points outside its buffers. It writes the first bad
value it met into this device's *error record*: int64 words (code, index, value,
bound) in pinned host memory that the kernel writes through the mapped address (CUDA's unified
addressing: the host pointer of ``cudaHostAlloc`` memory is its device pointer), plus device
words that let one thread claim a slot. Two slots: the inputs' own values (the batch layout and
the page ids), then the schedule's records, whose errors usually follow from a bad layout; the
first is reported first. Reading the record costs the host a memory load, no synchronisation.

The cache-append kernel (``concat_and_cache_mla``) checks its ``slot_mapping`` the same way.

When it surfaces: at the first ``aiter_mla`` op call on that device (``mla_decode_fwd``,
``hk_mla_decode_fwd``, ``mla_reduce_v1``, ``get_mla_metadata_v1``, ``concat_and_cache_mla``)
that starts after the faulty kernel finished, or at :func:`check_errors`, which waits for the device first. The op
raises :class:`DeviceIndexError` (a ValueError) naming the argument, the entry, its value and
the bound, and clears the record. The outputs of the call that launched the faulty kernel are
not valid; the call raising the error launches nothing. The record is made at the first op
call on a device, which must run outside a CUDA graph capture (RuntimeError otherwise).
"""
from __future__ import annotations

import ctypes

from ..locks import ForkSafeLock
from ..work_info import DEVICE_ERRORS, ERROR_SLOT_WORDS, ERROR_SLOTS

__all__ = ["DeviceIndexError", "check_errors"]

#: The message of each code (work_info.DEVICE_ERRORS order), formatted with index, next
#: (index + 1), value and bound. Every message names the argument and its entry.
_MESSAGES = {
    "kv_index": "kv_indices[{index}] = {value} is outside [0, num_pages={bound})",
    "qo_indptr_start": "qo_indptr[0] must be 0, got {value}",
    "qo_indptr_end": "qo_indptr[-1] must equal the q rows (query.shape[0] = {bound}), got {value}",
    "qo_indptr_order": "qo_indptr must be non-decreasing: qo_indptr[{next}] = {value} < "
                       "qo_indptr[{index}] = {bound}",
    "q_too_long": "max_seqlen_q = {bound} must be >= every q length (qo_indptr[b + 1] - "
                  "qo_indptr[b]); batch {index} has {value}",
    "kv_indptr_start": "kv_indptr[0] must be 0, got {value}",
    "kv_indptr_order": "kv_indptr must be non-decreasing: kv_indptr[{next}] = {value} < "
                       "kv_indptr[{index}] = {bound}",
    "kv_indptr_end": "kv_indptr[-1] = {value} exceeds len(kv_indices) = {bound}",
    "last_page_len": "kv_last_page_lens[{index}] = {value} must be in [1, page_size={bound}] for a "
                     "batch with pages",
    "slot_mapping": "slot_mapping[{index}] = {value} is past the kv_cache's {bound} token slots "
                    "(num_pages x page_size; negative slots are padding and skipped)",
    "work_indptr_range": "work_indptr[{index}] = {value} is outside [0, num_works={bound}] (the rows "
                         "of work_info_set)",
    "work_lists_unrun": "work_indptr[{index}] = {value} must equal work_indptr[-1] = {bound}: the "
                        "launch runs arch.num_clusters = {index} work lists, and works past them "
                        "would never run (a schedule planned for another list count or CU_NUM?)",
    "work_batch": "work_info_set[{index}] has batch_idx = {value}, outside [0, batch={bound}) (a "
                  "schedule planned for another batch layout?)",
    "work_qo": "work_info_set[{index}] covers q rows up to {value}, past the {bound} rows of query "
               "(qo_indptr[-1] must equal query.shape[0]; or a schedule planned for another "
               "batch layout?)",
    "work_kv": "work_info_set[{index}] covers pages up to {value}, past len(kv_indices) = {bound} "
               "(a schedule planned for another batch layout?)",
    "work_split": "work_info_set[{index}] writes split rows up to {value}, past the {bound} token "
                  "rows of split_output (a schedule planned for other buffers?)",
}
assert tuple(_MESSAGES) == DEVICE_ERRORS


class DeviceIndexError(ValueError):
    """A bad index value the decode kernel found (module docstring: when it surfaces).

    Attributes: ``code`` the check (a name of ``work_info.DEVICE_ERRORS``); ``index``,
    ``value``, ``bound`` what it saw; ``device`` the CUDA device index; ``argument`` the input
    the message names first (``kv_indices``, ``qo_indptr``, ``work_info_set``, ...; for a batch
    longer than ``max_seqlen_q``, ``max_seqlen_q``). Picklable, so it crosses process
    boundaries."""

    def __init__(self, message: str, *, code: str = "", index: int = 0, value: int = 0,
                 bound: int = 0, device: int = -1):
        super().__init__(message)
        self.code, self.index, self.value, self.bound, self.device = code, index, value, bound, device
        self.argument = message.split("[", 1)[0].split(" ", 1)[0]

    def __reduce__(self):
        return (_rebuild, (self.args[0] if self.args else "", self.code, self.index, self.value,
                           self.bound, self.device))


def _rebuild(message, code, index, value, bound, device) -> DeviceIndexError:
    return DeviceIndexError(message, code=code, index=index, value=value, bound=bound, device=device)


class Sink:
    """One device's error record: ``claim`` (device int32 per slot), ``record`` (pinned int64
    words, slot after slot), ``words`` (a ctypes view of the record for the host's reads) and
    their addresses. ``words[0]`` / ``words[ERROR_SLOT_WORDS]``: the slots' codes (0: none).
    ``split_heavy_tiles``: a ctypes int32 the metadata kernel writes (``hint``, pinned)."""

    __slots__ = ("device", "claim", "record", "words", "claim_ptr", "record_ptr", "hint",
                 "split_heavy_tiles", "split_heavy_tiles_ptr")

    def __init__(self, device: int):
        import torch

        with torch.cuda.device(device):
            if torch.cuda.is_current_stream_capturing():   # the zeroing would only be captured
                raise RuntimeError(
                    f"aiter_mla: the first op call on cuda:{device} is inside a CUDA graph capture; "
                    "run one call outside the capture first (warm-up): it makes the device's error "
                    "record")
        self.device = device
        n = ERROR_SLOTS * ERROR_SLOT_WORDS
        self.claim = torch.zeros(ERROR_SLOTS, dtype=torch.int32, device=f"cuda:{device}")
        self.record = torch.zeros(n, dtype=torch.int64, pin_memory=True)
        self.words = (ctypes.c_int64 * n).from_address(self.record.data_ptr())
        self.claim_ptr = self.claim.data_ptr()
        self.record_ptr = self.record.data_ptr()
        # Beside the record, for the same reasons (pinned, written through its mapped address,
        # read without a sync, never freed while a kernel may still write it): the metadata
        # kernel's count of split-heavy tiles in the last schedule it made on this device, the
        # decode op's hint for where the split merge runs (ops/decode.py).
        self.hint = torch.zeros(1, dtype=torch.int32, pin_memory=True)
        self.split_heavy_tiles = ctypes.c_int32.from_address(self.hint.data_ptr())
        self.split_heavy_tiles_ptr = self.hint.data_ptr()

    def raise_pending(self) -> None:
        """Raise the recorded error, if any, and clear the record (the claim is cleared on the
        current stream, after the kernels already queued)."""
        w = self.words
        if not (w[0] or w[ERROR_SLOT_WORDS]):
            return
        base = 0 if w[0] else ERROR_SLOT_WORDS   # the inputs' own values first
        code, index, value, bound = w[base], w[base + 1], w[base + 2], w[base + 3]
        for slot in range(ERROR_SLOTS):
            w[slot * ERROR_SLOT_WORDS] = 0
        self.claim.zero_()
        name = DEVICE_ERRORS[code - 1] if 1 <= code <= len(DEVICE_ERRORS) else None
        if name is None:
            raise RuntimeError(f"aiter_mla: unknown device error code {code} on cuda:{self.device}")
        text = _MESSAGES[name].format(index=index, next=index + 1, value=value, bound=bound)
        raise DeviceIndexError(
            f"{text} (found by the {'cache-append' if name == 'slot_mapping' else 'mla decode'} "
            f"kernel on cuda:{self.device}; that call's outputs are not valid)", code=name, index=index, value=value, bound=bound, device=self.device)


_sinks: dict[int, Sink] = {}
_lock = ForkSafeLock()


def sink(device: int) -> Sink:
    """The error record of CUDA device ``device`` (made on first use)."""
    s = _sinks.get(device)
    if s is None:
        with _lock:
            s = _sinks.get(device)
            if s is None:
                s = _sinks[device] = Sink(device)
    return s


def visible_index(d, device, who: str = "") -> int:
    """The index of the CUDA ``torch.device`` ``d`` (the current device when it names none),
    after ``torch.cuda.is_available()`` was checked. ValueError naming ``device`` (the caller's
    value, in its message; ``who`` its prefix) when the index is not a visible device."""
    import torch

    index = d.index if d.index is not None else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise ValueError(f"{who}device must be a visible CUDA device (0..{torch.cuda.device_count() - 1}), "
                         f"got {device!r}")
    return index


def check_errors(device=None) -> None:
    """Wait for the device, then raise what its kernels found (:class:`DeviceIndexError`).

    ``device``: a CUDA device (index, ``torch.device`` or string) or None for every device an
    op ran on in this process. Returns None when no error was recorded. Without it, an error
    surfaces at the next op call on that device (the module docstring). Costs a device
    synchronisation: call it where the engine synchronises anyway, or in tests.

    Raises :class:`DeviceIndexError`; ValueError when ``device`` is not a CUDA device or not a
    visible one; RuntimeError when a ``device`` is named and no CUDA device is visible at all
    (with ``device=None`` and no op run yet, there is nothing to check: it returns None).
    """
    import torch

    if device is None:
        devices = sorted(_sinks)
    else:
        try:
            if isinstance(device, bool) or isinstance(device, float):
                raise TypeError
            d = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        except (TypeError, RuntimeError, ValueError):
            raise ValueError(f"device must be a CUDA device (an index >= 0, 'cuda:N' or a "
                             f"torch.device), got {device!r}") from None
        if d.type != "cuda":
            raise ValueError(f"device must be a CUDA device, got {d}")
        if not torch.cuda.is_available():
            raise RuntimeError(f"check_errors({device!r}): no CUDA device is visible")
        devices = [visible_index(d, device)]
    for index in devices:
        torch.cuda.synchronize(index)
        s = _sinks.get(index)
        if s is not None:
            s.raise_pending()
