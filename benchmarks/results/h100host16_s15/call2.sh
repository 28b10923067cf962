#!/usr/bin/env bash
# session 15, call 2: main with all five helpers merged. The 16-core table b1 / b8 (the target's
# default conv_output, arena), compile time, then stall adaptation beside k spinning processes
# (0, 2, 4; on / off / ORT) and the ORT-pool neighbour; one tarball back
set -u
mkdir -p /tmp/lib /tmp/c2 && xz -dc devrun/s15/libdnnl.so.3.xz > /tmp/lib/libdnnl.so.3
export PGX_ONEDNN_LIB=/tmp/lib/libdnnl.so.3 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O=/tmp/c2
{ date; nproc; uptime; } > $O/env.txt 2>&1
python -c "from pygraphx.targets.native import compiler as c; [print(k, c.load(k)._name) for k in ('winograd_f43','mbconv','layernorm','gelu')]" >> $O/env.txt 2>&1
timeout 120 python benchmarks/cpu_threads_probe.py --ab --max-runs 60 --seconds 0.3 --rounds 3 --batch 1 --models resnet50 mobilenetv2 bert_base gpt2 --engines on@16 ort@16 --json $O/t16_b1.json > $O/t16_b1.txt 2>&1
{ date; uptime; } >> $O/env.txt 2>&1
timeout 200 python benchmarks/cpu_threads_probe.py --ab --max-runs 60 --seconds 0.3 --rounds 5 --batch 8 --models resnet50 mobilenetv2 bert_base gpt2 --engines on@16 ort@16 --json $O/t16_b8.json > $O/t16_b8.txt 2>&1
{ date; uptime; } >> $O/env.txt 2>&1
timeout 60 python benchmarks/compile_time.py --models resnet50 --runs 3 --json $O/compile16.json > $O/compile16.txt 2>&1
timeout 200 python benchmarks/adapt15_probe.py --threads 16 --spinners 0 2 4 --recovery --json $O/adapt16_process.json > $O/adapt16_process.txt 2>&1
{ date; uptime; } >> $O/env.txt 2>&1
timeout 100 python benchmarks/adapt15_probe.py --threads 16 --neighbour ort-pool --spinners 0 1 --models mobilenetv2 bert_base --json $O/adapt16_ortpool.json > $O/adapt16_ortpool.txt 2>&1
{ date; uptime; } >> $O/env.txt 2>&1
tar czf $OUT/call2.tgz -C /tmp c2
