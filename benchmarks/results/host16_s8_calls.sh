#!/bin/bash
# cpuhost session 8: the four host calls of host16_s8_notes.md, run from a copy of the branch
# holding libdnnl.so.3.xz:  bash benchmarks/results/host16_s8_calls.sh N   (N = 1..4; the
# device run wrote under $OUT)
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/d && xz -dc libdnnl.so.3.xz > /tmp/d/libdnnl.so.3
export PGX_ONEDNN_LIB=/tmp/d/libdnnl.so.3
export P=benchmarks/cpu_threads_probe.py KEEP="ms per|took|ORT:"
probe() {  # SECONDS JSON ARGS...: the probe (killed after SECONDS), its result lines
  local limit=$1 json=$2
  shift 2
  timeout "$limit" python $P --ab --max-runs 60 "$@" --json "$OUT/$json" 2>&1 |
    grep -v -i warn | grep -E "$KEEP"
}

call1() {  # own CPU at MobileNetV2 b8; 8 threads; OpenMP binding; spin 1000
  nproc; lscpu | grep -E "Model name|Thread|Core|Socket|NUMA node"
  local ab=(--seconds 0.25 --engines on@16 ort@16)
  echo "## b1 default"; probe 45 b1.json --seconds 0.25 --rounds 3 --batch 1 \
    --models mobilenetv2 resnet50 --engines on@16 on@8 ort@16
  echo "## b8 default"; probe 35 b8.json --seconds 0.25 --rounds 4 --batch 8 \
    --models mobilenetv2 --engines on@16 on@8 ort@16
  echo "## bind close/cores"; OMP_PLACES=cores OMP_PROC_BIND=close probe 40 \
    b1_bind.json "${ab[@]}" --unpin-caller --models mobilenetv2 resnet50 --batch 1 --rounds 3
  echo "## b8 spin 1000"; GOMP_SPINCOUNT=1000 probe 25 b8_spin1000.json "${ab[@]}" \
    --models mobilenetv2 --batch 8 --rounds 3
}

call2() {  # issue 10's table; every step on 16 threads; workers that never sleep
  local ab=(--seconds 0.3 --rounds 3)
  for b in 1 8; do
    echo "## table b$b"; probe 80 table_b$b.json "${ab[@]}" --batch $b \
      --models resnet50 mobilenetv2 bert_base gpt2 --engines on@16 ort@16
  done
  echo "## mnv2 b1 policy off"; probe 25 mnv2_off.json "${ab[@]}" --batch 1 \
    --models mobilenetv2 --engines on@16 off@16 ort@16
  echo "## active wait"; OMP_WAIT_POLICY=active probe 30 active.json "${ab[@]}" \
    --batch 1 --models mobilenetv2 resnet50 --engines on@16 ort@16
}

call3() {  # pygraphx alone at three wait settings, then spin 100000 beside ORT
  local ab=(--seconds 0.3 --rounds 3 --batch 1)
  local m=(--models resnet50 mobilenetv2 bert_base)
  echo "## alone, default"; probe 30 alone_default.json "${ab[@]}" "${m[@]}" \
    --engines on@16
  echo "## alone, active"; OMP_WAIT_POLICY=active probe 30 alone_active.json \
    "${ab[@]}" "${m[@]}" --engines on@16
  echo "## alone, spin 100000"; GOMP_SPINCOUNT=100000 probe 30 alone_spin1e5.json \
    "${ab[@]}" "${m[@]}" --engines on@16
  echo "## with ORT, spin 100000"; GOMP_SPINCOUNT=100000 probe 30 ort_spin1e5.json \
    "${ab[@]}" --models resnet50 mobilenetv2 --engines on@16 ort@16
}

call4() {  # pygraphx alone, processes at four wait settings alternating, twice
  local cfg env
  KEEP="ms per"
  for rep in 1 2; do
    for cfg in spin10000 spin100000 spin1000000 active; do
      env="GOMP_SPINCOUNT=${cfg#spin}"
      [ $cfg = active ] && env="OMP_WAIT_POLICY=active"
      echo "## $cfg rep $rep"
      env $env bash -c "$(declare -f probe); probe 20 ${cfg}_$rep.json --seconds 0.3 \
        --rounds 3 --batch 1 --models resnet50 mobilenetv2 --engines on@16"
    done
  done
}

cat /proc/loadavg
"call$1"
cat /proc/loadavg
