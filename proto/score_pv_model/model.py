"""CPU model of the score_pv barrier protocol (mla_decode_sm90_score_pv.cuh + the j2 kernel body).
Agents: producer warp, scorer WG (128), PV WG0 (128), PV WG1 (128). Random interleavings.
Checks: deadlock, named-barrier double arrival in one generation, mbarrier over-arrival,
buffer races (write while read active / read of wrong item / read while being written)."""
import random, sys, itertools

class Fail(Exception): pass

class NamedBar:
    def __init__(s, name, count): s.name, s.count, s.arrived, s.gen, s.who = name, count, 0, 0, set()
    def arrive(s, who, w):
        if who in s.who: raise Fail(f"{s.name}: {who} arrives twice in generation {s.gen}")
        s.who.add(who); s.arrived += w
        if s.arrived > s.count: raise Fail(f"{s.name}: over count")
        if s.arrived == s.count: s.arrived = 0; s.gen += 1; s.who = set()

class MBar:
    def __init__(s, name, count): s.name, s.count, s.pending, s.tx, s.phase = name, count, count, 0, 0
    def _check(s):
        if s.pending == 0 and s.tx == 0: s.phase += 1; s.pending = s.count
    def arrive(s, w, tx=0):
        s.tx += tx; s.pending -= w
        if s.pending < 0: raise Fail(f"{s.name}: over-arrival")
        s._check()
    def complete_tx(s, tx):
        s.tx -= tx
        if s.tx < 0: raise Fail(f"{s.name}: tx underflow")
        s._check()
    def done(s, parity):  # try_wait.parity semantics: true if phase with parity `parity` completed
        return (s.phase & 1) != parity

class Buf:
    def __init__(s, name): s.name, s.item, s.writing, s.readers = name, None, False, {}
    def wbegin(s, item, who):
        if s.writing: raise Fail(f"{s.name}: two writers")
        act = {r: it for r, it in s.readers.items()}
        if act: raise Fail(f"{s.name}: write of {item} by {who} while {act} read")
        s.writing = True; s.pending = item
    def wend(s): s.writing = False; s.item = s.pending; s.zeroed = None
    zeroed = None
    def wz(s, who, item):
        if s.writing or s.readers or s.item != item: raise Fail(f"{s.name}: zero write by {who} of {item}: writing={s.writing} readers={s.readers} item={s.item}")
        s.zeroed = item
    def rz(s, who, item):
        if s.zeroed != item: raise Fail(f"{s.name}: {who} reads tail of {item} not zeroed ({s.zeroed})")
    def rbegin(s, who, item):
        if s.writing: raise Fail(f"{s.name}: {who} reads {item} while being written")
        if s.item != item: raise Fail(f"{s.name}: {who} expects {item}, holds {s.item}")
        s.readers[who] = item
    def rend(s, who): del s.readers[who]

def build(works, partial):
    """works: list of tile counts; partial: per work, whether the last tile is partial."""
    B = {}
    for i in range(2):
        B[f"PF{i}"] = NamedBar(f"P_full{i}", 384); B[f"PE{i}"] = NamedBar(f"P_empty{i}", 384); B[f"F{i}"] = NamedBar(f"F{i}", 384)
    B["C7"] = NamedBar("consumer7", 256)
    M = {}
    for s in range(4): M[f"full{s}"] = MBar(f"full{s}", 1); M[f"empty{s}"] = MBar(f"empty{s}", 384)
    M["qfull"] = MBar("q_full", 1); M["qempty"] = MBar("q_empty", 128)
    for p in range(2): M[f"lmfull{p}"] = MBar(f"lm_full{p}", 128); M[f"lmempty{p}"] = MBar(f"lm_empty{p}", 256)
    U = {f"stage{s}": Buf(f"stage{s}") for s in range(4)}
    U.update({f"zero{s}": Buf(f"stageVtail{s}") for s in range(4)})
    U.update({f"P{i}": Buf(f"P{i}") for i in range(2)}); U.update({f"Fac{i}": Buf(f"Fac{i}") for i in range(2)})
    U.update({f"lm{i}": Buf(f"lm{i}") for i in range(2)}); U["Q"] = Buf("Q")
    return B, M, U

# ops: ('nba', bar, w) ('nbs', bar, w) ('mwait', bar, parity) ('marr', bar, w) ('mexp', bar, tx)
#      ('tma', buf, item, bar, tx) ('wb', buf, item) ('we', buf) ('rb', buf, item) ('re', buf)
def producer(works):
    ops = []; pseq = 0; qwork = 0
    for wi, n in enumerate(works):
        if n > 0:
            ops += [('mwait', 'qempty', (qwork & 1) ^ 1), ('tma', 'Q', ('Q', wi), 'qfull', 1)]; qwork += 1
        for t in range(n):
            st = pseq % 4
            ops += [('mwait', f'empty{st}', ((pseq // 4) & 1) ^ 1), ('tma', f'stage{st}', pseq, f'full{st}', 1)]
            pseq += 1
    return ops

def scorer(works, partial):
    ops = []; seq = 0; qwork = 0; nwork = 0
    for wi, n in enumerate(works):
        if n > 0: ops.append(('mwait', 'qfull', qwork & 1)); qwork += 1
        for t in range(n):
            st, par, slot = seq % 4, (seq // 4) & 1, seq & 1
            ops += [('mwait', f'full{st}', par), ('rb', f'stage{st}', seq), ('rb', 'Q', ('Q', wi)), ('re', 'Q'), ('re', f'stage{st}')]
            if t + 1 == n:
                ops.append(('marr', 'qempty', 128))
                if partial[wi]:
                    ops += [('wz', f'stage{st}', seq)]
            ops.append(('marr', f'empty{st}', 128))
            if t > 0: ops.append(('nba', f'PF{slot ^ 1}', 128))
            if seq >= 2: ops.append(('nbs', f'PE{slot}', 128))
            ops += [('wb', f'Fac{slot}', seq), ('we', f'Fac{slot}'), ('nba', f'F{slot}', 128), ('wb', f'P{slot}', seq), ('we', f'P{slot}')]
            seq += 1
        if n > 0: ops.append(('nba', f'PF{(seq - 1) & 1}', 128))
        ops += [('mwait', f'lmempty{nwork & 1}', ((nwork >> 1) & 1) ^ 1), ('wb', f'lm{nwork & 1}', nwork), ('we', f'lm{nwork & 1}'),
                ('marr', f'lmfull{nwork & 1}', 128)]
        nwork += 1
    for u in range(seq - 2 if seq >= 2 else 0, seq): ops.append(('nbs', f'PE{u & 1}', 128))
    return ops

def pv(works, partial, me):
    ops = []; seq = 0; nwork = 0
    for wi, n in enumerate(works):
        ops.append(('nbs', 'C7', 128))
        for t in range(n):
            st, par, slot = seq % 4, (seq // 4) & 1, seq & 1
            ops += [('nbs', f'F{slot}', 128), ('rb', f'Fac{slot}', seq), ('re', f'Fac{slot}'), ('mwait', f'full{st}', par),
                    ('rb', f'stage{st}', seq)]
            if t + 1 == n and partial[wi]: ops.append(('rz', f'stage{st}', seq))
            ops += [('nbs', f'PF{slot}', 128), ('rb', f'P{slot}', seq), ('re', f'stage{st}'),
                    ('marr', f'empty{st}', 128), ('re', f'P{slot}'), ('nba', f'PE{slot}', 128)]
            seq += 1
        ops += [('mwait', f'lmfull{nwork & 1}', (nwork >> 1) & 1), ('rb', f'lm{nwork & 1}', nwork), ('re', f'lm{nwork & 1}'),
                ('marr', f'lmempty{nwork & 1}', 128)]
        nwork += 1
    return ops

def run(works, partial, rng):
    B, M, U = build(works, partial)
    progs = {'prod': producer(works), 'scorer': scorer(works, partial), 'pv0': pv(works, partial, 0), 'pv1': pv(works, partial, 1)}
    pc = {a: 0 for a in progs}
    blocked_on = {}   # agent -> (bar, gen) for named sync
    inflight = []     # TMA: (buf, bar, tx)
    steps = 0
    while True:
        steps += 1
        cands = []
        for a, ops in progs.items():
            if pc[a] >= len(ops): continue
            op = ops[pc[a]]
            if op[0] == 'nbs' and a in blocked_on:
                bar, gen = blocked_on[a]
                if B[bar].gen > gen: cands.append(a)
                continue
            if op[0] == 'mwait' and not M[op[1]].done(op[2]): continue
            cands.append(a)
        cands += [('tma', i) for i in range(len(inflight))]
        if not cands:
            if all(pc[a] >= len(progs[a]) for a in progs): return steps
            state = {a: (progs[a][pc[a]] if pc[a] < len(progs[a]) else 'done') for a in progs}
            raise Fail(f"DEADLOCK: {state}")
        c = rng.choice(cands)
        if isinstance(c, tuple):
            buf, bar, tx = inflight.pop(c[1]); U[buf].wend(); M[bar].complete_tx(tx); continue
        a = c; op = progs[a][pc[a]]
        k = op[0]
        if k == 'nba': B[op[1]].arrive(a, op[2]); pc[a] += 1
        elif k == 'nbs':
            if a in blocked_on: del blocked_on[a]; pc[a] += 1
            else:
                g = B[op[1]].gen; B[op[1]].arrive(a, op[2])
                if B[op[1]].gen > g: pc[a] += 1
                else: blocked_on[a] = (op[1], g)
        elif k == 'mwait': pc[a] += 1
        elif k == 'marr': M[op[1]].arrive(op[2]); pc[a] += 1
        elif k == 'tma':
            _, buf, item, bar, tx = op
            M[bar].arrive(1, tx); U[buf].wbegin(item, a); inflight.append((buf, bar, tx)); pc[a] += 1
        elif k == 'wb': U[op[1]].wbegin(op[2], a); pc[a] += 1
        elif k == 'we': U[op[1]].wend(); pc[a] += 1
        elif k == 'wz': U[op[1]].wz(a, op[2]); pc[a] += 1
        elif k == 'rz': U[op[1]].rz(a, op[2]); pc[a] += 1
        elif k == 'rb': U[op[1]].rbegin(a, op[2]); pc[a] += 1
        elif k == 're': U[op[1]].rend(a); pc[a] += 1

def main():
    rng = random.Random(1)
    lists = [[], [0], [1], [2], [3], [1, 1], [1, 1, 1, 1, 1], [2, 1, 3], [3, 0, 1], [0, 0, 2], [8, 1, 7, 2],
             [5, 6, 0, 1, 4, 3, 2], [1, 2, 3, 4, 5, 6, 7, 8], [4, 4, 4], [7], [1, 0, 1, 0, 1]]
    for n1 in range(0, 9):
        for n2 in range(0, 9): lists.append([n1, n2, (n1 + n2) % 4])
    bad = 0
    for L in lists:
        for pmask in range(1 << min(len(L), 3)):
            partial = [bool((pmask >> (i % 3)) & 1) for i in range(len(L))]
            for it in range(60):
                try: run(L, partial, rng)
                except Fail as e:
                    print("FAIL", L, partial, e); bad += 1; break
    print("failures:", bad)

if __name__ == '__main__': main()
