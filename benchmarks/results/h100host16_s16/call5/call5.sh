#!/usr/bin/env bash
# session 16, call 5: main with the review mends (leaky slow streak). The 16-core table b1 / b8,
# the stall adaptation beside 2 spinning processes, the after-ORT transients; one tarball back
set -u
mkdir -p /tmp/lib /tmp/c5 && xz -dc devrun/s16/libdnnl.so.3.xz > /tmp/lib/libdnnl.so.3
export PGX_ONEDNN_LIB=/tmp/lib/libdnnl.so.3 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O=/tmp/c5
{ date; nproc; uptime; git log --oneline | head -1; } > $O/env.txt 2>&1
P=benchmarks/cpu_threads_probe.py
timeout 130 python $P --ab --max-runs 60 --seconds 0.3 --rounds 3 --batch 1 --models resnet50 mobilenetv2 bert_base gpt2 --engines on@16 ort@16 --json $O/t16_b1.json > $O/t16_b1.txt 2>&1
timeout 170 python $P --ab --max-runs 60 --seconds 0.3 --rounds 4 --batch 8 --models resnet50 mobilenetv2 bert_base gpt2 --engines on@16 ort@16 --json $O/t16_b8.json > $O/t16_b8.txt 2>&1
{ date; uptime; } >> $O/env.txt 2>&1
timeout 100 python benchmarks/adapt15_probe.py --threads 16 --spinners 0 2 --rounds 2 --models mobilenetv2 resnet50 --json $O/spin2.json > $O/spin2.txt 2>&1
timeout 80 python benchmarks/adapt16_after_ort.py --threads 16 --rounds 3 --models resnet50:1 mobilenetv2:8 --json $O/after_ort.json > $O/after_ort.txt 2>&1
{ date; uptime; } >> $O/env.txt 2>&1
tar czf $OUT/call5.tgz -C /tmp c5
