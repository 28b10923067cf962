#!/usr/bin/env bash
# session 17, call 2: ResNet-50 b8 at 16 threads was 121.5 ms vs ORT 73.6 in call 1 (CPU 0.97x):
# again, policy on / off / load adaptation off, and the machine's state
set -u
mkdir -p /tmp/lib /tmp/c2 && xz -dc devrun/s17/libdnnl.so.3.xz > /tmp/lib/libdnnl.so.3
export PGX_ONEDNN_LIB=/tmp/lib/libdnnl.so.3 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O=/tmp/c2
{ date; uptime; ls -la ~/.cache/pygraphx 2>&1; top -bn1 | head -20; } > $O/env.txt 2>&1
P=benchmarks/cpu_threads_probe.py
timeout 100 python $P --ab --max-runs 60 --seconds 0.3 --rounds 4 --batch 8 --models resnet50 --engines on@16 off@16 ort@16 --json $O/rn_b8_a.json > $O/rn_b8_a.txt 2>&1
{ date; uptime; } >> $O/env.txt 2>&1
PGX_CPU_LOAD_ADAPT=0 timeout 100 python $P --ab --max-runs 60 --seconds 0.3 --rounds 4 --batch 8 --models resnet50 --engines on@16 ort@16 --json $O/rn_b8_noadapt.json > $O/rn_b8_noadapt.txt 2>&1
{ date; uptime; } >> $O/env.txt 2>&1
timeout 100 python $P --ab --max-runs 60 --seconds 0.3 --rounds 4 --batch 8 --models resnet50 --engines on@16 ort@16 --json $O/rn_b8_b.json > $O/rn_b8_b.txt 2>&1
timeout 60 python benchmarks/chain11_run_phases.py --help > $O/phases_help.txt 2>&1
{ date; uptime; top -bn1 | head -20; } >> $O/env.txt 2>&1
tar czf $OUT/call2.tgz -C /tmp c2
