#!/usr/bin/env bash
# session 18, call 7: the final 16-core table on main after every merge. ~200 s warm-up first
# (a fresh VM runs slow for its first 3-4 minutes: calls 1-2), then b1 and b8, 5 rounds each
set -u
mkdir -p /tmp/lib /tmp/c7 && xz -dc devrun/s18/libdnnl.so.3.xz > /tmp/lib/libdnnl.so.3
export PGX_ONEDNN_LIB=/tmp/lib/libdnnl.so.3 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O=/tmp/c7; P=benchmarks/cpu_threads_probe.py
{ date; uptime; } > $O/env.txt
end=$((SECONDS + 200))
while [ $SECONDS -lt $end ]; do
  timeout 120 python $P --ab --max-runs 60 --seconds 0.3 --rounds 3 --batch 8 --models resnet50 gpt2 --engines on@16 ort@16 >> $O/warmup.txt 2>&1
done
{ date; uptime; } >> $O/env.txt
timeout 130 python $P --ab --max-runs 60 --seconds 0.3 --rounds 5 --batch 1 --models resnet50 mobilenetv2 bert_base gpt2 --engines on@16 ort@16 --json $O/t16_b1.json > $O/t16_b1.txt 2>&1
{ date; uptime; } >> $O/env.txt
timeout 200 python $P --ab --max-runs 60 --seconds 0.3 --rounds 5 --batch 8 --models resnet50 mobilenetv2 bert_base gpt2 --engines on@16 ort@16 --json $O/t16_b8.json > $O/t16_b8.txt 2>&1
{ date; uptime; } >> $O/env.txt
grep -E "ms, CPU|/ ORT" $O/t16_b*.txt
tar czf $OUT/call7.tgz -C /tmp c7
