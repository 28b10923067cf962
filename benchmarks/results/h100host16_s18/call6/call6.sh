#!/usr/bin/env bash
# session 18, call 6: ResNet-50 b1 at 16 threads in the probe's process: why 10.9-12.7 ms there
# against 9.8 alone. Warm-up ~4 min first (a fresh VM is slow for its first minutes).
set -u
mkdir -p /tmp/lib /tmp/c6 && xz -dc devrun/s18/libdnnl.so.3.xz > /tmp/lib/libdnnl.so.3
export PGX_ONEDNN_LIB=/tmp/lib/libdnnl.so.3 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O=/tmp/c6; P=benchmarks/cpu_threads_probe.py
{ date; uptime; } > $O/env.txt
timeout 230 python $P --ab --max-runs 60 --seconds 0.3 --rounds 12 --batch 8 --models resnet50 mobilenetv2 --engines on@16 ort@16 > $O/warmup.txt 2>&1
{ date; uptime; } >> $O/env.txt
A="--ab --max-runs 60 --seconds 0.3 --rounds 5 --batch 1 --models resnet50"
timeout 60 python $P $A --engines on@16 ort@16 > $O/rn_default.txt 2>&1
timeout 60 env PGX_CPU_LOAD_ADAPT=0 python $P $A --engines on@16 ort@16 > $O/rn_adapt0.txt 2>&1
timeout 60 python $P $A --engines on@16 > $O/rn_alone.txt 2>&1
timeout 60 python $P $A --engines on@16 ort@16 --settle 1.0 > $O/rn_settle1.txt 2>&1
timeout 60 python $P $A --engines on@16 ort@16 > $O/rn_default2.txt 2>&1
{ date; uptime; } >> $O/env.txt
grep -E "ms, CPU|/ ORT|runs took" $O/rn_*.txt
tar czf $OUT/call6.tgz -C /tmp c6
