#!/usr/bin/env bash
# The `cpu` target on a many-core host against ONNX Runtime, the code before and after a change
# in one go (issue 10; the 16-core host of the GPU machine):
#
#   bash benchmarks/cpu_host16.sh BASE OUT
#
# BASE: a copy of the code before (for example `git archive main | tar -x -C BASE`), run with
# its own benchmarks; this checkout is "after". OUT: a folder for the JSON files (8 of them).
# Runs: both at 16 threads on the four built-in models at batch 1 and 8 (ORT and pygraphx in
# their own blocks of runs, process CPU time per run in the JSON); issue 10's table: both at 16
# threads, batch 1 and 8, pygraphx and ORT blocks alternating in one process, 3 rounds, with
# each engine's own CPU time and the per-round ratios to ORT (`cpu_threads_probe.py --ab
# --engines`; the first runs' process CPU time counts the other engine's spinning pool, and
# their 5-run blocks let one slow run set the mean); both on 2 cores
# (`taskset -c 0-1`, 2 threads, batch 1); the OS threads each run starts (GNU OpenMP's team
# churn, `cpu_threads_probe.py --churn`); and "after" at GOMP_SPINCOUNT 1000 and 30000 at batch 1
# (pygraphx's default is `targets/cpu/__init__.py`'s spincount(): 10000 on 8+ cores). About 6
# minutes on 16 cores.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BASE=$(cd "$1" && pwd)
OUT=$2
mkdir -p "$OUT"
COMMON=(--no-eager --no-openvino --no-bf16 --warmup 2 --repeat 5)
T16=(--threads 16 --batches 1 8 --models resnet50 mobilenetv2 bert_base gpt2 "${COMMON[@]}")
T2=(--threads 2 --batches 1 --models mobilenetv2 resnet50 "${COMMON[@]}")

peers() {  # DIR JSON ARGS...: cpu_vs_peers.py of the checkout DIR
  local dir=$1 json=$2
  shift 2
  (cd "$dir" && PYTHONPATH=$dir python benchmarks/cpu_vs_peers.py "$@" --json "$json")
}

echo "## host: $(nproc) CPUs; $(lscpu | grep -m1 'Model name')"
python -c "import torch, onnxruntime; print('## torch', torch.__version__, 'ort', onnxruntime.__version__)"
echo "## before, 16 threads"; peers "$BASE" "$OUT/before_t16.json" "${T16[@]}"
echo "## after, 16 threads"; peers "$ROOT" "$OUT/after_t16.json" "${T16[@]}"
echo "## before, 2 cores"; taskset -c 0-1 bash -c "$(declare -f peers); peers $BASE $OUT/before_t2.json ${T2[*]}"
echo "## after, 2 cores"; taskset -c 0-1 bash -c "$(declare -f peers); peers $ROOT $OUT/after_t2.json ${T2[*]}"
# this checkout's probe, also run on BASE's code (its own copy inserts BASE on sys.path)
cp "$ROOT/benchmarks/cpu_threads_probe.py" "$BASE/benchmarks/cpu_threads_probe_after.py"
TABLE=(--ab --seconds 0.3 --max-runs 60 --rounds 3 --engines on@16 ort@16
       --batch 1 8 --models resnet50 mobilenetv2 bert_base gpt2)
echo "## before, 16 threads, batch 1 and 8, alternating blocks"
(cd "$BASE" && PYTHONPATH=$BASE python benchmarks/cpu_threads_probe_after.py "${TABLE[@]}" \
  --json "$OUT/before_ab.json")
echo "## after, 16 threads, batch 1 and 8, alternating blocks"
(cd "$ROOT" && PYTHONPATH=$ROOT python benchmarks/cpu_threads_probe.py "${TABLE[@]}" \
  --json "$OUT/after_ab.json")
CHURN=(--churn --models mobilenetv2 bert_base --threads 4 16)
echo "## OS threads started per run, before"
(cd "$BASE" && PYTHONPATH=$BASE python benchmarks/cpu_threads_probe_after.py "${CHURN[@]}")
echo "## OS threads started per run, after"
(cd "$ROOT" && PYTHONPATH=$ROOT python benchmarks/cpu_threads_probe.py "${CHURN[@]}")
for spin in 1000 30000; do
  echo "## after, 16 threads, GOMP_SPINCOUNT=$spin"
  GOMP_SPINCOUNT=$spin peers "$ROOT" "$OUT/after_t16_spin$spin.json" --threads 16 --batches 1 \
    --models mobilenetv2 bert_base "${COMMON[@]}"
done
