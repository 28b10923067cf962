#!/bin/bash
# mbv14: wait (at most $1 seconds, default 300) for a quiet moment on this shared machine:
# /proc/stat busy < 15 % over 2 s; prints what it saw (exit 1: not quiet in time)
lim=${1:-300}; t0=$(date +%s)
while :; do
  a=($(head -1 /proc/stat)); sleep 2; b=($(head -1 /proc/stat))
  busy=$(( (b[1]+b[2]+b[3]+b[6]+b[7]) - (a[1]+a[2]+a[3]+a[6]+a[7]) )); idle=$(( (b[4]+b[5]) - (a[4]+a[5]) ))
  pct=$(( 100*busy/(busy+idle+1) ))
  if [ $pct -lt 15 ]; then echo "quiet: busy ${pct}% at $(date +%T), load $(cut -d' ' -f1-3 /proc/loadavg)"; exit 0; fi
  if [ $(( $(date +%s)-t0 )) -gt $lim ]; then echo "not quiet: busy ${pct}% at $(date +%T), load $(cut -d' ' -f1-3 /proc/loadavg)"; exit 1; fi
done
