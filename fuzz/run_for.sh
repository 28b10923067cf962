#!/usr/bin/env bash
# Run one harness for SECONDS in total at low priority, restarting after each crash so one
# finding does not end the session; crashes land in $OUT (default /tmp/pgx-fuzz/HARNESS).
# Usage: fuzz/run_for.sh onnx_parser|pgx_load|driver_args SECONDS [extra libFuzzer flags]
set -u
harness=$1; seconds=$2; shift 2
out=${OUT:-/tmp/pgx-fuzz/$harness}
case $harness in
  onnx_parser) corpus=fuzz/corpus/onnx ;;
  pgx_load) corpus=fuzz/corpus/pgx ;;
  driver_args) corpus=fuzz/corpus/driver ;;
  *) echo "unknown harness $harness (onnx_parser, pgx_load, driver_args)" >&2; exit 2 ;;
esac
mkdir -p "$out/work"
end=$(( $(date +%s) + seconds ))
runs=0
while [ "$(date +%s)" -lt "$end" ]; do
  left=$(( end - $(date +%s) ))
  runs=$((runs + 1))
  PYTHONPATH=$PWD nice -n 19 python -m "fuzz.$harness" "$out/work" "$corpus" \
    -max_total_time="$left" -rss_limit_mb=4096 -timeout=30 -print_final_stats=1 \
    -artifact_prefix="$out/" "$@" >"$out/log.$runs" 2>&1
done
execs=$(grep -h "stat::number_of_executed_units" "$out"/log.* | awk '{s += $2} END {print s + 0}')
crashes=$(ls "$out" | grep -c -E '^(crash|timeout|oom|leak)-' || true)
echo "$harness: $runs session(s), $execs executions, $crashes finding(s) in $out"
