#!/bin/sh
# bfmnv17: the A/B series (bfmnv17_ab.py), 2 threads, b1 and b8, both orders, repeated;
# each run's output appended to benchmarks/results/bfmnv17_ab_t2.txt.
# usage: sh benchmarks/bfmnv17_series.sh REPEATS [WAIT_S]
export PGX_CPU_LOAD_ADAPT=0 PGX_CPU_STALL_ADAPT=0 PYTHONPATH=.
PY=/work/main/.venv/bin/python
OUT=benchmarks/results/bfmnv17_ab_t2.txt
W=${2:-120}
i=0
while [ $i -lt "$1" ]; do
  for spec in "mobilenetv2:1 --rounds 20 --runs 10" "mobilenetv2:8 --rounds 12 --runs 4"; do
    for order in "" "--new-first"; do
      echo "=== $(date -u +%H:%M:%S) --models $spec $order --threads 2 --wait-quiet $W" >> $OUT
      $PY benchmarks/bfmnv17_ab.py --models $spec $order --threads 2 --wait-quiet $W >> $OUT 2>&1
    done
  done
  i=$((i+1))
done
