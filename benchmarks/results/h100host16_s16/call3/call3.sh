#!/usr/bin/env bash
# session 16, call 3: STALL_MIN_SPAN_S 0.02 -> 0.25 (working tree). After-ORT probe, the 16-core
# table b1 / b8, and the stall adaptation beside 2 spinning processes (still adapts?)
set -u
mkdir -p /tmp/lib /tmp/c3 && xz -dc devrun/s16/libdnnl.so.3.xz > /tmp/lib/libdnnl.so.3
export PGX_ONEDNN_LIB=/tmp/lib/libdnnl.so.3 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O=/tmp/c3
{ date; nproc; uptime; grep -n "^STALL_MIN_SPAN_S" pygraphx/targets/cpu/threads.py; } > $O/env.txt 2>&1
timeout 150 python benchmarks/adapt16_after_ort.py --threads 16 --rounds 4 --models resnet50:1 mobilenetv2:8 mobilenetv2:1 --json $O/after_ort.json > $O/after_ort.txt 2>&1
{ date; uptime; } >> $O/env.txt 2>&1
P=benchmarks/cpu_threads_probe.py
for r in 1 2; do
timeout 110 python $P --ab --max-runs 60 --seconds 0.3 --rounds 3 --batch 1 --models resnet50 mobilenetv2 bert_base gpt2 --engines on@16 ort@16 --json $O/t16_b1_r$r.json > $O/t16_b1_r$r.txt 2>&1
timeout 150 python $P --ab --max-runs 60 --seconds 0.3 --rounds 4 --batch 8 --models resnet50 mobilenetv2 bert_base gpt2 --engines on@16 ort@16 --json $O/t16_b8_r$r.json > $O/t16_b8_r$r.txt 2>&1
{ date; uptime; } >> $O/env.txt 2>&1
done
timeout 150 python benchmarks/adapt15_probe.py --threads 16 --spinners 0 2 --rounds 2 --models mobilenetv2 resnet50 --json $O/spin2.json > $O/spin2.txt 2>&1
{ date; uptime; } >> $O/env.txt 2>&1
tar czf $OUT/call3.tgz -C /tmp c3
