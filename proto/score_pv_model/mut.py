import model, random
orig_s, orig_p = model.scorer, model.pv
def run_all(tag):
    rng = random.Random(2); 
    lists = [[1,1,1,1],[2,3,1],[5,0,2],[3,3],[1,2,3,4]]
    for L in lists:
        for partial in ([True]*len(L), [False]*len(L)):
            for it in range(80):
                try: model.run(L, partial, rng)
                except model.Fail as e: print(tag, "caught:", L, str(e)[:150]); return
    print(tag, "NOT caught")
def mutate_scorer(f):
    def s(w, p): return f(orig_s(w, p))
    model.scorer = s
def mutate_pv(f):
    def s(w, p, me): return f(orig_p(w, p, me))
    model.pv = s
# 1: drop first P_empty sync of scorer
def m1(ops):
    for i, o in enumerate(ops):
        if o[0]=='nbs' and o[1].startswith('PE'): return ops[:i]+ops[i+1:]
    return ops
mutate_scorer(m1); run_all("drop P_empty sync"); model.scorer = orig_s
# 2: zero after F arrive (move wz to end of tile)
def m2(ops):
    ops = list(ops)
    for i, o in enumerate(ops):
        if o[0]=='wz':
            z = ops.pop(i)
            for j in range(i, len(ops)):
                if ops[j][0]=='nba' and ops[j][1].startswith('F'): ops.insert(j+1, z); return ops
    return ops
mutate_scorer(m2); run_all("zero after F"); model.scorer = orig_s
# 3: PV releases V before the F sync? -> V release at tile start
def m3(ops):
    ops = list(ops)
    for i,o in enumerate(ops):
        if o[0]=='marr' and o[1].startswith('empty'):
            e = ops.pop(i)
            for j in range(i-1, -1, -1):
                if ops[j][0]=='nbs' and ops[j][1].startswith('PF'): ops.insert(j, e); return ops
    return ops
mutate_pv(m3); run_all("V release before P_full sync"); model.pv = orig_p
# 4: lm_empty wait wrong parity
def m4(ops):
    return [('mwait', o[1], o[2]^1) if o[0]=='mwait' and o[1].startswith('lmempty') else o for o in ops]
mutate_scorer(m4); run_all("lm_empty parity flipped"); model.scorer = orig_s
# 5: no end-of-work P_full arrive
def m5(ops):
    out=[]; 
    for i,o in enumerate(ops):
        if o[0]=='nba' and o[1].startswith('PF') and i+1<len(ops) and ops[i+1][0]=='mwait' and ops[i+1][1].startswith('lmempty'): continue
        out.append(o)
    return out
mutate_scorer(m5); run_all("no end-of-work P_full"); model.scorer = orig_s
