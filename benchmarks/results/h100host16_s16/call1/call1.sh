#!/usr/bin/env bash
# session 16, call 1: main 6e640a5 on the 16-core host. MobileNetV2's thread count (sweep with the
# stall adaptation off), its steps at 8 vs 16 threads (b1, b8), ResNet-50 b1 steps at 16, then the
# table b1 / b8 with the default target; one tarball back
set -u
mkdir -p /tmp/lib /tmp/c1 && xz -dc devrun/s16/libdnnl.so.3.xz > /tmp/lib/libdnnl.so.3
export PGX_ONEDNN_LIB=/tmp/lib/libdnnl.so.3 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O=/tmp/c1
{ date; nproc; uptime; git log --oneline | head -1; lscpu | head -20; } > $O/env.txt 2>&1
python -c "from pygraphx.targets.native import compiler as c; [print(k, c.load(k)._name) for k in ('winograd_f43','mbconv','layernorm','gelu','attention')]" >> $O/env.txt 2>&1
P=benchmarks/cpu_threads_probe.py
PGX_CPU_STALL_ADAPT=0 timeout 110 python $P --ab --max-runs 60 --seconds 0.3 --rounds 3 --batch 1 8 --models mobilenetv2 --engines on@4 on@8 on@12 on@16 ort@16 --json $O/mnv2_sweep.json > $O/mnv2_sweep.txt 2>&1
{ date; uptime; } >> $O/env.txt 2>&1
PGX_CPU_STALL_ADAPT=0 timeout 60 python $P --steps --runs 40 --threads 8 16 --batch 8 --models mobilenetv2 --json $O/mnv2_steps_b8.json > $O/mnv2_steps_b8.txt 2>&1
PGX_CPU_STALL_ADAPT=0 timeout 60 python $P --steps --runs 60 --threads 8 16 --batch 1 --models mobilenetv2 --json $O/mnv2_steps_b1.json > $O/mnv2_steps_b1.txt 2>&1
PGX_CPU_STALL_ADAPT=0 timeout 60 python $P --steps --runs 30 --threads 16 --batch 1 --models resnet50 --json $O/rn50_steps_b1.json > $O/rn50_steps_b1.txt 2>&1
{ date; uptime; } >> $O/env.txt 2>&1
timeout 110 python $P --ab --max-runs 60 --seconds 0.3 --rounds 3 --batch 1 --models resnet50 mobilenetv2 bert_base gpt2 --engines on@16 ort@16 --json $O/t16_b1.json > $O/t16_b1.txt 2>&1
{ date; uptime; } >> $O/env.txt 2>&1
timeout 150 python $P --ab --max-runs 60 --seconds 0.3 --rounds 4 --batch 8 --models resnet50 mobilenetv2 bert_base gpt2 --engines on@16 ort@16 --json $O/t16_b8.json > $O/t16_b8.txt 2>&1
{ date; uptime; } >> $O/env.txt 2>&1
tar czf $OUT/call1.tgz -C /tmp c1
