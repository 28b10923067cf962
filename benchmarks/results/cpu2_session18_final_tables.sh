#!/usr/bin/env bash
# session 17 final 2-core measurements on merged main (quiet machine: nothing else running)
set -u
cd /work/main
PY=".venv/bin/python"
export PYTHONPATH=.
R=benchmarks/results
rm -f ~/.cache/pygraphx/conv_choice-*.json; cat /proc/loadavg
date
$PY benchmarks/cpu_vs_peers.py --threads 2 --batches 1 8 --models resnet50 mobilenetv2 bert_base gpt2 --no-eager --warmup 2 --repeat 5 --json $R/cpu2_cpu_vs_peers_t2_session18_final.json > /tmp/f18_t2.log 2>&1
date
$PY benchmarks/cpu_vs_peers.py --threads 2 --batches 1 --models vit_b16 unet_small yolov8_style minilm --no-eager --warmup 2 --repeat 5 --json $R/cpu2_cpu_vs_peers_zoo_t2_session18_final.json > /tmp/f18_zoo.log 2>&1
date
$PY benchmarks/cpu_vs_peers.py --threads 1 --batches 1 8 --models resnet50 mobilenetv2 bert_base gpt2 --no-eager --no-bf16 --warmup 1 --repeat 3 --json $R/cpu2_cpu_vs_peers_t1_session18_final.json > /tmp/f18_t1.log 2>&1
date
$PY benchmarks/compile_time.py --models resnet50 --runs 3 --json $R/cpu2_compile_time_session18_final.json > /tmp/f18_compile.log 2>&1
date
$PY benchmarks/cpu_vs_peers.py --threads 2 --batches 1 --models mobilenetv2 gpt2 bert_base --no-eager --warmup 2 --repeat 5 --json $R/cpu2_cpu_vs_peers_t2_session18_final_rerun_b1.json > /tmp/f18_rerun.log 2>&1
date
$PY benchmarks/cpu_vs_peers.py --threads 2 --batches 1 --models vit_b16 minilm --no-eager --warmup 2 --repeat 5 --json $R/cpu2_cpu_vs_peers_zoo_t2_session18_final_rerun.json > /tmp/f18_zoo_rerun.log 2>&1
date
$PY benchmarks/cpu_vs_peers.py --threads 2 --batches 8 --models bert_base mobilenetv2 --no-eager --warmup 2 --repeat 5 --json $R/cpu2_cpu_vs_peers_t2_session18_final_rerun_b8.json > /tmp/f18_rerun_b8.log 2>&1
date
rm -f ~/.cache/pygraphx/conv_choice-*.json; cat /proc/loadavg
# reruns after the script (18:02-18:07, quiet), same flags:
# t1 --batches 1 --models mobilenetv2 bert_base -> cpu2_session18_final_t1_rerun.txt
# t2 --batches 1 --models bert_base mobilenetv2 -> cpu2_session18_final_rerun2_b1.txt
# t2 --batches 1 --models bert_base gpt2 -> rerun3_b1; --batches 8 --models gpt2 -> rerun3_b8
# t2 --batches 1 --models minilm -> rerun2_zoo; t1 --batches 1 --models bert_base -> t1_rerun2
