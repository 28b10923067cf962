#!/usr/bin/env bash
# session 15, call 5: final main. The 16-core table b1 / b8 again (issue 10's rows), twice each
# (the host moves 10-25 % between calls), compile time; one tarball back
set -u
mkdir -p /tmp/lib /tmp/c5 && xz -dc devrun/s15/libdnnl.so.3.xz > /tmp/lib/libdnnl.so.3
export PGX_ONEDNN_LIB=/tmp/lib/libdnnl.so.3 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O=/tmp/c5
{ date; nproc; uptime; git log --oneline | head -1; } > $O/env.txt 2>&1
python -c "from pygraphx.targets.native import compiler as c; [print(k, c.load(k)._name) for k in ('winograd_f43','mbconv','layernorm','gelu')]" >> $O/env.txt 2>&1
for r in 1 2; do
timeout 120 python benchmarks/cpu_threads_probe.py --ab --max-runs 60 --seconds 0.3 --rounds 3 --batch 1 --models resnet50 mobilenetv2 bert_base gpt2 --engines on@16 ort@16 --json $O/t16_b1_r$r.json > $O/t16_b1_r$r.txt 2>&1
{ date; uptime; } >> $O/env.txt 2>&1
timeout 150 python benchmarks/cpu_threads_probe.py --ab --max-runs 60 --seconds 0.3 --rounds 4 --batch 8 --models resnet50 mobilenetv2 bert_base gpt2 --engines on@16 ort@16 --json $O/t16_b8_r$r.json > $O/t16_b8_r$r.txt 2>&1
{ date; uptime; } >> $O/env.txt 2>&1
done
timeout 60 python benchmarks/compile_time.py --models resnet50 --runs 3 --json $O/compile16.json > $O/compile16.txt 2>&1
tar czf $OUT/call5.tgz -C /tmp c5
