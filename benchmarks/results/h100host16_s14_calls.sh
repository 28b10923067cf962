# === probe16.sh
#!/usr/bin/env bash
# session 14, call 1: native kernels build on the host; MobileNetV2's native blocks at 16 threads
# (per shape, then end to end rule / all against the oneDNN route); the 16-core b1 table
set -u
mkdir -p /tmp/lib && xz -dc devrun/s14/libdnnl.so.3.xz > /tmp/lib/libdnnl.so.3
export PGX_ONEDNN_LIB=/tmp/lib/libdnnl.so.3 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
{ date; git log --oneline | head -1; nproc; } > $OUT/env.txt 2>&1
python -c "from pygraphx.targets.native import compiler as c; [print(k, c.load(k)._name) for k in ('attention','winograd_f43','mbconv','layernorm')]" >> $OUT/env.txt 2>&1
for b in 1 8; do
  timeout 80 python benchmarks/mbv14_blocks.py --threads 16 --batch $b --json $OUT/blocks16_b$b.json > $OUT/blocks16_b$b.txt 2>&1
done
timeout 60 python benchmarks/mbv14_ab.py --threads 16 --batch 1 --rounds 6 --runs 20 --json $OUT/ab16_b1_rule.json > $OUT/ab16_b1_rule.txt 2>&1
timeout 60 python benchmarks/mbv14_ab.py --threads 16 --batch 1 --rounds 6 --runs 20 --all --json $OUT/ab16_b1_all.json > $OUT/ab16_b1_all.txt 2>&1
timeout 60 python benchmarks/mbv14_ab.py --threads 16 --batch 8 --rounds 4 --runs 8 --json $OUT/ab16_b8_rule.json > $OUT/ab16_b8_rule.txt 2>&1
timeout 60 python benchmarks/mbv14_ab.py --threads 16 --batch 8 --rounds 4 --runs 8 --all --json $OUT/ab16_b8_all.json > $OUT/ab16_b8_all.txt 2>&1
timeout 170 python benchmarks/cpu_threads_probe.py --ab --max-runs 60 --seconds 0.3 --rounds 3 --batch 1 --models resnet50 mobilenetv2 bert_base gpt2 --engines on@16 ort@16 --json $OUT/t16_b1.json > $OUT/t16_b1.txt 2>&1
date >> $OUT/env.txt
# === probe16b.sh
#!/usr/bin/env bash
# session 14, call 2: per-shape native blocks at 16 threads, longer end-to-end A/B, the b1 table; one tarball back
set -u
mkdir -p /tmp/lib /tmp/o && xz -dc devrun/s14/libdnnl.so.3.xz > /tmp/lib/libdnnl.so.3
export PGX_ONEDNN_LIB=/tmp/lib/libdnnl.so.3 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O=/tmp/o
{ date; git log --oneline | head -1; nproc; } > $O/env.txt 2>&1
for b in 1 8; do
  timeout 100 python benchmarks/mbv14_blocks.py --threads 16 --batch $b --json $O/blocks16_b$b.json > $O/blocks16_b$b.txt 2>&1
done
timeout 90 python benchmarks/mbv14_ab.py --threads 16 --batch 1 --rounds 12 --runs 40 --all --json $O/ab16_b1_all2.json > $O/ab16_b1_all2.txt 2>&1
timeout 90 python benchmarks/mbv14_ab.py --threads 16 --batch 8 --rounds 8 --runs 10 --all --new-first --json $O/ab16_b8_all2.json > $O/ab16_b8_all2.txt 2>&1
timeout 170 python benchmarks/cpu_threads_probe.py --ab --max-runs 60 --seconds 0.3 --rounds 3 --batch 1 --models resnet50 mobilenetv2 bert_base gpt2 --engines on@16 ort@16 --json $O/t16_b1.json > $O/t16_b1.txt 2>&1
date >> $O/env.txt
tar czf $OUT/probe16b.tgz -C /tmp o
# === probe16c.sh
#!/usr/bin/env bash
# session 14, call 3: per-shape native blocks at 16 threads (b1, b8); the b8 table; one tarball back
set -u
mkdir -p /tmp/lib /tmp/o3 && xz -dc devrun/s14/libdnnl.so.3.xz > /tmp/lib/libdnnl.so.3
export PGX_ONEDNN_LIB=/tmp/lib/libdnnl.so.3 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O=/tmp/o3
for b in 1 8; do
  timeout 120 python benchmarks/mbv14_blocks.py --threads 16 --batch $b --json $O/blocks16_b$b.json > $O/blocks16_b$b.txt 2>&1
done
timeout 200 python benchmarks/cpu_threads_probe.py --ab --max-runs 60 --seconds 0.3 --rounds 5 --batch 8 --models resnet50 mobilenetv2 bert_base gpt2 --engines on@16 ort@16 --json $O/t16_b8.json > $O/t16_b8.txt 2>&1
tar czf $OUT/probe16c.tgz -C /tmp o3
# === final16.sh
#!/usr/bin/env bash
# session 14, call 4: MobileNetV2 at 16 threads with the measured rule (A/B against the oneDNN route),
# then the issue-10 16-core table b1 and b8 on the final main and compile time; one tarball back
set -u
mkdir -p /tmp/lib /tmp/f && xz -dc devrun/s14/libdnnl.so.3.xz > /tmp/lib/libdnnl.so.3
export PGX_ONEDNN_LIB=/tmp/lib/libdnnl.so.3 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O=/tmp/f
{ date; git log --oneline | head -1; } > $O/env.txt 2>&1
timeout 90 python benchmarks/mbv14_ab.py --threads 16 --batch 1 --rounds 12 --runs 40 --json $O/ab16_b1_rule.json > $O/ab16_b1_rule.txt 2>&1
timeout 90 python benchmarks/mbv14_ab.py --threads 16 --batch 8 --rounds 8 --runs 10 --new-first --json $O/ab16_b8_rule.json > $O/ab16_b8_rule.txt 2>&1
timeout 170 python benchmarks/cpu_threads_probe.py --ab --max-runs 60 --seconds 0.3 --rounds 3 --batch 1 --models resnet50 mobilenetv2 bert_base gpt2 --engines on@16 ort@16 --json $O/final16_b1.json > $O/final16_b1.txt 2>&1
timeout 200 python benchmarks/cpu_threads_probe.py --ab --max-runs 60 --seconds 0.3 --rounds 5 --batch 8 --models resnet50 mobilenetv2 bert_base gpt2 --engines on@16 ort@16 --json $O/final16_b8.json > $O/final16_b8.txt 2>&1
timeout 120 python benchmarks/cpu_threads_probe.py --ab --max-runs 60 --seconds 0.3 --rounds 5 --batch 1 8 --models resnet50 mobilenetv2 --engines on@16 ort@16 --json $O/final16_cnn_repeat.json > $O/final16_cnn_repeat.txt 2>&1
timeout 60 python benchmarks/compile_time.py --models resnet50 --runs 3 --json $O/final16_compile.json > $O/final16_compile.txt 2>&1
date >> $O/env.txt
tar czf $OUT/final16.tgz -C /tmp f
# === diag16.sh
#!/usr/bin/env bash
# session 14, call 5: is the host busy? top processes, then the b1/b8 table again
set -u
mkdir -p /tmp/lib /tmp/d && xz -dc devrun/s14/libdnnl.so.3.xz > /tmp/lib/libdnnl.so.3
export PGX_ONEDNN_LIB=/tmp/lib/libdnnl.so.3 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O=/tmp/d
{ date; uptime; ps aux --sort=-%cpu | head -8; grep -c processor /proc/cpuinfo; head -1 /proc/stat; sleep 2; head -1 /proc/stat; } > $O/env.txt 2>&1
timeout 170 python benchmarks/cpu_threads_probe.py --ab --max-runs 60 --seconds 0.3 --rounds 3 --batch 1 --models resnet50 mobilenetv2 bert_base gpt2 --engines on@16 ort@16 --json $O/final16_b1.json > $O/final16_b1.txt 2>&1
{ date; uptime; ps aux --sort=-%cpu | head -5; } >> $O/env.txt 2>&1
timeout 200 python benchmarks/cpu_threads_probe.py --ab --max-runs 60 --seconds 0.3 --rounds 5 --batch 8 --models resnet50 mobilenetv2 bert_base gpt2 --engines on@16 ort@16 --json $O/final16_b8.json > $O/final16_b8.txt 2>&1
{ date; uptime; } >> $O/env.txt 2>&1
tar czf $OUT/diag16.tgz -C /tmp d
# === repeat16.sh
#!/usr/bin/env bash
# session 14, call 6: repeat of the 16-core rows (all four models, b1 and b8, 5 rounds) on the final code
set -u
mkdir -p /tmp/lib /tmp/r && xz -dc devrun/s14/libdnnl.so.3.xz > /tmp/lib/libdnnl.so.3
export PGX_ONEDNN_LIB=/tmp/lib/libdnnl.so.3 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O=/tmp/r
{ date; uptime; } > $O/env.txt 2>&1
timeout 250 python benchmarks/cpu_threads_probe.py --ab --max-runs 60 --seconds 0.3 --rounds 5 --batch 1 --models resnet50 mobilenetv2 bert_base gpt2 --engines on@16 ort@16 --json $O/repeat16_b1.json > $O/repeat16_b1.txt 2>&1
{ date; uptime; } >> $O/env.txt 2>&1
timeout 250 python benchmarks/cpu_threads_probe.py --ab --max-runs 60 --seconds 0.3 --rounds 5 --batch 8 --models resnet50 mobilenetv2 bert_base gpt2 --engines on@16 ort@16 --json $O/repeat16_b8.json > $O/repeat16_b8.txt 2>&1
{ date; uptime; } >> $O/env.txt 2>&1
tar czf $OUT/repeat16.tgz -C /tmp r
