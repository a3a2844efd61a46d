"""DeepSeek-V3 attention run through aiter_mla inside transformers' own model, layer by layer.

A small random-initialised DeepSeek-V3 (real MLA head dims: kv_lora_rank 512, qk_rope_head_dim
64, qk_nope_head_dim 128, v_head_dim 128; yarn rope scaling as DeepSeek-V3 ships it) runs a
prefill and N greedy decode steps. Every ``DeepseekV3Attention`` is wrapped: it runs
transformers' own attention (the reference, which also keeps transformers' cache), and in a
decode step it also runs the engine path an MLA server uses:

- the new token's normalised latent and roped key go into a paged cache
  (``aiter_mla.concat_and_cache_mla``; page size 64 or 1, random page ids, NaN in unused slots);
- ``kv_b_proj`` is absorbed: q_nope x W_UK gives the 512-dim latent query, and the op's latent
  output x W_UV gives the value heads before ``o_proj``;
- ``MlaDecodePlanner.plan`` once per step and ``run`` per layer, with the model's softmax scale
  (yarn: mscale^2 / sqrt(192), not 1 / sqrt(576)).

The wrapped layer returns our output, so the generation runs on it, and the greedy tokens are
compared with a run of transformers alone: where they differ, the first differing step of each
row and transformers' top-2 margin there (in bf16 spacings) are reported. In bf16 a difference
counts as agreement only at a one-spacing tie; in fp8 (q and cache in e4m3, whose rounding moves
the logits by more than a tie) the tokens are reported but not required to agree, and the check
is the per-layer error bound alone. ``--backend reference`` swaps the op for the float64
reference, to check the adapter itself.

    python examples/deepseek_v3_decode.py [--dtype bf16|fp8] [--page-size 64] [--steps 8]
                                          [--wrong-scale] [--backend aiter|reference]
"""
from __future__ import annotations

import argparse
import json
import math
import sys

import torch
from torch import nn

#: The most decode steps a run compares (each is a full forward pass of both models on the CPU
#: or GPU: a demo, not a soak test).
MAX_STEPS = 4096

YARN = {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
        "rope_theta": 10000.0}


def small_config(num_heads: int = 128, layers: int = 3):
    """A DeepSeek-V3 config with the real attention dims and a small everything else."""
    from transformers import DeepseekV3Config

    return DeepseekV3Config(
        vocab_size=512, hidden_size=1024, intermediate_size=1024, moe_intermediate_size=256,
        num_hidden_layers=layers, num_attention_heads=num_heads, num_key_value_heads=num_heads,
        n_shared_experts=1, n_routed_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1,
        first_k_dense_replace=1, kv_lora_rank=512, q_lora_rank=256, qk_rope_head_dim=64,
        qk_nope_head_dim=128, v_head_dim=128, max_position_embeddings=163840,
        rope_parameters=dict(YARN), initializer_range=0.06, attn_implementation="eager")


class PagedLatentCache:
    """Each layer's [num_pages, page_size, 1, 576] cache of (latent, roped key) rows for a batch
    of sequences, with a random page table; unused slots hold NaN."""

    def __init__(self, layers, batch, max_tokens, page_size, dtype, device, generator):
        self.page_size, self.batch = page_size, batch
        per_seq = -(-max_tokens // page_size)
        self.num_pages = per_seq * batch + 3
        ids = torch.randperm(self.num_pages, generator=generator)[:per_seq * batch].to(torch.int32)
        self.table = ids.view(batch, per_seq)
        nan = torch.full((self.num_pages, page_size, 1, 576), float("nan"))
        self.caches = [nan.to(dtype).to(device) for _ in range(layers)]
        self.kv_scales = [None] * layers
        self.lengths = [0] * batch
        self.device = device

    def slots(self, start: int, count: int) -> torch.Tensor:
        """Slot ids of tokens start .. start + count of every sequence, sequence-major."""
        pos = torch.arange(start, start + count)
        page = self.table[:, pos // self.page_size].long()
        return (page * self.page_size + (pos % self.page_size)).reshape(-1).to(self.device)

    def layout(self):
        """(qo_indptr, kv_indptr, kv_indices, kv_last_page_lens) for one q token per sequence."""
        pages = [-(-n // self.page_size) for n in self.lengths]
        kv_indptr = torch.tensor([0] + torch.tensor(pages).cumsum(0).tolist(), dtype=torch.int32)
        kv_indices = torch.cat([self.table[b, :n] for b, n in enumerate(pages)])
        last = torch.tensor([n - (p - 1) * self.page_size for n, p in zip(self.lengths, pages)],
                            dtype=torch.int32)
        qo = torch.arange(self.batch + 1, dtype=torch.int32)
        return [t.to(self.device) for t in (qo, kv_indptr, kv_indices, last)]


def _fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (x.float() / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)


class Engine:
    """What the wrapped layers share: the paged cache, the planner (or the reference), the
    step's plan, and the figures."""

    def __init__(self, config, batch, max_tokens, page_size, dtype, backend, sm_scale, device, seed=0):
        self.config, self.dtype, self.backend, self.sm_scale = config, dtype, backend, sm_scale
        g = torch.Generator(device="cpu").manual_seed(seed)
        store = torch.float8_e4m3fn if dtype == "fp8" else torch.bfloat16
        self.cache = PagedLatentCache(config.num_hidden_layers, batch, max_tokens, page_size, store,
                                      device, g)
        self.planner = None
        if backend == "aiter":
            import aiter_mla

            self.planner = aiter_mla.MlaDecodePlanner(
                batch, config.num_attention_heads, sm_scale=sm_scale, page_size=page_size,
                max_num_pages=self.cache.num_pages, dtype=store, device=device)
        self.use_ours = True
        self.calls = [0] * config.num_hidden_layers       # our decode op, per layer
        self.errors: list[list[float]] = [[] for _ in range(config.num_hidden_layers)]
        self._layout = None

    def append(self, layer: int, latent: torch.Tensor, start: int) -> None:
        """Write [batch, count, 576] rows at positions start.. of every sequence."""
        b, count, _ = latent.shape
        rows = latent.reshape(b * count, 576)
        cache = self.cache.caches[layer]
        if self.dtype == "fp8" and self.cache.kv_scales[layer] is None:
            # per-tensor scale from the prefill, with room for later tokens
            self.cache.kv_scales[layer] = (rows.float().abs().amax() * 1.5 / 448.0).reshape(1)
        scale = self.cache.kv_scales[layer]
        slots = self.cache.slots(start, count)
        if self.backend == "aiter":
            import aiter_mla

            aiter_mla.concat_and_cache_mla(rows[:, :512], rows[:, 512:], cache, slots, kv_scale=scale)
        else:
            flat = cache.view(-1, 576)
            flat[slots] = rows.to(cache.dtype) if scale is None else _fp8(rows, scale)

    def start_step(self) -> None:
        self.cache.lengths = [n + 1 for n in self.cache.lengths]
        self._layout = self.cache.layout()
        if self.planner is not None:
            self.planner.plan(*self._layout)

    def decode(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """Latent attention output [batch, H, 512] (bf16) for the query [batch, H, 576]."""
        self.calls[layer] += 1
        kv_scale = self.cache.kv_scales[layer]
        q_scale = None
        if self.dtype == "fp8":
            q_scale = (q.float().abs().amax() / 448.0).reshape(1)
            q = _fp8(q, q_scale)
        cache = self.cache.caches[layer]
        if self.planner is not None:
            return self.planner.run(q, cache, q_scale=q_scale, kv_scale=kv_scale)
        from aiter_mla.reference import mla_decode_ref

        out, _ = mla_decode_ref(q, cache, *self._layout, sm_scale=self.sm_scale, q_scale=q_scale,
                                kv_scale=kv_scale, fp8_p=self.dtype == "fp8")
        return out.to(torch.bfloat16)


class EngineAttention(nn.Module):
    """A ``DeepseekV3Attention`` that also runs the engine path in decode steps (module doc)."""

    def __init__(self, attn, engine: Engine):
        super().__init__()
        self.attn, self.engine = attn, engine
        H, nope, v = attn.num_heads, attn.qk_nope_head_dim, attn.v_head_dim
        w = attn.kv_b_proj.weight.view(H, nope + v, attn.kv_lora_rank).float()
        self.w_uk, self.w_uv = w[:, :nope], w[:, nope:]     # [H, 128, 512] each

    def _latents(self, hidden_states, position_embeddings):
        """This layer's query parts and cache rows, as transformers computes them."""
        from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf

        a = self.attn
        B, S = hidden_states.shape[:2]
        q = a.q_proj(hidden_states) if a.q_lora_rank is None else a.q_b_proj(
            a.q_a_layernorm(a.q_a_proj(hidden_states)))
        q = q.view(B, S, -1, a.qk_head_dim).transpose(1, 2)
        q_nope, q_rot = torch.split(q, [a.qk_nope_head_dim, a.qk_rope_head_dim], dim=-1)
        kv = a.kv_a_proj_with_mqa(hidden_states)
        latent, k_rot = torch.split(kv, [a.kv_lora_rank, a.qk_rope_head_dim], dim=-1)
        latent = a.kv_a_layernorm(latent)
        k_rot = k_rot.view(B, 1, S, a.qk_rope_head_dim)
        cos, sin = position_embeddings
        rope = hf.apply_rotary_pos_emb_interleave if a.config.rope_interleave else hf.apply_rotary_pos_emb
        q_rot, k_rot = rope(q_rot, k_rot, cos, sin)
        rows = torch.cat([latent, k_rot.view(B, S, a.qk_rope_head_dim)], dim=-1)   # [B, S, 576]
        return q_nope, q_rot, rows

    def forward(self, hidden_states, position_embeddings, attention_mask, *args, **kwargs):
        ref, weights = self.attn(hidden_states, position_embeddings, attention_mask, *args, **kwargs)
        e = self.engine
        layer = self.attn.layer_idx
        q_nope, q_rot, rows = self._latents(hidden_states, position_embeddings)
        B, S = hidden_states.shape[:2]
        if S > 1:   # prefill: transformers' attention; the cache gets the prompt's rows
            e.append(layer, rows, 0)
            e.cache.lengths = [S] * B
            return ref, weights
        if layer == 0:
            e.start_step()
        e.append(layer, rows, e.cache.lengths[0] - 1)
        q_lat = torch.einsum("bhd,hdc->bhc", q_nope[:, :, 0].float(), self.w_uk)
        q576 = torch.cat([q_lat, q_rot[:, :, 0].float()], dim=-1).to(torch.bfloat16)
        out_lat = e.decode(layer, q576)                                    # [B, H, 512]
        heads = torch.einsum("bhc,hdc->bhd", out_lat.float(), self.w_uv).to(hidden_states.dtype)
        ours = self.attn.o_proj(heads.reshape(B, 1, -1))
        diff = (ours.float() - ref.float()).norm() / ref.float().norm()
        e.errors[layer].append(float(diff))
        return (ours if e.use_ours else ref), weights


def _greedy(model, prompt, steps):
    """Greedy tokens [batch, steps] after the prompt, with transformers' dynamic cache."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    out = model(input_ids=prompt, past_key_values=cache, use_cache=True)
    tokens, margins = [], []
    for _ in range(steps):
        logits = out.logits[:, -1].float()
        top = logits.topk(2, dim=-1).values
        # the top-2 margin per row in units of the top logit's bf16 spacing (8 significant bits)
        ulp = torch.exp2(torch.floor(torch.log2(top[:, 0].abs().clamp_min(2.0 ** -126))) - 7)
        margins.append(((top[:, 0] - top[:, 1]) / ulp).tolist())
        nxt = logits.argmax(dim=-1, keepdim=True)
        tokens.append(nxt)
        out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
    return torch.cat(tokens, dim=1), margins


def run(dtype="bf16", page_size=64, steps=8, batch=2, prompt_len=70, wrong_scale=False,
        backend="aiter", device=None, num_heads=128, seed=0) -> dict:
    """Prefill + ``steps`` greedy decode steps, transformers alone and with our attention in
    every layer; returns the figures (per-layer relative L2 of the attention output against
    transformers', our op's call count per layer, the tokens of both runs, the sm_scale).
    ValueError when ``steps`` < 1."""
    if not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"steps must be in 1..{MAX_STEPS} (decode steps to compare), got {steps}")
    from transformers import DeepseekV3ForCausalLM

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(seed)
    config = small_config(num_heads)
    model = DeepseekV3ForCausalLM(config).to(device=device, dtype=torch.bfloat16).eval()
    prompt = torch.randint(0, config.vocab_size, (batch, prompt_len),
                           generator=torch.Generator().manual_seed(seed + 1)).to(device)
    attn0 = model.model.layers[0].self_attn
    sm_scale = 1.0 / math.sqrt(576) if wrong_scale else float(attn0.scaling)
    with torch.no_grad():
        ref_tokens, ref_margins = _greedy(model, prompt, steps)
        engine = Engine(config, batch, prompt_len + steps + 1, page_size, dtype, backend, sm_scale, device, seed)
        originals = [layer.self_attn for layer in model.model.layers]
        for layer in model.model.layers:
            layer.self_attn = EngineAttention(layer.self_attn, engine)
        try:
            our_tokens, our_margins = _greedy(model, prompt, steps)
        finally:
            for layer, attn in zip(model.model.layers, originals):
                layer.self_attn = attn
    return {"dtype": dtype, "page_size": page_size, "backend": backend, "steps": steps,
            "batch": batch, "prompt_len": prompt_len, "num_heads": num_heads,
            "sm_scale": sm_scale, "model_scaling": float(attn0.scaling),
            "calls_per_layer": engine.calls, "max_rel_l2_per_layer": [max(e) for e in engine.errors],
            "rel_l2": [e for e in engine.errors], "tokens_match": bool(torch.equal(ref_tokens, our_tokens)),
            "ref_tokens": ref_tokens.tolist(), "our_tokens": our_tokens.tolist(),
            "ref_margin_ulps": ref_margins, "our_margin_ulps": our_margins,
            "min_top2_margin_ulps": min(min(m) for m in ref_margins),
            "divergences": divergences(ref_tokens.tolist(), our_tokens.tolist(), ref_margins)}


def divergences(ref_tokens, our_tokens, ref_margin_ulps) -> list[dict]:
    """Per batch row whose greedy tokens differ: the first step that differs and the reference's
    top-2 logit margin there, in bf16 spacings of its top logit. Past that step the two runs
    decode different prefixes, so only the first difference says anything. A margin of one
    spacing is a tie that any change of rounding can flip (the logits are bf16)."""
    out = []
    for row, (ref, ours) in enumerate(zip(ref_tokens, our_tokens)):
        step = next((t for t, (a, b) in enumerate(zip(ref, ours)) if a != b), None)
        if step is not None:
            out.append({"row": row, "step": step, "ref_margin_ulps": ref_margin_ulps[step][row]})
    return out


#: A first difference between our op and the float64 reference op in the same bf16 engine
#: counts as a rounding tie where the reference engine's top-2 margin is at most this many bf16
#: spacings: our op's bf16 output differs from the rounded float64 one by about 2e-3 relative
#: (the bench's check), which through three layers moves a logit by a few spacings. A wrong
#: kernel differs at the first steps, at margins of tens to hundreds of spacings.
ENGINE_TIE_ULPS = 8.0


def tokens_agree(res: dict, max_margin_ulps: float = 1.0) -> bool:
    """Whether the greedy tokens match, or every row's first difference falls where the
    reference's top-2 margin is at most ``max_margin_ulps`` bf16 spacings (a rounding tie)."""
    return all(d["ref_margin_ulps"] <= max_margin_ulps for d in res["divergences"])


#: The bound on each decode step's relative L2 (attention output after o_proj, against
#: transformers' bf16 eager attention). The float64 reference in place of our op reads 9.5e-3
#: in bf16 (transformers' own bf16 rounding) and 7.2e-2 in fp8 (q and cache in e4m3 with
#: per-tensor scales, P in e4m3); the wrong scale 1/sqrt(576) reads 0.81.
TOLERANCE = {"bf16": 2e-2, "fp8": 1.2e-1}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", choices=("bf16", "fp8"), default="bf16")
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--wrong-scale", action="store_true", help="sm_scale = 1/sqrt(576) (negative control)")
    p.add_argument("--backend", choices=("aiter", "reference"), default="aiter")
    args = p.parse_args(argv)
    ps = args.page_size
    if ps < 1 or ps > 256 or ps & (ps - 1):
        print(f"deepseek_v3_decode: --page-size must be a power of two in 1..256, got {ps}", file=sys.stderr)
        return 2
    if not 1 <= args.steps <= MAX_STEPS:
        print(f"deepseek_v3_decode: --steps must be in 1..{MAX_STEPS} (decode steps to compare), got {args.steps}",
              file=sys.stderr)
        return 2
    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        print("deepseek_v3_decode: needs Hugging Face transformers (pip install transformers)",
              file=sys.stderr)
        return 1   # a missing package, not a wrong command line (README: exit statuses)
    if args.backend == "aiter" and not torch.cuda.is_available():
        print("deepseek_v3_decode: --backend aiter needs a CUDA GPU (sm_90a); none is visible "
              "(--backend reference runs the float64 reference on the CPU)", file=sys.stderr)
        return 2
    res = run(args.dtype, ps, args.steps, wrong_scale=args.wrong_scale, backend=args.backend)
    worst = max(res["max_rel_l2_per_layer"])
    ok = worst <= TOLERANCE[args.dtype] and (tokens_agree(res) or args.dtype == "fp8")
    print(json.dumps({k: v for k, v in res.items() if k != "rel_l2"}))
    print(f"{'PASS' if ok else 'FAIL'}: worst per-layer relative L2 {worst:.2e} (tolerance "
          f"{TOLERANCE[args.dtype]:.2g}), op calls per layer {res['calls_per_layer']}, greedy "
          f"tokens {'match' if res['tokens_match'] else 'differ: ' + json.dumps(res['divergences'])}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
