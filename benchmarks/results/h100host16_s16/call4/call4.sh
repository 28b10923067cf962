#!/usr/bin/env bash
# session 16, call 4: main with acc16 / gelu16 / mnv16 and the 0.25 s stall span. The 16-core
# table b1 / b8 twice (cpu_threads_probe --ab, now settling each block 0.2 s), compile time
set -u
mkdir -p /tmp/lib /tmp/c4 && xz -dc devrun/s16/libdnnl.so.3.xz > /tmp/lib/libdnnl.so.3
export PGX_ONEDNN_LIB=/tmp/lib/libdnnl.so.3 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O=/tmp/c4
{ date; nproc; uptime; git log --oneline | head -1; } > $O/env.txt 2>&1
python -c "from pygraphx.targets.native import compiler as c; [print(k, c.load(k)._name) for k in ('winograd_f43','mbconv','layernorm','gelu','attention')]" >> $O/env.txt 2>&1
P=benchmarks/cpu_threads_probe.py
for r in 1 2; do
timeout 130 python $P --ab --max-runs 60 --seconds 0.3 --rounds 3 --batch 1 --models resnet50 mobilenetv2 bert_base gpt2 --engines on@16 ort@16 --json $O/t16_b1_r$r.json > $O/t16_b1_r$r.txt 2>&1
timeout 170 python $P --ab --max-runs 60 --seconds 0.3 --rounds 4 --batch 8 --models resnet50 mobilenetv2 bert_base gpt2 --engines on@16 ort@16 --json $O/t16_b8_r$r.json > $O/t16_b8_r$r.txt 2>&1
{ date; uptime; } >> $O/env.txt 2>&1
done
timeout 60 python benchmarks/compile_time.py --models resnet50 --runs 3 --json $O/compile16.json > $O/compile16.txt 2>&1
tar czf $OUT/call4.tgz -C /tmp c4
