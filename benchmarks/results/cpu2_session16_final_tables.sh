#!/usr/bin/env bash
# session 14 final 2-core measurements on merged main (quiet machine: nothing else running)
set -u
cd /work/main
PY=".venv/bin/python"
export PYTHONPATH=.
R=benchmarks/results
rm -f ~/.cache/pygraphx/conv_choice-*.json; cat /proc/loadavg
date
$PY benchmarks/cpu_vs_peers.py --threads 2 --batches 1 8 --models resnet50 mobilenetv2 bert_base gpt2 --no-eager --warmup 2 --repeat 5 --json $R/cpu2_cpu_vs_peers_t2_session16_final.json > /tmp/f16_t2.log 2>&1
date
$PY benchmarks/cpu_vs_peers.py --threads 2 --batches 1 --models vit_b16 unet_small yolov8_style minilm --no-eager --warmup 2 --repeat 5 --json $R/cpu2_cpu_vs_peers_zoo_t2_session16_final.json > /tmp/f16_zoo.log 2>&1
date
$PY benchmarks/cpu_vs_peers.py --threads 1 --batches 1 8 --models resnet50 mobilenetv2 bert_base gpt2 --no-eager --no-bf16 --warmup 1 --repeat 3 --json $R/cpu2_cpu_vs_peers_t1_session16_final.json > /tmp/f16_t1.log 2>&1
date
$PY benchmarks/compile_time.py --models resnet50 --runs 3 --json $R/cpu2_compile_time_session16_final.json > /tmp/f16_compile.log 2>&1
date
$PY benchmarks/cpu_vs_peers.py --threads 2 --batches 1 --models mobilenetv2 gpt2 bert_base --no-eager --warmup 2 --repeat 5 --json $R/cpu2_cpu_vs_peers_t2_session16_final_rerun_b1.json > /tmp/f16_rerun.log 2>&1
date
rm -f ~/.cache/pygraphx/conv_choice-*.json; cat /proc/loadavg
