#!/usr/bin/env bash
# session 13, 16-core host: native kernels (gcc?), Winograd at 16 threads, the issue-10 table
set -u
mkdir -p /tmp/lib && xz -dc devrun/s13/libdnnl.so.3.xz > /tmp/lib/libdnnl.so.3
export PGX_ONEDNN_LIB=/tmp/lib/libdnnl.so.3 PYTHONPATH=$PWD
PART=${1:-all}
{ date; nproc; lscpu | grep -E "Model name|Flags" | cut -c1-400; which gcc cc; gcc --version | head -1; python -c "import torch, onnxruntime; print(torch.__version__, onnxruntime.__version__)"; } > $OUT/env.txt 2>&1
python -c "
import torch
from pygraphx.targets.native import compiler as c
for k in ('attention','winograd_f43'):
    try:
        lib=c.load(k); print(k,'built', lib._name)
    except c.NativeUnavailable as e: print(k,'UNAVAILABLE',e)
" >> $OUT/env.txt 2>&1
if [ "$PART" = all ] || [ "$PART" = wino ]; then
  PGX_CONV_CHOICE_CACHE=off timeout 200 python benchmarks/wino2_e2e.py --models resnet50:8 resnet50:1 --threads 16 --rounds 4 --repeat 5 --modes off rule:64:64 rule:128:128 ort > $OUT/wino16.txt 2>&1
fi
if [ "$PART" = all ] || [ "$PART" = table ]; then
  timeout 170 python benchmarks/cpu_threads_probe.py --ab --max-runs 60 --seconds 0.3 --rounds 3 --batch 1 --models resnet50 mobilenetv2 bert_base gpt2 --engines on@16 ort@16 --json $OUT/table16_b1.json > $OUT/table16_b1.txt 2>&1
  timeout 200 python benchmarks/cpu_threads_probe.py --ab --max-runs 60 --seconds 0.3 --rounds 5 --batch 8 --models resnet50 mobilenetv2 bert_base gpt2 --engines on@16 ort@16 --json $OUT/table16_b8.json > $OUT/table16_b8.txt 2>&1
fi
date >> $OUT/env.txt
#!/usr/bin/env bash
# session 13: the native Winograd rule above 2 threads (off = no Winograd; rule = main's new default)
set -u
mkdir -p /tmp/lib && xz -dc devrun/s13/libdnnl.so.3.xz > /tmp/lib/libdnnl.so.3
export PGX_ONEDNN_LIB=/tmp/lib/libdnnl.so.3 PYTHONPATH=$PWD
for t in 16 8 4; do
  PGX_CONV_CHOICE_CACHE=off timeout 170 python benchmarks/wino2_e2e.py --models resnet50:8 resnet50:1 --threads $t --rounds 4 --repeat 5 --modes off rule ort > $OUT/wino_t$t.txt 2>&1
done
timeout 120 python benchmarks/cpu_threads_probe.py --ab --max-runs 60 --seconds 0.3 --rounds 5 --batch 8 1 --models resnet50 --engines on@16 ort@16 --json $OUT/table16_resnet.json > $OUT/table16_resnet.txt 2>&1
#!/usr/bin/env bash
# session 13 final: the issue-10 16-core table on merged main, then a repeat of the CNN rows, and compile time
set -u
mkdir -p /tmp/lib && xz -dc devrun/s13/libdnnl.so.3.xz > /tmp/lib/libdnnl.so.3
export PGX_ONEDNN_LIB=/tmp/lib/libdnnl.so.3 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
{ date; git log --oneline | head -1; } > $OUT/final_env.txt 2>&1
python -c "from pygraphx.targets.native import compiler as c; [print(k, c.load(k)._name) for k in ('attention','winograd_f43')]" >> $OUT/final_env.txt 2>&1
timeout 170 python benchmarks/cpu_threads_probe.py --ab --max-runs 60 --seconds 0.3 --rounds 3 --batch 1 --models resnet50 mobilenetv2 bert_base gpt2 --engines on@16 ort@16 --json $OUT/final16_b1.json > $OUT/final16_b1.txt 2>&1
timeout 200 python benchmarks/cpu_threads_probe.py --ab --max-runs 60 --seconds 0.3 --rounds 5 --batch 8 --models resnet50 mobilenetv2 bert_base gpt2 --engines on@16 ort@16 --json $OUT/final16_b8.json > $OUT/final16_b8.txt 2>&1
timeout 120 python benchmarks/cpu_threads_probe.py --ab --max-runs 60 --seconds 0.3 --rounds 5 --batch 1 8 --models resnet50 mobilenetv2 --engines on@16 ort@16 --json $OUT/final16_cnn_repeat.json > $OUT/final16_cnn_repeat.txt 2>&1
timeout 90 python benchmarks/compile_time.py --models resnet50 --runs 3 --json $OUT/final16_compile.json > $OUT/final16_compile.txt 2>&1
date >> $OUT/final_env.txt
