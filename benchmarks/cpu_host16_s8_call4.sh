#!/bin/bash
# cpuhost session 8, fourth host call: pygraphx alone at batch 1, 16 threads, processes at
# GOMP_SPINCOUNT 10000 (default) / 100000 / 1000000 and OMP_WAIT_POLICY=active alternating, twice
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/d && xz -dc libdnnl.so.3.xz > /tmp/d/libdnnl.so.3
export PGX_ONEDNN_LIB=/tmp/d/libdnnl.so.3
cat /proc/loadavg
P=benchmarks/cpu_threads_probe.py
AB=(--ab --seconds 0.3 --max-runs 60 --rounds 3 --batch 1 --models resnet50 mobilenetv2 --engines on@16)
for rep in 1 2; do
  for cfg in spin10000 spin100000 spin1000000 active; do
    if [ $cfg = active ]; then E="OMP_WAIT_POLICY=active"; else E="GOMP_SPINCOUNT=${cfg#spin}"; fi
    echo "## $cfg rep $rep"
    env $E timeout 20 python $P "${AB[@]}" --json $OUT/${cfg}_$rep.json 2>&1 | grep -E "ms per"
  done
done
cat /proc/loadavg
