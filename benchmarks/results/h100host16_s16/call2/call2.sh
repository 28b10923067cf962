#!/usr/bin/env bash
# session 16, call 2: what an ORT block does to the next pgx runs (adaptation on / off), and the
# step times of MobileNetV2 (8 vs 16 threads) and ResNet-50 b1 (the probe's --steps fixed)
set -u
mkdir -p /tmp/lib /tmp/c2 && xz -dc devrun/s16/libdnnl.so.3.xz > /tmp/lib/libdnnl.so.3
export PGX_ONEDNN_LIB=/tmp/lib/libdnnl.so.3 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O=/tmp/c2
{ date; nproc; uptime; } > $O/env.txt 2>&1
timeout 200 python benchmarks/adapt16_after_ort.py --threads 16 --rounds 4 --models resnet50:1 mobilenetv2:8 mobilenetv2:1 bert_base:8 --json $O/after_ort.json > $O/after_ort.txt 2>&1
{ date; uptime; } >> $O/env.txt 2>&1
P=benchmarks/cpu_threads_probe.py
PGX_CPU_STALL_ADAPT=0 timeout 60 python $P --steps --runs 40 --threads 8 16 --batch 8 --models mobilenetv2 --json $O/mnv2_steps_b8.json > $O/mnv2_steps_b8.txt 2>&1
PGX_CPU_STALL_ADAPT=0 timeout 60 python $P --steps --runs 30 --threads 16 --batch 1 --models resnet50 --json $O/rn50_steps_b1.json > $O/rn50_steps_b1.txt 2>&1
{ date; uptime; } >> $O/env.txt 2>&1
tar czf $OUT/call2.tgz -C /tmp c2
