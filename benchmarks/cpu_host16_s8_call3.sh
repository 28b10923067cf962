#!/bin/bash
# cpuhost session 8, third host call: pygraphx alone (no ORT pool in the process) at the default
# spin (10000), GOMP_SPINCOUNT 100000 and OMP_WAIT_POLICY=active; then 100000 beside ORT
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/d && xz -dc libdnnl.so.3.xz > /tmp/d/libdnnl.so.3
export PGX_ONEDNN_LIB=/tmp/d/libdnnl.so.3
cat /proc/loadavg
P=benchmarks/cpu_threads_probe.py
F="grep -v -i warn"
AB=(--ab --seconds 0.3 --max-runs 60 --rounds 3 --batch 1)
M=(--models resnet50 mobilenetv2 bert_base)
echo "## alone, default"; timeout 30 python $P "${AB[@]}" "${M[@]}" --engines on@16 --json $OUT/alone_default.json 2>&1 | $F | grep -E "ms per|took|ORT:"
echo "## alone, active"; OMP_WAIT_POLICY=active timeout 30 python $P "${AB[@]}" "${M[@]}" --engines on@16 --json $OUT/alone_active.json 2>&1 | $F | grep -E "ms per|took|ORT:"
echo "## alone, spin 100000"; GOMP_SPINCOUNT=100000 timeout 30 python $P "${AB[@]}" "${M[@]}" --engines on@16 --json $OUT/alone_spin1e5.json 2>&1 | $F | grep -E "ms per|took|ORT:"
echo "## with ORT, spin 100000"; GOMP_SPINCOUNT=100000 timeout 30 python $P "${AB[@]}" --models resnet50 mobilenetv2 --engines on@16 ort@16 --json $OUT/ort_spin1e5.json 2>&1 | $F | grep -E "ms per|took|ORT:"
cat /proc/loadavg
