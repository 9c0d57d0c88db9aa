#!/usr/bin/env bash
# Two hosts in two network namespaces joined by one veth pair (no route out of either): etcd runs
# in host a; one NIXL agent per host creates the FERRY backend with NO parameters, configured
# only through the environment (FERRY_LOCAL_IP, which tcp.so's data listener follows too,
# FERRY_METADATA=etcd://..., FERRY_PROTOCOLS=tcp; and
# FERRY_HOST_ID/FERRY_PLUGINS, which Ferry reads itself: both namespaces share one machine id),
# and the initiator in b WRITEs 4 MiB with a notification into the target in a, which checks
# every byte. The backend's drop-in directory provides Ferry (NIXL_PLUGIN_DIR, no FERRY_PLUGIN_PATH).
#   netns_env_test.sh <ferry build dir with NIXL> <NIXL's library path (its lib and Abseil's)>
# Needs root; exits 77 with SKIPPED when namespaces cannot be made. Not part of tests/netns.
set -Eeuo pipefail
build=$(cd "$1" && pwd)
nixl_libs=$2
peer="$build/tests/nixl/nixl_env_peer"
dropin="$build/bindings/nixl"
etcd_bin=$(command -v etcd || true)
[ -n "$etcd_bin" ] || { echo "SKIPPED: etcd not installed"; exit 77; }
[ -x "$peer" ] || { echo "SKIPPED: $peer not built (NIXL not found at configure time)"; exit 77; }
net=10.213.78
p="fynx$$"
work=$(mktemp -d /tmp/ferry-nixl-netns-XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  ip netns del "$p-a" 2>/dev/null || true
  ip netns del "$p-b" 2>/dev/null || true
  [ -n "${FERRY_NETNS_KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
if ! err=$(ip netns add "$p-a" 2>&1); then
  echo "SKIPPED: cannot create a network namespace (ip netns add: $err)"; exit 77
fi
ip netns add "$p-b"
ip link add "$p-a0" netns "$p-a" type veth peer name "$p-b0" netns "$p-b"
ip netns exec "$p-a" ip addr add "$net.1/24" dev "$p-a0"
ip netns exec "$p-b" ip addr add "$net.2/24" dev "$p-b0"
for h in a b; do
  ip netns exec "$p-$h" ip link set lo up
  ip netns exec "$p-$h" ip link set "$p-${h}0" up
  if ip netns exec "$p-$h" ip route show default | grep -q .; then echo "FAIL: namespace $h has a default route"; exit 1; fi
done

etcd_url="http://$net.1:2379"
ip netns exec "$p-a" "$etcd_bin" --data-dir "$work/etcd" --name a \
  --listen-client-urls "$etcd_url" --advertise-client-urls "$etcd_url" \
  --listen-peer-urls "http://$net.1:2380" --initial-advertise-peer-urls "http://$net.1:2380" \
  --initial-cluster "a=http://$net.1:2380" > "$work/etcd.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
  ip netns exec "$p-b" curl -s -m 1 "$etcd_url/health" 2>/dev/null | grep -q true && break
  sleep 0.2 # polling a server that is starting: no event to wait on
done
ip netns exec "$p-b" curl -s -m 2 "$etcd_url/health" | grep -q true || { echo "FAIL: etcd not reachable from b"; cat "$work/etcd.log"; exit 1; }

run_peer() { # host role
  ip netns exec "$p-$1" env -i PATH=/usr/bin:/bin HOME="$work" NIXL_PLUGIN_DIR="$dropin" LD_LIBRARY_PATH="$nixl_libs" \
    FERRY_LOCAL_IP="$net.$3" FERRY_METADATA="etcd://$net.1:2379/ferry-nixl-$$" FERRY_PROTOCOLS=tcp \
    FERRY_HOST_ID="host-$1" FERRY_PLUGINS=tcp \
    timeout 120 "$peer" "$2" "$work"
}
run_peer a target 1 > "$work/target.out" 2>&1 &
target_pid=$!
pids+=($target_pid)
rc=0
run_peer b initiator 2 > "$work/initiator.out" 2>&1 || rc=$?
trc=0
wait "$target_pid" || trc=$?
cat "$work/target.out" "$work/initiator.out"
if [ $rc -ne 0 ] || [ $trc -ne 0 ]; then echo "FAIL: initiator exit $rc, target exit $trc"; exit 1; fi
grep -q "segment $net.1" "$work/target.out" || grep -q "FERRY_LOCAL_IP" "$work/target.out" || { echo "FAIL: target not configured from the environment"; exit 1; }
echo "PASS: two NIXL agents in two namespaces, FERRY configured only by the environment, 4 MiB WRITE over etcd metadata"
