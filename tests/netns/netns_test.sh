#!/usr/bin/env bash
# Multi-host tests: three network namespaces act as hosts on one private /24 joined by a bridge
# (itself in a fourth namespace). etcd and every engine run inside them, so all test traffic
# starts and ends inside namespaces this script made; none of them has a default route, and
# each peer's address is checked to go through the test's veth before any traffic is sent.
#
#   netns_test.sh <build dir>
# Needs root (ip netns). Exits 77 (meson's "skipped") only when the kernel refuses namespaces,
# and says so.
set -euo pipefail
build=$(cd "$1" && pwd)
peer_bin="$build/tests/ferry_test_peer"
client_bin="$build/tests/ferry_netns_client"
etcd_bin=$(command -v etcd)
export FERRY_PLUGIN_PATH="$build/plugins/tcp"
export FERRY_PLUGINS=
net=10.213.77 # the test's own /24: it exists only inside these namespaces
p="fy$$"       # namespace and interface prefix, unique per run
work=$(mktemp -d)
pids=()

log() { echo "[netns] $*"; }
# Not for background processes: `in_ns ... &` would give the pid of a subshell, not the process.
in_ns() { local ns=$1; shift; ip netns exec "$p-$ns" "$@"; }

cleanup() {
  set +e
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null; done
  wait 2>/dev/null
  for ns in a b c br; do ip netns del "$p-$ns" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT

if ! err=$(ip netns add "$p-br" 2>&1); then
  echo "SKIPPED: the kernel refuses network namespaces here: $err"
  exit 77
fi
in_ns br ip link add br0 type bridge
in_ns br ip link set br0 up
declare -A addr=([a]=1 [b]=2 [c]=3)
for h in a b c; do
  ip netns add "$p-$h"
  ip link add "$p$h" type veth peer name "$p$h-br"
  ip link set "$p$h" netns "$p-$h"
  ip link set "$p$h-br" netns "$p-br"
  in_ns br ip link set "$p$h-br" master br0 up
  in_ns "$h" ip addr add "$net.${addr[$h]}/24" dev "$p$h"
  in_ns "$h" ip link set "$p$h" up
  in_ns "$h" ip link set lo up
done
# Safety: no namespace may have a route out, and peers must be reached through our veths.
for h in a b c; do
  if in_ns "$h" ip route | grep -q default; then echo "FAIL: namespace $h has a default route"; exit 1; fi
  for other in a b c; do
    [ "$h" = "$other" ] && continue
    route=$(in_ns "$h" ip route get "$net.${addr[$other]}")
    echo "$route" | grep -q "dev $p$h" || { echo "FAIL: $net.${addr[$other]} not via $p$h in $h: $route"; exit 1; }
  done
done
log "namespaces $p-{a,b,c} on $net.0/24, bridged in $p-br; routes checked"

start_etcd() { # in host a, data wiped when $1 = wipe
  [ "${1:-}" = wipe ] && rm -rf "$work/etcd"
  ip netns exec "$p-a" "$etcd_bin" --data-dir "$work/etcd" --name a \
    --listen-client-urls "http://$net.1:2379" --advertise-client-urls "http://$net.1:2379" \
    --listen-peer-urls "http://$net.1:2380" --initial-advertise-peer-urls "http://$net.1:2380" \
    --initial-cluster "a=http://$net.1:2380" >>"$work/etcd.log" 2>&1 &
  etcd_pid=$!
  pids+=("$etcd_pid")
  for _ in $(seq 100); do
    in_ns a curl -s -m 1 -X POST "http://$net.1:2379/v3/maintenance/status" -d '{}' >/dev/null && return 0
    sleep 0.1
  done
  echo "FAIL: etcd did not start"; cat "$work/etcd.log"; exit 1
}
metadata="etcd://$net.1:2379/netns-$p"

start_target() { # host name: a target engine with a 64 MiB buffer, stdin held open by a fifo
  local h=$1 name=$2
  mkfifo "$work/$name.in"
  ip netns exec "$p-$h" "$peer_bin" --size 67108864 --option "metadata=$metadata" --option "local_server_name=$name" \
    --option "tcp.bind_ip=$net.${addr[$h]}" --option "local_ip=$net.${addr[$h]}" --option "host_id=host-$h" \
    --option "etcd_lease_ttl_s=3" <"$work/$name.in" >"$work/$name.out" 2>"$work/$name.err" &
  local pid=$!
  pids+=("$pid")
  eval "exec {fd}>\"$work/$name.in\""
  eval "${name}_fd=$fd; ${name}_pid=$pid"
  for _ in $(seq 100); do grep -q READY "$work/$name.out" && return 0; sleep 0.1; done
  echo "FAIL: target $name did not start"; cat "$work/$name.out" "$work/$name.err"; exit 1
}

run_client() { # scenario segments... ; cues are answered by the function in $on_wait
  local scenario=$1; shift
  mkfifo "$work/client-$scenario.in"
  ip netns exec "$p-b" "$client_bin" "$metadata" "$net.2" "$scenario" "$@" <"$work/client-$scenario.in" >"$work/client-$scenario.out" 2>&1 &
  local pid=$!
  exec {cfd}>"$work/client-$scenario.in"
  local answered=0 deadline=$((SECONDS + 120))
  while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do
    local waiting
    waiting=$(grep -c '^WAITING' "$work/client-$scenario.out" || true)
    if [ "$waiting" -gt "$answered" ]; then
      local want
      want=$(grep '^WAITING' "$work/client-$scenario.out" | tail -1 | cut -d' ' -f2)
      "$on_wait" "$want"
      echo "$want" >&"$cfd"
      answered=$waiting
    fi
    sleep 0.1
  done
  exec {cfd}>&-
  local rc=0
  wait "$pid" || rc=$?
  sed 's/^/    /' "$work/client-$scenario.out"
  [ $rc -eq 0 ] || { echo "FAIL: scenario $scenario (exit $rc)"; exit 1; }
}

start_etcd
start_target a A
start_target c C
passed=0

noop() { :; }
on_wait=noop
run_client transfer A C
passed=$((passed + 1))

cut_link() {
  case "$1" in
    cut) in_ns br ip link set "${p}a-br" down; log "link to host a cut" ;;
    restored) in_ns br ip link set "${p}a-br" up; log "link to host a restored" ;;
  esac
}
on_wait=cut_link
run_client link A
passed=$((passed + 1))

kill_c() { kill -9 "$C_pid"; wait "$C_pid" 2>/dev/null || true; log "host c's engine killed"; }
on_wait=kill_c
run_client kill A C
passed=$((passed + 1))

restart_etcd() {
  kill -9 "$etcd_pid"; wait "$etcd_pid" 2>/dev/null || true
  start_etcd wipe
  log "etcd restarted with no data"
}
on_wait=restart_etcd
run_client etcd A
passed=$((passed + 1))

echo "$passed passed, 0 failed"
