#!/usr/bin/env bash
# session 17, call 3: is ResNet-50 b8 at 16 threads slow in the process that measured the
# convolution choices (call 1: 121.5 ms, cache written in that process) and not in later ones?
set -u
mkdir -p /tmp/lib /tmp/c3 && xz -dc devrun/s17/libdnnl.so.3.xz > /tmp/lib/libdnnl.so.3
export PGX_ONEDNN_LIB=/tmp/lib/libdnnl.so.3 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O=/tmp/c3
P=benchmarks/cpu_threads_probe.py
for i in 1 2 3; do
  rm -f ~/.cache/pygraphx/conv_choice-*.json
  { date; uptime; } >> $O/env.txt 2>&1
  timeout 100 python $P --ab --max-runs 60 --seconds 0.3 --rounds 3 --batch 8 --models resnet50 --engines on@16 ort@16 --json $O/fresh$i.json > $O/fresh$i.txt 2>&1
  cp ~/.cache/pygraphx/conv_choice-*.json $O/choice_fresh$i.json
  timeout 100 python $P --ab --max-runs 60 --seconds 0.3 --rounds 3 --batch 8 --models resnet50 --engines on@16 ort@16 --json $O/cached$i.json > $O/cached$i.txt 2>&1
done
{ date; uptime; } >> $O/env.txt 2>&1
tar czf $OUT/call3.tgz -C /tmp c3
