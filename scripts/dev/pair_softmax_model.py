"""Float64 model of the symmetric-seesaw pair algebra (scripts/dev/patches/seesaw_symmetric*.patch;
docs/perf/notes.md change 17): per pair of 64-key tiles, each warpgroup takes p against its local
reference m_loc = max(m_prev, its tile max); "sym" scales both tiles to the pair max M and rescales
O once, "exact" keeps tile a against m_a and rescales O by f_a, f_b (the online softmax order).
The warpgroups keep separate partial row sums (l_a, l_b), as the kernel does. Checks both against
a direct softmax on random rows (odd tile counts, masked keys, a max that moves along the row):
the factors and l updates of the patches are right before any e4m3 rounding. CPU only.
usage: python3 scripts/dev/pair_softmax_model.py"""
import numpy as np
rng = np.random.default_rng(0)
def max_ref(m): return 0.0 if m == -np.inf else m
def e2(x): return np.exp2(x)

def run(scores, V, variant):
    """scores: [T*64] log2-domain scores of one row (may hold -inf); V: [T*64, d]. Returns O/l."""
    n = len(scores); T = (n + 63) // 64
    m = -np.inf; l_a = 0.0; l_b = 0.0; O = np.zeros(V.shape[1])   # l_a / l_b: warpgroup partials
    for t in range(0, T, 2):
        has_b = t + 1 < T
        sa = scores[t*64:(t+1)*64]; Va = V[t*64:(t+1)*64]
        sb = scores[(t+1)*64:(t+2)*64] if has_b else np.array([]); Vb = V[(t+1)*64:(t+2)*64] if has_b else V[:0]
        mloc_a = max(m, sa.max()); mloc_b = max(m, sb.max()) if has_b else m
        pa = e2(sa - max_ref(mloc_a)); pb = e2(sb - max_ref(mloc_b))
        M = max(mloc_a, mloc_b)
        if variant == "sym":
            f_o = e2(m - max_ref(M)); ga = e2(max_ref(mloc_a) - max_ref(M)); gb = e2(max_ref(mloc_b) - max_ref(M))
            l_a = l_a * f_o + pa.sum() * ga; l_b = l_b * f_o + pb.sum() * gb
            O = O * f_o + (pa * ga) @ Va + ((pb * gb) @ Vb if has_b else 0)
        else:  # exact
            f_a = e2(m - max_ref(mloc_a)); f_b = e2(max_ref(mloc_a) - max_ref(M)); gb = e2(max_ref(mloc_b) - max_ref(M))
            l_a = l_a * f_a * f_b + pa.sum() * f_b; l_b = l_b * f_a * f_b + pb.sum() * gb
            O = O * f_a + pa @ Va
            if has_b: O = O * f_b + (pb * gb) @ Vb
        m = M
    l = l_a + l_b
    return O / l if l > 0 else O * 0, m

def ref(scores, V):
    w = np.exp2(scores - scores.max()); return (w / w.sum()) @ V

worst = 0
for trial in range(400):
    n = int(rng.integers(1, 700)); d = 8
    s = rng.normal(0, 3, n) * (1 + 10 * (trial % 3 == 0))
    if trial % 5 == 0: s = s + np.linspace(0, 40, n)          # the max moves along the work
    if trial % 7 == 0: s[rng.integers(0, n, n // 3)] = -np.inf   # masked keys
    V = rng.normal(0, 1, (n, d))
    for variant in ("sym", "exact"):
        O, m = run(s, V, variant)
        if np.all(s == -np.inf): continue
        err = np.abs(O - ref(s, V)).max(); worst = max(worst, err)
        assert err < 1e-9, (trial, variant, err)
        assert m == s.max()
print("pair algebra OK; worst abs err", worst)
