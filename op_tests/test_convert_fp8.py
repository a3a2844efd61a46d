"""convert_fp8_to_bf16: the JIT's demo kernel end to end on the GPU (built, cached, loaded,
launched on torch's current stream, captured in a CUDA graph), checked against torch in
float32 (bit-exact: the same arithmetic) and float64 (within bf16 rounding).
Argument checks run on the CPU."""
from __future__ import annotations

import pytest
import torch

from aiter_mla.ops.convert import convert_fp8_to_bf16

gpu = pytest.mark.gpu


def _rand_fp8(shape, gen, device="cuda"):
    """Every byte value, NaN codes (0x7f, 0xff) included."""
    codes = torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8)
    return codes.view(torch.float8_e4m3fn).to(device)


def _check(x, scale, y):
    ref32 = (x.float() * scale).to(torch.bfloat16)
    same = (y.view(torch.int16) == ref32.view(torch.int16)) | (torch.isnan(y) & torch.isnan(ref32))
    assert bool(same.all()), f"{int((~same).sum())} of {y.numel()} differ from torch float32"
    ref64 = x.double() * scale.double()
    finite = torch.isfinite(ref64)
    assert torch.equal(torch.isnan(y), torch.isnan(ref64))
    err = (y.double() - ref64).abs()[finite]
    tol = ref64.abs()[finite] * 2.0 ** -8 + 1e-38  # half a bf16 ulp, plus the f32 step
    assert bool((err <= tol).all()), f"max err {float(err.max())} vs float64"


@gpu
@pytest.mark.parametrize("shape", [(0,), (1,), (255,), (257,), (3, 5, 577), (1 << 20) + 3])
@pytest.mark.parametrize("scale_value", [1.0, 0.3700000047683716, 1e-3, 1024.0])
def test_matches_torch(shape, scale_value):
    gen = torch.Generator().manual_seed(hash((shape, scale_value)) % (1 << 31))
    shape = shape if isinstance(shape, tuple) else (shape,)
    x = _rand_fp8(shape, gen)
    scale = torch.tensor([scale_value], dtype=torch.float32, device="cuda")
    y = convert_fp8_to_bf16(x, scale)
    torch.cuda.synchronize()
    assert y.shape == x.shape and y.dtype == torch.bfloat16
    _check(x, scale, y)


@gpu
def test_grid_stride_past_the_grid_cap():
    n = 65535 * 8 * 256 + 4099  # more elements than one pass of the capped grid covers
    gen = torch.Generator().manual_seed(7)
    x = _rand_fp8((n,), gen)
    scale = torch.tensor([0.5], dtype=torch.float32, device="cuda")
    y = torch.full((n,), float("nan"), dtype=torch.bfloat16, device="cuda")
    convert_fp8_to_bf16(x, scale, out=y)
    torch.cuda.synchronize()
    _check(x[-100000:], scale, y[-100000:])
    _check(x[:100000], scale, y[:100000])


@gpu
def test_runs_on_the_current_stream_and_in_a_cuda_graph():
    gen = torch.Generator().manual_seed(3)
    n = 1 << 16
    x = _rand_fp8((n,), gen)
    scale = torch.tensor([2.0], dtype=torch.float32, device="cuda")
    out = torch.full((n,), float("nan"), dtype=torch.bfloat16, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        convert_fp8_to_bf16(x, scale, out=out)  # warm-up: build/load outside capture
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            convert_fp8_to_bf16(x, scale, out=out)
    torch.cuda.synchronize()
    for seed, sc in ((11, 0.25), (12, 3.0)):  # new inputs, same buffers: replay reads them
        x.copy_(_rand_fp8((n,), torch.Generator().manual_seed(seed)))
        scale.fill_(sc)
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        _check(x, scale, out)


@pytest.mark.parametrize("make,exc,needle", [
    (lambda: (torch.zeros(4, dtype=torch.float8_e4m3fn), torch.ones(1)), ValueError,
     "x must be a CUDA tensor"),
    (lambda: (torch.zeros(4), torch.ones(1)), TypeError, "x must be torch.float8_e4m3fn"),
    (lambda: ([1, 2], torch.ones(1)), TypeError, "x must be a torch.Tensor"),
])
def test_argument_errors_on_cpu(make, exc, needle):
    x, scale = make()
    with pytest.raises(exc, match=needle):
        convert_fp8_to_bf16(x, scale)


@gpu
@pytest.mark.parametrize("case,exc,needle", [
    ("scale_float", TypeError, "scale must be a float32 tensor"),
    ("scale_dtype", TypeError, "scale must be torch.float32"),
    ("scale_numel", ValueError, "scale must be one element, got 2"),
    ("scale_cpu", ValueError, "scale must be on cuda"),
    ("x_strided", ValueError, "x must be contiguous"),
    ("out_shape", ValueError, "out must be shape"),
    ("out_dtype", TypeError, "out must be torch.bfloat16"),
])
def test_argument_errors_on_gpu(case, exc, needle):
    x = torch.zeros(8, 8, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
    scale = torch.ones(1, device="cuda")
    out = None
    if case == "scale_float":
        scale = 1.0
    elif case == "scale_dtype":
        scale = torch.ones(1, device="cuda", dtype=torch.float64)
    elif case == "scale_numel":
        scale = torch.ones(2, device="cuda")
    elif case == "scale_cpu":
        scale = torch.ones(1)
    elif case == "x_strided":
        x = x.t()
    elif case == "out_shape":
        out = torch.empty(64, dtype=torch.bfloat16, device="cuda")
    elif case == "out_dtype":
        out = torch.empty(8, 8, dtype=torch.float16, device="cuda")
    with pytest.raises(exc, match=needle):
        convert_fp8_to_bf16(x, scale, out=out)
