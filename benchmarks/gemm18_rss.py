"""gemm18: resident memory added by compiling GPT-2 b1 and one run, under settings `K=V`.

    PYTHONPATH=. python benchmarks/gemm18_rss.py PGX_CPU_GEMM_WIDE=0
"""
import sys, os, resource
sys.path.insert(0, str(__import__('pathlib').Path(__file__).resolve().parents[1]))
from benchmarks.ab_harness import load, compile_variant, parse_variant
case = load('gpt2:1')
def rss():
    for l in open('/proc/self/status'):
        if l.startswith('VmRSS'): return int(l.split()[1]) // 1024
r0 = rss()
prog = compile_variant(case, 1, parse_variant('x:' + sys.argv[1]))
prog.run(case.feeds)
print(sys.argv[1] or 'default', 'RSS MB after compile+run', rss() - r0)
