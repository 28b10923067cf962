#!/usr/bin/env bash
# chain11: conv chains on/off, in one process per line, alternating blocks, both orders
# (benchmarks/mnv2b1_ab.py: wall and process CPU a run; the sum of each step's minimum wall
# over all runs, `sum_step_min_ms`, a chain's members timed by the chain itself).
# Prints each run's table from its header line (` rounds x `) on: the medians, the steps and
# the extra figures (the harness prints more lines than it did when this script was written).
# Usage: PGX_CPU_LOAD_ADAPT=0 PYTHONPATH=. bash benchmarks/chain11_ab.sh [rounds] [runs]
set -euo pipefail
ROUNDS=${1:-12}
RUNS=${2:-20}
OFF="off:@conv_chain.CHAIN=False"
ON="on:"
SPECS=${SPECS:-"mobilenetv2:1:1 mobilenetv2:1:2 mobilenetv2:8:1 mobilenetv2:8:2 resnet50:1:1 resnet50:1:2"}
for spec in $SPECS; do
  spec=${spec//:/ }
  set -- $spec
  for order in "" "--new-first"; do  # both run orders; the ratios are on / off in both
    set -- $spec
    python benchmarks/mnv2b1_ab.py --model "$1" --batch "$2" --threads "$3" \
      --rounds "$ROUNDS" --runs "$RUNS" --steps --variant "$OFF" --variant "$ON" $order 2>&1 | grep -v Warning | sed -n '/ rounds x /,$p'
  done
done
