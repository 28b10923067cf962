#!/usr/bin/env bash
# session 17, call 1: main 024e630 (session 16 end). The 16-core table b1 / b8 (baseline),
# ResNet-50 b8 at 16 threads per step (ours) and per node (ORT); one tarball back
set -u
mkdir -p /tmp/lib /tmp/c1 && xz -dc devrun/s17/libdnnl.so.3.xz > /tmp/lib/libdnnl.so.3
export PGX_ONEDNN_LIB=/tmp/lib/libdnnl.so.3 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O=/tmp/c1
{ date; nproc; uptime; lscpu | head -20; } > $O/env.txt 2>&1
P=benchmarks/cpu_threads_probe.py
timeout 130 python $P --ab --max-runs 60 --seconds 0.3 --rounds 3 --batch 1 --models resnet50 mobilenetv2 bert_base gpt2 --engines on@16 ort@16 --json $O/t16_b1.json > $O/t16_b1.txt 2>&1
timeout 170 python $P --ab --max-runs 60 --seconds 0.3 --rounds 4 --batch 8 --models resnet50 mobilenetv2 bert_base gpt2 --engines on@16 ort@16 --json $O/t16_b8.json > $O/t16_b8.txt 2>&1
{ date; uptime; } >> $O/env.txt 2>&1
timeout 90 python benchmarks/wino2_steps.py --batch 8 --threads 16 --layers > $O/rn_steps_b8_t16.txt 2>&1
timeout 90 python benchmarks/rn11_peers.py --batch 8 --threads 16 --runs 10 --layers > $O/rn_ort_b8_t16.txt 2>&1
{ date; uptime; } >> $O/env.txt 2>&1
tar czf $OUT/call1.tgz -C /tmp c1
