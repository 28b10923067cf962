#!/bin/bash
# cpuhost session 8, second host call: issue 10's table (4 models, batch 1 and 8, 16 threads)
# as alternating blocks with each engine's own CPU time, and two bounds for MobileNetV2 b1
# (every step on 16 threads; workers that never sleep, OMP_WAIT_POLICY=active)
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/d && xz -dc libdnnl.so.3.xz > /tmp/d/libdnnl.so.3
export PGX_ONEDNN_LIB=/tmp/d/libdnnl.so.3
cat /proc/loadavg
P=benchmarks/cpu_threads_probe.py
F="grep -v -i warn"
AB=(--ab --seconds 0.3 --max-runs 60 --rounds 3)
M=(--models resnet50 mobilenetv2 bert_base gpt2)
for b in 1 8; do
  echo "## table b$b"; timeout 80 python $P "${AB[@]}" "${M[@]}" --batch $b --engines on@16 ort@16 --json $OUT/table_b$b.json 2>&1 | $F | grep -E "ms per|took|ORT:"
done
echo "## mnv2 b1 policy off"; timeout 25 python $P "${AB[@]}" --models mobilenetv2 --batch 1 --engines on@16 off@16 ort@16 --json $OUT/mnv2_off.json 2>&1 | $F | grep -E "ms per|took|ORT:"
echo "## active wait"; OMP_WAIT_POLICY=active timeout 30 python $P "${AB[@]}" --models mobilenetv2 resnet50 --batch 1 --engines on@16 ort@16 --json $OUT/active.json 2>&1 | $F | grep -E "ms per|took|ORT:"
cat /proc/loadavg
