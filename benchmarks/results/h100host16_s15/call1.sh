#!/usr/bin/env bash
# session 15, call 1: native kernels build on the host; mnv15's head / stem switches at 16 threads;
# the 16-core b1 table (4 models) on main with mnv15 + attn15 + hyg15; one tarball back
set -u
mkdir -p /tmp/lib /tmp/c1 && xz -dc devrun/s15/libdnnl.so.3.xz > /tmp/lib/libdnnl.so.3
export PGX_ONEDNN_LIB=/tmp/lib/libdnnl.so.3 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O=/tmp/c1
{ date; nproc; uptime; } > $O/env.txt 2>&1
python -c "from pygraphx.targets.native import compiler as c; [print(k, c.load(k)._name) for k in ('winograd_f43','mbconv','layernorm')]; from pygraphx.targets.torch_lowering import native_attention as a; print(a.kernel())" >> $O/env.txt 2>&1
timeout 100 python benchmarks/mnv15_probe16.py --threads 16 --rounds 6 --runs 20 --json $O/mnv15_probe16.json > $O/mnv15_probe16.txt 2>&1
{ date; uptime; } >> $O/env.txt 2>&1
timeout 170 python benchmarks/cpu_threads_probe.py --ab --max-runs 60 --seconds 0.3 --rounds 3 --batch 1 --models resnet50 mobilenetv2 bert_base gpt2 --engines on@16 ort@16 --json $O/t16_b1.json > $O/t16_b1.txt 2>&1
{ date; uptime; } >> $O/env.txt 2>&1
tar czf $OUT/call1.tgz -C /tmp c1
