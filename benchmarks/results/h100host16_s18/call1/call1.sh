#!/usr/bin/env bash
# session 18, call 1: main 2b1daca (session 17's code + tidy18). Warm the machine up first,
# then the 16-core table b1 / b8 (each engine in its own blocks); one tarball back
set -u
mkdir -p /tmp/lib /tmp/c1 && xz -dc devrun/s18/libdnnl.so.3.xz > /tmp/lib/libdnnl.so.3
export PGX_ONEDNN_LIB=/tmp/lib/libdnnl.so.3 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O=/tmp/c1
{ date; nproc; uptime; git log --oneline 2>/dev/null | head -1; lscpu | grep -E "Model name|^CPU\(s\)|Thread|NUMA node0"; python -c "import torch, onnxruntime; print(torch.__version__, onnxruntime.__version__)"; } > $O/env.txt 2>&1
P=benchmarks/cpu_threads_probe.py
timeout 70 python $P --ab --max-runs 20 --seconds 0.2 --rounds 1 --batch 8 --models resnet50 --engines on@16 ort@16 > $O/warmup.txt 2>&1
{ date; uptime; } >> $O/env.txt 2>&1
timeout 150 python $P --ab --max-runs 60 --seconds 0.3 --rounds 3 --batch 1 --models resnet50 mobilenetv2 bert_base gpt2 --engines on@16 ort@16 --json $O/t16_b1.json > $O/t16_b1.txt 2>&1
{ date; uptime; } >> $O/env.txt 2>&1
timeout 240 python $P --ab --max-runs 60 --seconds 0.3 --rounds 5 --batch 8 --models resnet50 mobilenetv2 bert_base gpt2 --engines on@16 ort@16 --json $O/t16_b8.json > $O/t16_b8.txt 2>&1
{ date; uptime; } >> $O/env.txt 2>&1
tar czf $OUT/call1.tgz -C /tmp c1
