#!/usr/bin/env bash
# session 17, call 5: main 80e20f5 (all of the session but bfmnv17, a bf16 2-thread rule). Warm the machine up
# first (call 1 started 0 min after boot: ResNet-50 b8 at 121 ms, 63 ms in later calls), then the
# 16-core table b1 / b8; one tarball back
set -u
mkdir -p /tmp/lib /tmp/c5 && xz -dc devrun/s17/libdnnl.so.3.xz > /tmp/lib/libdnnl.so.3
export PGX_ONEDNN_LIB=/tmp/lib/libdnnl.so.3 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O=/tmp/c5
{ date; uptime; git log --oneline 2>/dev/null | head -1; } > $O/env.txt 2>&1
P=benchmarks/cpu_threads_probe.py
timeout 60 python $P --ab --max-runs 20 --seconds 0.2 --rounds 1 --batch 8 --models resnet50 --engines on@16 ort@16 > $O/warmup.txt 2>&1
{ date; uptime; } >> $O/env.txt 2>&1
timeout 130 python $P --ab --max-runs 60 --seconds 0.3 --rounds 3 --batch 1 --models resnet50 mobilenetv2 bert_base gpt2 --engines on@16 ort@16 --json $O/t16_b1.json > $O/t16_b1.txt 2>&1
{ date; uptime; } >> $O/env.txt 2>&1
timeout 220 python $P --ab --max-runs 60 --seconds 0.3 --rounds 5 --batch 8 --models resnet50 mobilenetv2 bert_base gpt2 --engines on@16 ort@16 --json $O/t16_b8.json > $O/t16_b8.txt 2>&1
{ date; uptime; } >> $O/env.txt 2>&1
tar czf $OUT/call5.tgz -C /tmp c5
