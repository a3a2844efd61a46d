"""jit_config.json schema validation and rendering (StrictUndefined, parameter errors)."""
from __future__ import annotations

import json

import pytest

from aiter_mla import paths
from aiter_mla.jit.config import ConfigError, ParamError, load_config, validate
from aiter_mla.jit.render import RenderError, render

PIN = "a5e308a7ec633b1e94a952de629f41653a0874f3"


def real_raw() -> dict:
    return json.loads(paths.JIT_CONFIG_PATH.read_text())


def test_repository_config_is_valid():
    cfg = load_config(paths.JIT_CONFIG_PATH)
    assert set(cfg.modules) >= {"convert_fp8", "mla_metadata", "mla_decode", "mla_reduce"}
    hk = cfg.third_party["HipKittens"]
    assert hk.commit == PIN and hk.url.endswith("HipKittens.git")
    for m in cfg.modules.values():
        assert m.default_variants, f"{m.name} has no default variants"
        for v in m.default_variants:
            m.check_params(v)


def test_decode_default_variants_are_what_the_op_picks():
    """``jit build --all`` pre-builds the decode variants that ``mla_decode_fwd`` picks for the
    main shapes at page 64 (128 / 64 / 16 heads, fp8 and bf16), so a change of
    ``decode.mainloop_for`` must come with jit_config.json's default_variants."""
    import torch

    from aiter_mla.ops import decode

    defaults = [dict(v) for v in load_config(paths.JIT_CONFIG_PATH).modules["mla_decode"].default_variants]
    for heads in (128, 64, 16):
        for dt in (torch.float8_e4m3fn, torch.bfloat16):
            v = decode.decode_variant(heads, 1, 64, dt, dt)
            assert v in defaults, f"({heads},1) {dt}: {v} is not in jit_config.json's default_variants"


def _bad(mutate):
    raw = real_raw()
    mutate(raw)
    with pytest.raises(ConfigError) as ei:
        validate(raw)
    return str(ei.value)


@pytest.mark.parametrize("mutate,needles", [
    (lambda r: r.pop("modules"), ["modules", "missing"]),
    (lambda r: r.update(extra=1), ["extra", "unknown key"]),
    (lambda r: r.update(schema_version=7), ["schema_version", "7"]),
    (lambda r: r["third_party"]["HipKittens"].update(commit="abc123"),
     ["third_party.HipKittens.commit", "'abc123'"]),
    (lambda r: r["third_party"]["HipKittens"].update(commit=PIN.upper()),
     ["third_party.HipKittens.commit", PIN.upper()]),
    (lambda r: r["modules"]["convert_fp8"]["params"]["arch"].append("sm_80"),
     ["modules.convert_fp8.params.arch[3]", "'sm_80'"]),
    (lambda r: r["modules"]["convert_fp8"]["params"].pop("arch"),
     ["modules.convert_fp8.params.arch", "missing"]),
    (lambda r: r["modules"]["convert_fp8"]["params"].update(out_dtype=[]),
     ["modules.convert_fp8.params.out_dtype", "[]"]),
    (lambda r: r["modules"]["convert_fp8"]["params"].update(out_dtype=["bf16", 1.5]),
     ["modules.convert_fp8.params.out_dtype[1]", "1.5"]),
    (lambda r: r["modules"]["convert_fp8"]["default_variants"][0].update(out_dtype="fp16"),
     ["modules.convert_fp8.default_variants[0].out_dtype", "'fp16'", "'bf16'"]),
    (lambda r: r["modules"]["convert_fp8"]["default_variants"][0].pop("out_dtype"),
     ["modules.convert_fp8.default_variants[0].out_dtype", "missing"]),
    (lambda r: r["modules"]["convert_fp8"]["params"].update(block_m=[64, 128]) or
     r["modules"]["convert_fp8"]["default_variants"][0].update(block_m="64"),
     ["modules.convert_fp8.default_variants[0].block_m", "'64'"]),
    (lambda r: r["modules"]["convert_fp8"].update(third_party=["CK"]),
     ["modules.convert_fp8.third_party[0]", "'CK'"]),
    (lambda r: r["modules"]["convert_fp8"].update(experimental="no"),
     ["modules.convert_fp8.experimental", "'no'"]),
    (lambda r: r["modules"]["convert_fp8"]["flags"].update(gcc=[]),
     ["modules.convert_fp8.flags.gcc", "unknown key"]),
    (lambda r: r["modules"]["convert_fp8"]["flags"].update(nvcc=["-O3", ""]),
     ["modules.convert_fp8.flags.nvcc[1]", "''"]),
    (lambda r: r["modules"]["convert_fp8"].update(template="../x.j2"),
     ["modules.convert_fp8.template", "'../x.j2'"]),
    (lambda r: r["toolchains"]["nvcc"].update(flags="-O3"),
     ["toolchains.nvcc.flags", "'-O3'"]),
    (lambda r: r["modules"].update({"Bad-Name": r["modules"]["convert_fp8"]}),
     ["modules.Bad-Name", "'Bad-Name'"]),
])
def test_validation_errors_name_key_and_value(mutate, needles):
    msg = _bad(mutate)
    for n in needles:
        assert n in msg, f"{n!r} not in {msg!r}"


def test_check_params_errors_list_allowed_values():
    raw = real_raw()
    raw["modules"] = {"dec": {
        "template": "dec.cu.j2",
        "params": {"arch": ["sm_90a"], "block_m": [64, 128], "page_size": [1, 2, 4, 64],
                   "mask": ["none", "causal"]},
        "default_variants": [{"arch": "sm_90a", "block_m": 128, "page_size": 64, "mask": "none"}],
        "flags": {}, "third_party": [], "experimental": False}}
    m = validate(raw).module("dec")
    full = dict(m.default_variants[0])
    with pytest.raises(ParamError, match=r"missing parameter\(s\) page_size.*allowed: 1, 2, 4"):
        m.check_params({k: v for k, v in full.items() if k != "page_size"})
    with pytest.raises(ParamError, match=r"block_m=96 is not allowed; allowed: 64, 128"):
        m.check_params({**full, "block_m": 96})
    with pytest.raises(ParamError, match=r"block_m='64' \(a str; the allowed values are int\) is not allowed"):
        m.check_params({**full, "block_m": "64"})
    with pytest.raises(ParamError, match=r"block_m=True is not allowed"):
        m.check_params({**full, "block_m": True})
    with pytest.raises(ParamError, match="unknown parameter.*heads"):
        m.check_params({**full, "heads": 16})
    assert m.coerce_params({"block_m": "64", "mask": "causal"}) == {"block_m": 64, "mask": "causal"}
    with pytest.raises(ParamError, match="allowed: 'none', 'causal'"):
        m.coerce_params({"mask": "sliding"})


def test_exclude_matches_a_value_or_any_of_a_list():
    """An ``exclude`` entry's value may be a list (any of them); the real config refuses the
    warpgroup_works loop at every block_m above 64 (its works have <= 32 rows) before a build,
    and a list holding a disallowed value, or an empty one, is a config error."""
    m = load_config(paths.JIT_CONFIG_PATH).module("mla_decode")
    base = dict(arch="sm_90a", page_size=64, block_n=64, mask="none", q_dtype="fp8", kv_dtype="fp8",
                mainloop="warpgroup_works")
    assert m.check_params({**base, "block_m": 64})["block_m"] == 64
    for bm in (128, 192, 2048):
        with pytest.raises(ParamError, match=f"mainloop='warpgroup_works', block_m={bm} is not supported"):
            m.check_params({**base, "block_m": bm})
    assert m.check_params({**base, "block_m": 2048, "mainloop": "tile_pairs"})["block_m"] == 2048
    raw = real_raw()
    dec = raw["modules"]["mla_decode"]
    for bad, text in (([], "non-empty list"), ([64, 96], "96 is not allowed")):
        dec["exclude"] = [{"when": {"block_m": bad}, "why": "x"}]
        with pytest.raises(ConfigError, match=text):
            validate(raw)
    # "instead": what a substituted default builds in place of the excluded combination
    for bad, text in (({}, "instead: expected a non-empty object"), ([1], "instead: expected a non-empty object"),
                      ({"bogus": 1}, "instead.bogus: unknown parameter"),
                      ({"mainloop": "nope"}, "instead.mainloop: 'nope' is not allowed")):
        dec["exclude"] = [{"when": {"block_m": 64}, "why": "x", "instead": bad}]
        with pytest.raises(ConfigError, match=text):
            validate(raw)
    causal_pv = {**base, "block_m": 128, "mainloop": "score_pv", "mask": "causal"}
    assert m.alternative(causal_pv) == {**causal_pv, "mainloop": "tile_pairs"}
    assert m.alternative({**base, "block_m": 64}) is None   # allowed: no exclusion matches


def test_unknown_module_lists_modules():
    with pytest.raises(KeyError, match="convert_fp8"):
        load_config(paths.JIT_CONFIG_PATH).module("nope")


@pytest.mark.parametrize("arch", ["sm_90a", "gfx942", "gfx950"])
def test_render_convert_fp8_any_arch_without_toolchain(arch):
    m = load_config(paths.JIT_CONFIG_PATH).module("convert_fp8")
    r = render(m, {"arch": arch, "out_dtype": "bf16"}, paths.TEMPLATES_DIR)
    assert f"arch={arch}" in r.text and "aiter_mla_convert_fp8" in r.text
    assert ("cuda_fp8.h" in r.text) == (arch == "sm_90a")
    assert set(r.headers) == {"common/aiter_mla_common.cuh", "common/aiter_mla_numeric.cuh"}


def _module(tmp_path, template_text, params=None):
    (tmp_path / "t.cu.j2").write_text(template_text)
    raw = real_raw()
    raw["modules"] = {"t": {"template": "t.cu.j2", "params": params or {"arch": ["sm_90a"]},
                            "default_variants": [], "flags": {}, "third_party": [],
                            "experimental": False}}
    return validate(raw).module("t")


def test_strict_undefined_names_the_missing_variable(tmp_path):
    m = _module(tmp_path, "int x = {{ block_q }};\n")
    with pytest.raises(RenderError) as ei:
        render(m, {"arch": "sm_90a"}, tmp_path)
    msg = str(ei.value)
    assert "block_q" in msg and "t(arch=sm_90a)" in msg and "defined: arch" in msg


def test_template_gets_work_info_constants(tmp_path):
    m = _module(tmp_path, "{{ WI_KV_END }} {{ WORK_INFO_INTS }} {{ arch_family }} {{ module }}\n")
    assert render(m, {"arch": "sm_90a"}, tmp_path).text == "5 8 nvidia t\n"


def test_missing_template_and_syntax_error(tmp_path):
    m = _module(tmp_path, "{% if %}\n")
    with pytest.raises(RenderError, match="template error"):
        render(m, {"arch": "sm_90a"}, tmp_path)
    (tmp_path / "t.cu.j2").unlink()
    with pytest.raises(RenderError, match="does not exist"):
        render(m, {"arch": "sm_90a"}, tmp_path)


@pytest.mark.parametrize("params,needle", [
    (dict(mainloop="tile_pairs", block_n=32), "block_n 32 is gfx942's"),
    (dict(mainloop="alternating", q_dtype="bf16", kv_dtype="bf16", block_n=32), "block_n 32 is gfx942's"),
    (dict(q_dtype="fp8", kv_dtype="bf16", mainloop="alternating"), "must be equal"),
    (dict(q_dtype="bf16", kv_dtype="fp8", mainloop="alternating"), "must be equal"),
    (dict(q_dtype="bf16", kv_dtype="bf16", mainloop="tile_pairs"), "fp8 only"),
    (dict(q_dtype="bf16", kv_dtype="bf16", mainloop="warpgroup_works"), "fp8 only"),
    (dict(mainloop="warpgroup_works", block_m=128), "at most 32 rows"),
    (dict(mainloop="alternating"), "bf16 only"),
    (dict(mainloop="wgmma_ot"), "allowed: 'score_pv', 'tile_pairs', 'warpgroup_works', 'alternating', 'mfma'"),
    (dict(q_dtype="bf16", kv_dtype="bf16", mainloop="score_pv"), "score_pv main loop is fp8 only"),
    (dict(mainloop="score_pv", mask="causal"), "score_pv main loop runs mask none"),
    (dict(mainloop="score_pv", page_size=32), "score_pv main loop runs pages of at least a KV tile"),
    (dict(mainloop="score_pv", block_m=192), "score_pv main loop runs works of at most 128 rows"),
    (dict(mainloop="mfma"), "mainloop mfma is the AMD kernel's"),
    (dict(q_dtype="fp8_fnuz", kv_dtype="fp8_fnuz"), "fp8_fnuz .* is gfx942's"),
    # the AMD kernel (templates/mla_decode_amd.cu.j2)
    (dict(arch="gfx942", block_m=128, block_n=32, q_dtype="fp8_fnuz", kv_dtype="fp8_fnuz"), "runs mainloop mfma"),
    (dict(arch="gfx942", block_m=128, mainloop="mfma", q_dtype="fp8_fnuz", kv_dtype="fp8_fnuz"), "gfx942 runs block_n 32"),
    (dict(arch="gfx942", block_m=128, block_n=32, mainloop="mfma"), "MFMA reads e4m3fnuz"),
    (dict(arch="gfx942", block_n=32, mainloop="mfma", q_dtype="fp8_fnuz", kv_dtype="fp8_fnuz"), "128-row works"),
    (dict(arch="gfx950", block_m=192, mainloop="mfma"), "128-row .* or 64-row"),
    (dict(arch="gfx950", mainloop="mfma", q_dtype="bf16", kv_dtype="bf16"), "fp8 .* only"),
])
def test_decode_combinations_without_a_kernel_are_refused_before_compiling(params, needle):
    """What the decode template would reject with #error is refused by the config first."""
    from aiter_mla.jit.config import ParamError, load_config

    m = load_config().module("mla_decode")
    base = dict(arch="sm_90a", block_m=64, page_size=64, block_n=64, mask="none", q_dtype="fp8",
                kv_dtype="fp8", mainloop="tile_pairs")
    m.check_params(base)   # the base itself is a kernel the template has
    with pytest.raises(ParamError, match=needle):
        m.check_params({**base, **params})


def test_every_allowed_sm90_decode_variant_renders_without_error():
    """jit_config's exclusions and the template's #error guards agree: every sm_90a mla_decode
    variant that check_params accepts renders with no #error (a variant the config allows but
    the template refuses would fail only at build time, after a user's call chose it), and
    every excluded one is refused before rendering. Guards e.g. the score_pv block_m list."""
    import itertools

    from aiter_mla.jit.config import ParamError

    m = load_config(paths.JIT_CONFIG_PATH).module("mla_decode")
    names = [p for p in m.params if p != "arch"]
    allowed = refused = 0
    for values in itertools.product(*(m.params[p] for p in names)):
        v = dict(zip(names, values), arch="sm_90a")
        try:
            m.check_params(v)
        except ParamError:
            refused += 1
            continue
        allowed += 1
        text = render(m, v, paths.TEMPLATES_DIR).text
        assert "#error" not in text, f"{v}: the config allows it, the template refuses it"
    assert allowed >= 1000 and refused > 0, (allowed, refused)
