"""PNG plots of a sweep (matplotlib, Agg backend: no display needed).

- latency vs ctx, one line per batch, log-log, one panel per (heads, qlen, dtype, page, varlen)
  group; the seed's MI355 numbers dashed in the same colour where the shape matches;
- fraction of the roofline floor as a batch x ctx heat map, one panel per group.

The caller groups the rows (``report.write_outputs``: ``{group title: rows}``); this module
imports nothing of the package.
"""
from __future__ import annotations

import math
from pathlib import Path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _measured(rows):
    return [r for r in rows if not r.get("error") and isinstance(r.get("us"), (int, float))]


def latency_vs_ctx(panels: dict[str, list[dict]], path: Path, machine: str = "") -> None:
    """Decode + reduce µs vs requested ctx, one line per batch (log-log), one panel per entry
    of ``panels`` ({title: result rows}); written to ``path`` (PNG)."""
    plt = _pyplot()
    n = max(1, len(panels))
    fig, axes = plt.subplots(1, n, figsize=(7.5 * n, 5.5), squeeze=False)
    for ax, (title, grows) in zip(axes[0], panels.items()):
        grows = _measured(grows)
        batches = sorted({r["batch"] for r in grows})
        cmap = plt.get_cmap("viridis", max(2, len(batches)))
        seed_labelled = False
        for i, b in enumerate(batches):
            pts = sorted((r["ctx"], r["us"], r.get("seed_mi355_us")) for r in grows if r["batch"] == b)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=cmap(i), label=f"batch {b}")
            seed = [(p[0], p[2]) for p in pts if p[2] is not None]
            if seed:
                ax.plot([p[0] for p in seed], [p[1] for p in seed], "--", color=cmap(i), alpha=0.5,
                        label=None if seed_labelled else "seed MI355 HK (ref, dashed)")
                seed_labelled = True
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("ctx (tokens)")
        ax.set_ylabel("decode + reduce (µs)")
        ax.set_title(title, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        if batches:
            ax.legend(fontsize=7, ncol=2)
    fig.suptitle(f"aiter_mla MLA decode latency — {machine}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def frac_floor_heatmap(panels: dict[str, list[dict]], path: Path, machine: str = "") -> None:
    """Fraction of the roofline floor (floor / measured) over batch x ctx, annotated, one panel
    per entry of ``panels`` ({title: result rows}); written to ``path`` (PNG)."""
    plt = _pyplot()
    n = max(1, len(panels))
    fig, axes = plt.subplots(1, n, figsize=(8 * n, 5.5), squeeze=False)
    for ax, (title, grows) in zip(axes[0], panels.items()):
        grows = _measured(grows)
        batches = sorted({r["batch"] for r in grows})
        ctxs = sorted({r["ctx"] for r in grows})
        grid = [[math.nan] * len(ctxs) for _ in batches]
        for r in grows:
            grid[batches.index(r["batch"])][ctxs.index(r["ctx"])] = r["frac_floor"]
        finite = [v for line in grid for v in line if math.isfinite(v)]
        im = ax.imshow(grid, cmap="viridis", vmin=0.0, vmax=max([1.0] + finite), aspect="auto",
                       origin="lower")
        for i, line in enumerate(grid):
            for j, v in enumerate(line):
                if math.isfinite(v):
                    ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7,
                            color="white" if v < 0.5 else "black")
        ax.set_xticks(range(len(ctxs)), [str(c) for c in ctxs], fontsize=8)
        ax.set_yticks(range(len(batches)), [str(b) for b in batches], fontsize=8)
        ax.set_xlabel("ctx (tokens)")
        ax.set_ylabel("batch")
        ax.set_title(title, fontsize=9)
        fig.colorbar(im, ax=ax, label="fraction of roofline floor")
    fig.suptitle(f"aiter_mla: floor / measured — {machine}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
