import numpy as np
rng = np.random.default_rng(0)
def run(nkeys, valid_rows=64, scale=0.1, kv_scale=1.3):
    R, D, DV, BN = 64, 576, 512, 64
    q = rng.standard_normal((R, D)); k = rng.standard_normal((max(nkeys,1), D)); v = k[:, :DV]
    slog2 = scale * kv_scale * 1.4426950408889634
    ntiles = (nkeys + BN - 1) // BN
    m = np.full(R, -np.inf); l = np.zeros(R); O = np.zeros((R, DV))
    key_end = np.where(np.arange(R) < valid_rows, nkeys, 0)
    for t in range(ntiles):
        tok = t * BN
        kt = np.zeros((BN, D)); n = min(BN, nkeys - tok); kt[:n] = k[tok:tok+n]; kt[n:] = np.nan  # garbage past the end
        s = q @ kt.T
        vt = kt[:, :DV].copy()
        if n < BN: vt[n:] = 0.0          # zero_v_tail
        if tok + BN <= nkeys and slog2 > 0:   # unmasked path
            mx = np.max(s, axis=1) * slog2; sc = slog2
        else:
            keys = tok + np.arange(BN)
            s = np.where(keys[None, :] < key_end[:, None], s * slog2, -np.inf); sc = 1.0
            mx = np.max(s, axis=1)
        m_new = np.fmax(m, mx); mref = np.where(m_new == -np.inf, 0.0, m_new)
        f = np.exp2(m - mref); m = m_new
        p = np.exp2(s * sc - mref[:, None])
        l = l * f + p.sum(1)
        O = O * f[:, None] + p @ vt
    inv = np.where(l > 0, kv_scale / np.where(l > 0, l, 1), 0.0)
    out = O * inv[:, None]
    lse = np.where(l > 0, (m + np.log2(np.where(l > 0, l, 1))) * np.log(2), np.inf)
    # reference
    ref = np.zeros((R, DV)); rlse = np.full(R, np.inf)
    if nkeys > 0:
        S = (q @ k[:nkeys].T) * scale * kv_scale
        for r in range(valid_rows):
            w = np.exp(S[r] - S[r].max()); ref[r] = kv_scale * (w @ v[:nkeys]) / w.sum(); rlse[r] = S[r].max() + np.log(w.sum())
    vr = slice(0, valid_rows)
    assert not np.isnan(out[vr]).any(), "NaN"; return np.max(np.abs(out[vr] - ref[vr])) if nkeys else np.abs(out[vr]).max(), np.max(np.abs(np.where(np.isinf(rlse[vr]), 0, lse[vr] - rlse[vr])))
for nk in [0, 1, 37, 63, 64, 65, 128, 129, 200, 511, 512]:
    for vr in [64, 17]:
        print(nk, vr, run(nk, vr))
