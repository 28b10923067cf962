#!/bin/bash
# cpuhost session 8, first host call: where MobileNetV2 b8's process CPU time goes (each
# engine's own threads vs ORT's pool), 16 vs 8 threads on MobileNetV2, OpenMP binding, spin 1000
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/d && xz -dc libdnnl.so.3.xz > /tmp/d/libdnnl.so.3
export PGX_ONEDNN_LIB=/tmp/d/libdnnl.so.3
nproc; lscpu | grep -E "Model name|Thread|Core|Socket|NUMA node"; cat /proc/loadavg
P=benchmarks/cpu_threads_probe.py
F="grep -v -i warn"
AB=(--ab --seconds 0.25 --max-runs 60)
echo "## b1 default"; timeout 45 python $P "${AB[@]}" --models mobilenetv2 resnet50 --batch 1 --rounds 3 --engines on@16 on@8 ort@16 --json $OUT/b1.json 2>&1 | $F | grep -E "ms per|took"
echo "## b8 default"; timeout 35 python $P "${AB[@]}" --models mobilenetv2 --batch 8 --rounds 4 --engines on@16 on@8 ort@16 --json $OUT/b8.json 2>&1 | $F | grep -E "ms per|took"
echo "## bind close/cores"; OMP_PLACES=cores OMP_PROC_BIND=close timeout 40 python $P "${AB[@]}" --unpin-caller --models mobilenetv2 resnet50 --batch 1 --rounds 3 --engines on@16 ort@16 --json $OUT/b1_bind.json 2>&1 | $F | grep -E "ms per|took"
echo "## b8 spin 1000"; GOMP_SPINCOUNT=1000 timeout 25 python $P "${AB[@]}" --models mobilenetv2 --batch 8 --rounds 3 --engines on@16 ort@16 --json $OUT/b8_spin1000.json 2>&1 | $F | grep -E "ms per|took"
cat /proc/loadavg
