"""Checks of scalar arguments shared by the ops, the planner and the reference: one rule and
one message per kind of scalar, naming the argument and the value.

(The scheduler's own integers have a stricter rule, :func:`aiter_mla.ops.metadata_reference.check_int`:
no tensors, since its sizes become buffer shapes.)
"""
from __future__ import annotations

import math
import numbers
import operator

_FLOAT32_MAX = 3.4028234663852886e38


def require_int(name: str, value) -> int:
    """``value`` as an int: a Python or NumPy int, or a one-element integer tensor
    (``operator.index``). A bool, float, string, None or other tensor raises TypeError
    ``"{name} must be an int, got {value!r} ({type})"``."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    try:
        return operator.index(value)
    except TypeError:   # a float or many-element tensor has __index__ but refuses it
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})") from None


def require_bool(name: str, value) -> bool:
    """``value`` as a bool: a Python or NumPy bool. Anything else (an int, a string such as
    ``'no'``, None) raises TypeError ``"{name} must be a bool, got {type} {value!r}"``: read
    as truthy, ``'no'`` would switch the flag on."""
    if type(value) is bool:   # the common case (per-call paths)
        return value
    t = type(value)
    if t.__module__ == "numpy" and t.__name__ in ("bool", "bool_"):
        return bool(value)
    raise TypeError(f"{name} must be a bool, got {t.__name__} {value!r}")


def require_real(name: str, value, *, example: str = "", float32: bool = False) -> float:
    """``value`` as a float: a real number (Python or NumPy; not a bool, a string or a tensor)
    that is finite, and with ``float32`` also finite once stored as a C float (the kernels'
    launch fields: 1e39 would reach them as inf). TypeError / ValueError naming ``name``;
    ``example`` (e.g. ``"1/sqrt(576)"``) goes into the type message."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        eg = f" (e.g. {example})" if example else ""
        raise TypeError(f"{name} must be a float{eg}, got {type(value).__name__} {value!r}")
    v = float(value)
    if not math.isfinite(v) or (float32 and abs(v) > _FLOAT32_MAX):
        where = " within float32" if float32 and math.isfinite(v) else ""
        raise ValueError(f"{name} must be a finite number{where}, got {value!r}")
    return v
