#!/bin/bash
# cputhr session 7, second host call: work rule A/B (in process), GOMP spin A/B (alternating
# processes), 2-core policy A/B, classifier GEMV kernel A/B (PGX_CPU_GEMM=addmm)
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/dnnl && xz -dc libdnnl.so.3.xz > /tmp/dnnl/libdnnl.so.3
export PGX_ONEDNN_LIB=/tmp/dnnl/libdnnl.so.3
cat /proc/loadavg
P=benchmarks/cpu_threads_probe.py
F="grep -v -i warn"
echo "## rule A/B, 16 threads"; timeout 70 python ab_rule.py 16 6 rule mobilenetv2 bert_base 2>&1 | $F
echo "## rule A/B, 2 cores"; taskset -c 0-1 timeout 40 python ab_rule.py 2 8 rule mobilenetv2 2>&1 | $F
for rep in 1 2; do for spin in 1000 10000; do
  echo "## spin $spin rep $rep"
  GOMP_SPINCOUNT=$spin timeout 60 python $P --ab --models mobilenetv2 bert_base resnet50 --threads 16 --rounds 2 --seconds 0.3 --max-runs 60 --json $OUT/spin${spin}_rep$rep.json 2>&1 | $F | grep -E "ms per run|faster|took"
done; done
echo "## GEMM addmm vs default, 16 threads"; timeout 40 python ab_rule.py 16 5 gemm mobilenetv2 resnet50 2>&1 | $F
echo "## GEMM addmm vs default, 2 cores"; taskset -c 0-1 timeout 40 python ab_rule.py 2 6 gemm mobilenetv2 2>&1 | $F
cat /proc/loadavg
