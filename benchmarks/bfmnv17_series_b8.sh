#!/bin/sh
# bfmnv17: more b8 pairs at 2 threads (bfmnv17_ab.py), both orders, and an A/A (new vs new);
# appended to benchmarks/results/bfmnv17_ab_t2_b8.txt.  usage: sh ... REPEATS [WAIT_S]
export PGX_CPU_LOAD_ADAPT=0 PGX_CPU_STALL_ADAPT=0 PYTHONPATH=.
PY=/work/main/.venv/bin/python
OUT=benchmarks/results/bfmnv17_ab_t2_b8.txt
W=${2:-120}
NEW="@native_mbconv.BF16_NO_EXPANSION=True,@native_mbconv.BF16_MIN_PIXELS_THREADS=0"
i=0
while [ $i -lt "$1" ]; do
  for order in "" "--new-first" "AA"; do
    if [ "$order" = "AA" ]; then extra="--old $NEW"; order=""; else extra=""; fi
    echo "=== $(date -u +%H:%M:%S) --models mobilenetv2:8 --rounds 20 --runs 4 $order $extra --threads 2 --wait-quiet $W" >> $OUT
    $PY benchmarks/bfmnv17_ab.py --models mobilenetv2:8 --rounds 20 --runs 4 $order $extra --threads 2 --wait-quiet $W >> $OUT 2>&1
  done
  i=$((i+1))
done
