#!/bin/bash
# GNU OpenMP's wait policy beside a neighbour: pygraphx's setting (GOMP_SPINCOUNT=10000, set
# on import) against OMP_WAIT_POLICY=passive (workers sleep at once), processes alternating
# (A B B A), each running benchmarks/adapt15_probe.py (quiet and with K spinners; ORT, whose
# pool is not OpenMP's, is the per-process reference).
#   bash benchmarks/adapt15_wait_policy.sh OUTDIR [THREADS] [K] [MODELS...]
set -u
out=${1:?OUTDIR}; threads=${2:-2}; k=${3:-1}; shift 3 || true
models=${*:-mobilenetv2 resnet50}
mkdir -p "$out"
i=0
for policy in default passive passive default; do
  i=$((i+1))
  if [ "$policy" = passive ]; then env="OMP_WAIT_POLICY=passive"; else env="PGX_NOTHING=1"; fi
  env $env PYTHONPATH=. python benchmarks/adapt15_probe.py --threads "$threads" \
    --spinners 0 "$k" --models $models --json "$out/wait_${i}_${policy}.json" \
    > "$out/wait_${i}_${policy}.txt" 2>&1
  grep -v Warning "$out/wait_${i}_${policy}.txt"
done
