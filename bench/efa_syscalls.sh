#!/usr/bin/env bash
# System calls and context switches (sleeps and wake-ups) per op of efa.so over libfabric's tcp
# provider, per thread of the initiator and the target process (docs/PERFORMANCE.md's efa.so
# sections).
#   bench/efa_syscalls.sh [[LABEL=]build-dir ...]
#       BLOCK=65536, OP=write, BATCH=1 (ops in flight), DURATION=4 seconds,
#       OPTIONS="efa.spin_us=1000 ..." (engine options for both processes)
# For each build: transfer_engine_bench's target and initiator (as in efa_vs_fi_pingpong.sh);
# the initiator runs two identical points of DURATION s (--sweep); `perf stat --per-thread`
# counts in-kernel (no tracing slowdown) both processes' threads from the end of the first to the
# initiator's exit, per op of the second point (its teardown adds a few hundred calls in all).
# A thread started meanwhile (the bench's worker of the second point) counts in thread 0.
# Prints, per thread with at least 0.05 events per op, its events per op; threads are numbered
# in tid order within a process (thread 0 is the process's first thread).
set -euo pipefail
[ $# -gt 0 ] || set -- build
block=${BLOCK:-65536} op=${OP:-write} batch=${BATCH:-1} duration=${DURATION:-4}
export FI_TCP_IFACE=lo
command -v perf >/dev/null || { echo "perf is missing" >&2; exit 1; }
tmp=$(mktemp -d)
target_pid=""
cleanup() { [ -n "$target_pid" ] && kill "$target_pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
calls="epoll_wait epoll_pwait poll ppoll read write futex sendmsg recvmsg sendto recvfrom readv writev timerfd_settime sched_yield"
events="context-switches"
for c in $calls; do events="$events,syscalls:sys_enter_$c"; done

echo "machine: $(nproc) cores, kernel $(uname -r); $op of $block B, $batch in flight; ${duration}s; options: ${OPTIONS:-none}"
for arg in "$@"; do
  label=${arg%%=*} build=${arg#*=}
  bench="$build/bench/transfer_engine_bench"
  [ -x "$bench" ] || { echo "build first: $bench is missing" >&2; exit 1; }
  export FERRY_PLUGIN_PATH="$build/plugins/efa"
  opts=(--option plugins=efa --option efa.provider=tcp)
  for kv in ${OPTIONS:-}; do opts+=(--option "$kv"); done
  "$bench" --mode=target --local_server_name=127.0.0.1:0 --buffer_size=268435456 "${opts[@]}" >"$tmp/target.out" 2>&1 &
  target_pid=$!
  segment=""
  for _ in $(seq 1 200); do
    segment=$(awk '/ ready:/ {print $2}' "$tmp/target.out")
    [ -n "$segment" ] && break
    sleep 0.05
  done
  [ -n "$segment" ] || { cat "$tmp/target.out" >&2; exit 1; }
  # Two identical points: the first warms up (the engine, its efa progress thread, the
  # connection); the counters attach when it ends and count the second.
  "$bench" --mode=initiator --segment_id="$segment" --protocol=efa --operation="$op" --buffer_size=268435456 \
    --sweep --sweep_block_sizes="$block,$block" --sweep_batch_sizes="$batch" --sweep_threads=1 \
    --sweep_out="$tmp/sweep.json" --duration="$duration" "${opts[@]}" --json >"$tmp/init.json" &
  init_pid=$!
  until grep -q throughput "$tmp/init.json" 2>/dev/null; do
    kill -0 "$init_pid" 2>/dev/null || { echo "the initiator failed" >&2; exit 1; }
    sleep 0.01
  done
  perf stat --per-thread -x, -e "$events" -p "$init_pid" -o "$tmp/init.stat" &
  p1=$!
  perf stat --per-thread -x, -e "$events" -p "$target_pid" -o "$tmp/target.stat" &
  p2=$!
  wait "$init_pid"
  wait "$p1" || true
  kill -INT "$p2"
  wait "$p2" || true
  kill -INT "$target_pid"
  wait "$target_pid" 2>/dev/null || true
  target_pid=""
  /usr/bin/python3 - "$label" "$tmp/init.json" "$tmp/init.stat" "$tmp/target.stat" "$batch" <<'EOF'
import json, re, sys
label, js, stats, batch = sys.argv[1], sys.argv[2], sys.argv[3:5], int(sys.argv[5])
r = [json.loads(x) for x in open(js) if "throughput" in x][1]
ops = r["batches"] * batch
print(f"\n{label}: {r['throughput']:.2f} {r['unit']}, {ops} ops")
print("| build | thread | context switches / op | system calls / op |")
print("|---|---|---|---|")
for side, path in zip(("initiator", "target"), stats):
    threads = {}
    for line in open(path):
        f = line.strip().split(",")
        if len(f) < 4 or not re.match(r".+-\d+$", f[0]) or not f[1].replace(".", "").isdigit():
            continue
        tid = int(f[0].rsplit("-", 1)[1])
        ev = f[3].replace("syscalls:sys_enter_", "")
        threads.setdefault(tid, {})[ev] = threads.get(tid, {}).get(ev, 0) + float(f[1])
    for i, tid in enumerate(sorted(threads)):
        t = threads[tid]
        per = {k: v / ops for k, v in t.items() if v / ops >= 0.05}
        if not per:
            continue
        cs = per.pop("context-switches", 0.0)
        text = ", ".join(f"{k} {v:.2f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1]))
        print(f"| {label} | {side}, thread {i} | {cs:.2f} | {sum(per.values()):.1f}: {text} |")
EOF
done
