#!/bin/bash
# cputhr session 7: per-step times, churn, spin counts, load adaptation, 2-core A/B on the 16-core host
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/dnnl && xz -dc libdnnl.so.3.xz > /tmp/dnnl/libdnnl.so.3
export PGX_ONEDNN_LIB=/tmp/dnnl/libdnnl.so.3
lscpu | grep -E "Model name|^CPU\(s\)"; cat /proc/loadavg
python -c "import torch, onnxruntime; print('## torch', torch.__version__, 'ort', onnxruntime.__version__)"
P=benchmarks/cpu_threads_probe.py
F="grep -v -i warn"
echo "## steps mnv2"; timeout 70 python $P --steps --models mobilenetv2 --threads 1 4 16 --runs 40 --json $OUT/steps_mnv2.json > $OUT/steps_mnv2.txt 2>&1; head -c 300 $OUT/steps_mnv2.txt | $F; grep "^##" $OUT/steps_mnv2.txt
echo "## steps r50"; timeout 50 python $P --steps --models resnet50 --threads 16 --runs 20 --json $OUT/steps_r50.json > $OUT/steps_r50.txt 2>&1; grep "^##" $OUT/steps_r50.txt
echo "## churn"; timeout 40 python $P --churn --models mobilenetv2 --threads 8 16 2>&1 | $F
echo "## ab spin"; timeout 160 python $P --ab --models mobilenetv2 bert_base --threads 16 --rounds 4 --seconds 0.3 --max-runs 60 --spincounts 1000 10000 50000 --json $OUT/ab_spin.json 2>&1 | $F
echo "## ab load adapt off"; PGX_CPU_LOAD_ADAPT=0 timeout 40 python $P --ab --models mobilenetv2 --threads 16 --rounds 4 --seconds 0.3 --max-runs 60 2>&1 | $F | grep -v "^|"
echo "## ab 2 cores"; taskset -c 0-1 timeout 50 python $P --ab --models mobilenetv2 --threads 2 --rounds 8 --seconds 0.4 --max-runs 60 --json $OUT/ab_t2.json 2>&1 | $F
cat /proc/loadavg
