"""run17: the run scope's exit taken apart right after MobileNetV2 b1's steps (wall us, median
of 600 runs), and `ThreadBudget.release` after the steps against the same call warm: the
Python after a run's kernels runs cold (19 us against 1 us warm for the release).

    PYTHONPATH=. python benchmarks/run17_exit_probe.py THREADS
"""
import sys, time, numpy as np
sys.path.insert(0, '.')
from benchmarks import ab_harness as ab
from pygraphx.models import get_model, model_inputs
from pygraphx.targets.cpu.threads import BUDGET
import torch
T = int(sys.argv[1]); torch.set_num_threads(T)
model = get_model("mobilenetv2", batch=1)
feeds = {k: np.ascontiguousarray(v) for k, v in model_inputs("mobilenetv2", model).items()}
prog = ab.compile_variant(ab.Case("", model.SerializeToString(), {}), T, ab.Variant("n", {}, False))
for _ in range(20): prog.run(feeds)
ex = prog._executable; e = ex.executor; s = ex.scope
c = time.perf_counter_ns
rows = []
for r in range(600):
    e.bind(feeds); s.__enter__()
    for st in e.steps: st()
    t0 = c()
    before, mode, got, start = s._saved.pop()
    end = s._perf()
    t1 = c()
    mode.__exit__(None, None, None)
    t2 = c()
    if (got != before or s.switches) and s._get() != before:
        torch.set_num_threads(before)
    t3 = c()
    BUDGET.release()
    t4 = c()
    st_ = s.stall
    if st_ is not None and s.timed:
        st_.record(got, end - start, end)
    t5 = c()
    out = e.collect()
    t6 = c()
    rows.append([t1-t0, t2-t1, t3-t2, t4-t3, t5-t4, t6-t5])
print("pop+perf, mode exit, threads, budget release, stall record, collect (us, wall median):",
      [round(x, 1) for x in np.median(np.array(rows), 0) / 1e3])
import threading; print(threading.enumerate())
# budget release alone, warm vs after steps
rows=[]
for r in range(300):
    BUDGET.acquire(T)
    for st in e.steps: st()
    t0=c(); BUDGET.release(); t1=c(); BUDGET.acquire(T); t2=c(); BUDGET.release(); t3=c()
    rows.append([t1-t0, t3-t2])
print("release after steps / warm release:", np.median(np.array(rows),0)/1e3)
rows=[]
loc = BUDGET._local; lk = BUDGET._lock
import threading as th
get_ident = th.get_ident
d = {}
for r in range(300):
    BUDGET.acquire(T)
    for st in e.steps: st()
    t0=c(); x = loc.depth; t1=c(); x = loc.held; t2=c()
    with lk: pass
    t3=c(); y = d.get(get_ident()); t4=c()
    BUDGET.release(); t5=c()
    rows.append([t1-t0, t2-t1, t3-t2, t4-t3, t5-t4])
print("local.depth, local.held, lock, dict[get_ident], release after:",
      np.median(np.array(rows), 0) / 1e3)
