#!/usr/bin/env bash
# Multi-host tests: three network namespaces act as hosts (a, b, c) on one private /24 joined by
# a bridge (itself in a fourth namespace, br). etcd and every engine run inside them, so all test
# traffic starts and ends inside namespaces this script made: none of them has a default route,
# each peer's address is checked (ip route get) to go through the test's veth before any traffic
# is sent, and every engine's sockets are checked to use the namespace's address.
#
#   netns_test.sh <build dir> [<transports, default tcp>]     e.g. tcp,efa
# efa runs on libfabric's tcp provider (efa.provider=tcp), bound to each namespace's address.
# Needs root (ip netns). Exits 77 (meson's "skipped") only when no network namespace can be
# made (not root, or the kernel refuses), and says so. Prints one PASS or FAIL line per check.
# FERRY_NETNS_KEEP=1 keeps every process's log.
set -Eeuo pipefail
build=$(cd "$1" && pwd)
transports=${2:-tcp}
peer_bin="$build/tests/ferry_test_peer"
client_bin="$build/tests/ferry_netns_client"
etcd_bin=$(command -v etcd)
plugin_path=
for t in ${transports//,/ }; do plugin_path+="${plugin_path:+:}$build/plugins/$t"; done
export FERRY_PLUGIN_PATH="$plugin_path" FERRY_PLUGINS= FERRY_LOG_LEVEL=info
net=10.213.77 # the test's own /24: it exists only inside these namespaces
prefix=fyns   # every namespace this test makes is named fyns<pid>-<host>
p="$prefix$$"
lease_ttl_s=3
work= # logs, fifos, etcd's data: made once namespaces are known to work, removed at exit
pids=()
passed=0
status=1 # until the end is reached

log() { echo "[netns $(date +%T.%N | cut -c1-12)] $*"; }
pass() { echo "PASS: $*"; passed=$((passed + 1)); }
# Not for background processes: `in_ns ... &` would give the pid of a subshell, not the process.
in_ns() { local ns=$1; shift; ip netns exec "$p-$ns" "$@"; }

dump_logs() {
  [ -n "$work" ] || return 0
  for f in "$work"/*.err "$work"/*.out "$work"/etcd.log; do
    [ -f "$f" ] || continue
    echo "---- ${f#"$work"/} (last 60 lines)"
    tail -n 60 "$f"
  done
}
targets=() # names of the target engines started, for the report on failure
die() {
  echo "FAIL: $*"
  local name pid_var
  for name in "${targets[@]}"; do # a target that crashed explains most failures
    pid_var="${name}_pid"
    kill -0 "${!pid_var}" 2>/dev/null || echo "  (target $name is not running: $(exit_reason "${!pid_var}"))"
  done
  dump_logs
  exit 1
}
exit_reason() { # pid of a child that ended
  local rc=0
  wait "$1" 2>/dev/null || rc=$?
  if [ $rc -gt 128 ]; then echo "died of signal $((rc - 128)) ($(kill -l $((rc - 128))))"; else echo "exited with status $rc"; fi
}

delete_namespaces() { # $1: a namespace name prefix, e.g. fyns123-
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$1" || true); do
    # Only processes this test started live there (engines, etcd); a killed run may have left some.
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
}

cleanup() {
  local rc=$?
  set +eE
  trap - EXIT TERM INT HUP ERR
  if [ $status -ne 0 ] && [ $rc -eq 0 ]; then rc=1; fi
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null; done
  wait 2>/dev/null
  delete_namespaces "$p-"
  [ -z "$(ip netns list 2>/dev/null | grep "^$p-")" ] || { echo "FAIL: could not delete namespaces $p-*"; rc=1; }
  if [ -n "${FERRY_NETNS_KEEP:-}" ]; then echo "logs kept in $work"; elif [ -n "$work" ]; then rm -rf "$work"; fi
  exit $rc
}
trap cleanup EXIT
trap 'echo "FAIL: line $LINENO: \"$BASH_COMMAND\" failed"' ERR
trap 'echo "FAIL: interrupted (signal)"; dump_logs; exit 1' TERM INT HUP

# Namespaces of earlier runs that were killed before their cleanup (their pid is gone).
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$prefix[0-9]+-" || true); do
  owner=${ns#"$prefix"}
  owner=${owner%%-*}
  if ! kill -0 "$owner" 2>/dev/null; then
    log "deleting $ns, left behind by run $owner"
    delete_namespaces "$ns"
  fi
done

if ! err=$(ip netns add "$p-br" 2>&1); then
  echo "SKIPPED: cannot create a network namespace here (ip netns add: $err): the multi-host tests need root and a kernel that allows namespaces; they did not run"
  status=0
  exit 77
fi
# Some containers let `ip netns add` through but not `ip netns exec` (it mounts /sys and makes /
# a slave mount: "mount --make-rslave / failed"): that too is "cannot run here", not a failure.
if ! err=$(ip netns exec "$p-br" true 2>&1); then
  echo "SKIPPED: cannot enter a network namespace here (ip netns exec: $err): the multi-host tests need to run commands inside namespaces (root with mount rights, e.g. not a restricted container); they did not run"
  status=0
  exit 77
fi
work=$(mktemp -d "$build/tests/netns-run.XXXXXX")
in_ns br ip link set lo up
in_ns br ip link add br0 type bridge
in_ns br ip link set br0 up
declare -A addr=([a]=1 [b]=2 [c]=3)
for h in a b c; do
  ip netns add "$p-$h"
  # Made inside the namespaces: the root namespace never holds one of the test's interfaces.
  ip link add "$p$h" netns "$p-$h" type veth peer name "$p$h-br" netns "$p-br"
  in_ns br ip link set "$p$h-br" master br0 up
  in_ns "$h" ip addr add "$net.${addr[$h]}/24" dev "$p$h"
  in_ns "$h" ip link set "$p$h" up
  in_ns "$h" ip link set lo up
done

# Safety: no namespace may have a route out, and peers must be reached through our veths.
check_routes() {
  local h other route routes
  for h in a b c; do
    # (No `cmd | grep -q` under pipefail: grep quitting early can fail the pipeline.)
    routes=$(in_ns "$h" ip route)
    [[ $routes != *default* ]] || die "namespace $h has a default route: $routes"
    for other in a b c; do
      [ "$h" = "$other" ] && continue
      route=$(in_ns "$h" ip route get "$net.${addr[$other]}")
      [[ $route == *" dev $p$h "* ]] || die "$net.${addr[$other]} is not reached via $p$h in $h: $route"
    done
  done
}
check_routes
pass "namespaces $p-{a,b,c} on $net.0/24 bridged in $p-br: no default route; every peer address routes via the test's veth (ip route get)"

etcd_url="http://$net.1:2379"
start_etcd() { # in host a; $1 = wipe: with no data
  [ "${1:-}" = wipe ] && rm -rf "$work/etcd"
  ip netns exec "$p-a" "$etcd_bin" --data-dir "$work/etcd" --name a \
    --listen-client-urls "$etcd_url" --advertise-client-urls "$etcd_url" \
    --listen-peer-urls "http://$net.1:2380" --initial-advertise-peer-urls "http://$net.1:2380" \
    --initial-cluster "a=http://$net.1:2380" >>"$work/etcd.log" 2>&1 &
  etcd_pid=$!
  pids+=("$etcd_pid")
  local i
  for i in $(seq 200); do
    in_ns a curl -s -m 1 -X POST "$etcd_url/v3/maintenance/status" -d '{}' >/dev/null && return 0
    kill -0 "$etcd_pid" 2>/dev/null || die "etcd exited at start"
    sleep 0.1
  done
  die "etcd did not answer within 20 s"
}
# Waits until host $1 reaches etcd in host a (ARP and bridge ready): before traffic, and after
# the link is restored, so that what follows measures Ferry rather than the network coming up.
wait_reaches_etcd() {
  local i
  for i in $(seq 40); do
    in_ns "$1" curl -s -m 1 -o /dev/null "$etcd_url/health" && return 0
  done
  die "host $1 cannot reach etcd at $etcd_url"
}
stop_etcd() { kill -9 "$etcd_pid"; wait "$etcd_pid" 2>/dev/null || true; }
metadata="etcd://$net.1:2379/netns-$p"
etcd_keys() { # segment names registered now
  in_ns a curl -s -m 5 -X POST "$etcd_url/v3/kv/range" \
    -d "{\"key\":\"$(printf '/netns-%s/segments/' "$p" | base64 -w0)\",\"range_end\":\"$(printf '/netns-%s/segments0' "$p" | base64 -w0)\",\"keys_only\":true}" |
    /usr/bin/python3 -c 'import sys, json, base64
for kv in json.load(sys.stdin).get("kvs", []): print(base64.b64decode(kv["key"]).decode().rsplit("/", 1)[1])'
}
wait_registered() { # names... : all in etcd within the lease TTL plus slack
  local deadline=$((SECONDS + lease_ttl_s + 15)) name missing keys
  while :; do
    missing=
    keys=$(etcd_keys)
    for name in "$@"; do grep -qx "$name" <<<"$keys" || missing+=" $name"; done
    [ -z "$missing" ] && return 0
    [ $SECONDS -lt $deadline ] || die "not registered in etcd:$missing (registered: $(tr '\n' ' ' <<<"$keys"))"
    sleep 0.2
  done
}

transport_options() { # host: the per-transport options of an engine in that host
  local h=$1 ip="$net.${addr[$1]}" t
  echo "--option plugins=$transports --option local_ip=$ip --option host_id=host-$h --option etcd_lease_ttl_s=$lease_ttl_s"
  for t in ${transports//,/ }; do
    case $t in
      tcp) echo "--option tcp.bind_ip=$ip" ;;
      efa) echo "--option efa.provider=tcp --option efa.node=$ip" ;;
    esac
  done
}

launch_target() { # host name [extra options]: a target engine with a 64 MiB buffer, stdin held open by a fifo
  local h=$1 name=$2 fd
  shift 2
  mkfifo "$work/$name.in"
  : >"$work/$name.out"
  # shellcheck disable=SC2046
  ip netns exec "$p-$h" "$peer_bin" --size 67108864 --option "metadata=$metadata" --option "local_server_name=$name" \
    $(transport_options "$h") "$@" <"$work/$name.in" >"$work/$name.out" 2>"$work/$name.err" &
  local pid=$!
  pids+=("$pid")
  exec {fd}>"$work/$name.in"
  eval "${name}_pid=$pid; ${name}_fd=$fd"
  targets+=("$name")
}
wait_ready() { # name
  local i pid_var="${1}_pid"
  for i in $(seq 300); do
    grep -q READY "$work/$1.out" && return 0
    kill -0 "${!pid_var}" 2>/dev/null || die "target $1 exited: $(cat "$work/$1.out")"
    sleep 0.1
  done
  die "target $1 did not start within 30 s"
}

# Every engine (and etcd) must sit in one of the test's namespaces, with its sockets on the
# test's /24 (or the namespace's own loopback), never in the root namespace.
check_sockets() {
  local root_ns h pid ns bad ours=" "
  root_ns=$(readlink /proc/self/ns/net)
  for h in a b c; do ours+="$(in_ns "$h" readlink /proc/self/ns/net) "; done
  for pid in "${pids[@]}"; do
    kill -0 "$pid" 2>/dev/null || continue
    ns=$(readlink "/proc/$pid/ns/net")
    [ "$ns" != "$root_ns" ] && [[ $ours == *" $ns "* ]] ||
      die "process $pid ($(cat "/proc/$pid/comm")) runs in network namespace $ns, not one of the test's"
  done
  for h in a b c; do
    bad=$(in_ns "$h" ss -tanH | awk -v net="$net." '{ l = $4; sub(/:[0-9*]+$/, "", l); gsub(/[\[\]]/, "", l); sub(/^::ffff:/, "", l)
                                                   if (index(l, net) != 1 && l != "127.0.0.1" && l != "::1") print }')
    [ -z "$bad" ] || die "sockets in host $h outside $net.0/24: $bad"
  done
  log "sockets by host:"
  for h in a b c; do in_ns "$h" ss -tanpH | awk -v h="$h" '{ print "    " h ": " $1 " " $4 " -> " $5 " " $6 }' | sort | uniq -c | sort -rn | head -n 12; done
  pass "every engine and etcd run inside the test's namespaces, every TCP socket (transports: $transports) is on $net.0/24 or the namespace's loopback"
}

check_alive() { # names...: target engines that must still run (a crash shows here, named)
  local name pid_var
  for name in "$@"; do
    pid_var="${name}_pid"
    kill -0 "${!pid_var}" 2>/dev/null || die "target $name is not running"
  done
  pass "target engines $* still run"
}

run_client() { # scenario hosts... ; cues are answered by the function in $on_wait
  local scenario=$1 cfd
  shift
  mkfifo "$work/client-$scenario.in"
  : >"$work/client-$scenario.out" # before the loop below reads it
  ip netns exec "$p-${client_ns:-b}" "$client_bin" "${client_metadata:-$metadata}" "${client_ip:-$net.2}" "$transports" "$scenario" "$@" \
    <"$work/client-$scenario.in" >"$work/client-$scenario.out" 2>"$work/client-$scenario.err" &
  local pid=$!
  pids+=("$pid")
  exec {cfd}>"$work/client-$scenario.in"
  local answered=0 shown=0 deadline=$((SECONDS + 90)) waiting want
  while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do
    # Show the client's lines as they come, so the log reads in order with the script's.
    local total
    total=$(wc -l <"$work/client-$scenario.out")
    if [ "$total" -gt "$shown" ]; then sed -n "$((shown + 1)),${total}p" "$work/client-$scenario.out" | sed 's/^/  /'; shown=$total; fi
    waiting=$(grep -c '^WAITING' "$work/client-$scenario.out" || true)
    if [ "$waiting" -gt "$answered" ]; then
      want=$(grep '^WAITING' "$work/client-$scenario.out" | tail -1 | cut -d' ' -f2)
      "$on_wait" "$want"
      echo "$want" >&"$cfd"
      answered=$waiting
    fi
    sleep 0.05
  done
  exec {cfd}>&-
  kill -0 "$pid" 2>/dev/null && { kill -9 "$pid"; die "scenario $scenario still running after 90 s"; }
  local rc=0
  wait "$pid" || rc=$?
  sed -n "$((shown + 1)),\$p" "$work/client-$scenario.out" | sed 's/^/  /'
  local n
  n=$(grep -c '^PASS:' "$work/client-$scenario.out" || true)
  passed=$((passed + n))
  [ $rc -eq 0 ] && grep -q "^DONE $scenario" "$work/client-$scenario.out" || die "scenario $scenario (client exit $rc)"
}

log "transports: $transports; metadata $metadata (etcd inside host a)"
[[ ",$transports," == *,efa,* ]] || echo "NOTE: efa.so is not built: every scenario runs over $transports only"
start_etcd
wait_reaches_etcd b
wait_reaches_etcd c
launch_target a A
launch_target c C
wait_ready A
wait_ready C

# 1. Transfers across hosts, every byte checked, over every transport.
sockets_checked() { check_sockets; }
on_wait=sockets_checked
run_client transfer "A=$net.1" "C=$net.3"
check_alive A C

# 2. Cut the link to host a: ops time out with a clear error; restore it: new ops succeed.
cut_link() {
  case "$1" in
    cut) in_ns br ip link set "${p}a-br" down; log "link to host a cut" ;;
    restored)
      in_ns br ip link set "${p}a-br" up
      wait_reaches_etcd b
      log "link to host a restored (host b reaches it again)"
      ;;
  esac
}
on_wait=cut_link
run_client link "A=$net.1"
check_alive A C
# etcd lives in host a: while the link was cut, the engines of the other hosts lost their
# leases, and they must have registered again by themselves.
wait_registered A C
pass "after the cut, the engines cut off from etcd registered again: $(etcd_keys | tr '\n' ' ')"

# 3. Kill a host mid-transfer: its in-flight ops fail, the others carry on, its segment leaves etcd.
kill_c() {
  kill -9 "$C_pid"
  wait "$C_pid" 2>/dev/null || true
  local t kept=()
  for t in "${targets[@]}"; do [ "$t" = C ] || kept+=("$t"); done
  targets=("${kept[@]}")
  log "host c's engine killed (kill -9) mid-transfer"
}
on_wait=kill_c
run_client kill "A=$net.1" "C=$net.3"
check_alive A
if grep -qx C <<<"$(etcd_keys)"; then die "C is still in etcd after the kill scenario"; fi
pass "etcd no longer lists the killed C (etcd now lists: $(etcd_keys | tr '\n' ' '))"

# 4. Restart etcd with no data while engines run, and start an engine while etcd is down.
restart_etcd() {
  case "$1" in
    etcd-restarted)
      stop_etcd
      log "etcd stopped"
      # A new engine starts in host c while etcd is unreachable: it must retry with backoff and say so.
      launch_target c D --option metadata_retry_ms=60000
      local i
      for i in $(seq 150); do
        [ "$(grep -c 'etcd unreachable.*retrying in' "$work/D.err" || true)" -ge 3 ] && break
        sleep 0.1
      done
      local waits
      waits=$(grep -o 'retrying in [0-9]* ms' "$work/D.err" | awk '{print $3}' | tr '\n' ' ')
      [ "$(echo "$waits" | wc -w)" -ge 3 ] || die "D, started while etcd was down, did not say it retries: $(cat "$work/D.err")"
      # shellcheck disable=SC2086
      /usr/bin/python3 -c 'import sys; w = [int(x) for x in sys.argv[1:]]; sys.exit(0 if all(b > a for a, b in zip(w, w[1:3])) else 1)' $waits ||
        die "D's retries do not back off: waits $waits ms"
      grep -q READY "$work/D.out" && die "D reported READY while etcd was down"
      pass "D, started while etcd was down, retries with growing waits (${waits% } ms) and says so: $(grep -m1 'etcd unreachable' "$work/D.err")"
      start_etcd wipe
      log "etcd restarted with no data"
      wait_ready D
      pass "D finished starting once etcd was back"
      ;;
    keys-checked)
      wait_registered A D initiator-etcd
      pass "every running engine is registered again after the etcd restart: $(etcd_keys | tr '\n' ' ')"
      ;;
  esac
}
on_wait=restart_etcd
run_client etcd "A=$net.1" "D=$net.3"
check_alive A D

# 5. Failover across hosts (tcp and efa both loaded): the link to host a shaped to 1 Gbit/s each
# way (tc htb; this kernel has no netem), then one transport's packets from a target in host a
# dropped mid-batch (a tc u32 filter sending them to an 8 bit/s class): its ops stall for
# op_timeout_ms and move to the other transport, every op succeeds, every byte is checked.
# tc's htb qdisc and u32 filter shape and drop below; a kernel without them skips those parts.
have_htb() {
  in_ns br tc qdisc add dev br0 root handle 1: htb default 10 2>/dev/null &&
    in_ns br tc filter add dev br0 parent 1: protocol ip prio 1 u32 match ip sport 1 0xffff flowid 1:10 2>/dev/null &&
    in_ns br tc qdisc del dev br0 root 2>/dev/null
}
if ! have_htb; then
  echo "SKIPPED: failover across hosts and rails: this kernel has no tc htb qdisc or u32 filter, which they shape and drop packets with; the rest of this suite ran"
elif [[ ",$transports," == *,efa,* ]]; then
  f_tcp_port=7471 # F's tcp.so listens here; anything else F sends is efa's (or etcd's, allowed)
  launch_target a F --size 268435456 --option tcp.port=$f_tcp_port
  wait_ready F
  shape() { # ns dev: 1 Gbit/s by default (class 1:10), 8 bit/s for what the filters send to 1:20
    in_ns "$1" tc qdisc add dev "$2" root handle 1: htb default 10
    in_ns "$1" tc class add dev "$2" parent 1: classid 1:10 htb rate 1gbit ceil 1gbit
    in_ns "$1" tc class add dev "$2" parent 1: classid 1:20 htb rate 8bit ceil 8bit
  }
  shape a "${p}a"
  shape br "${p}a-br"
  pass "link to host a shaped: 1 Gbit/s each way ($(in_ns a tc -s class show dev "${p}a" | grep -c 'class htb') htb classes on ${p}a)"
  drop_transport() {
    local dev="${p}a" f=(tc filter add dev "${p}a" parent 1: protocol ip)
    case "$1" in
      drop-tcp)
        in_ns a "${f[@]}" prio 1 u32 match ip sport $f_tcp_port 0xffff flowid 1:20
        log "tcp.so's packets from F dropped (sport $f_tcp_port)"
        ;;
      drop-efa)
        in_ns a "${f[@]}" prio 1 u32 match ip sport $f_tcp_port 0xffff flowid 1:10
        in_ns a "${f[@]}" prio 2 u32 match ip sport 2379 0xffff flowid 1:10
        in_ns a "${f[@]}" prio 3 u32 match u32 0 0 flowid 1:20
        log "efa.so's packets from F dropped (all but tcp.so's and etcd's)"
        ;;
      restore-*)
        for prio in 1 2 3; do in_ns a tc filter del dev "$dev" parent 1: prio $prio 2>/dev/null || true; done
        log "F's packets pass again"
        ;;
    esac
  }
  on_wait=drop_transport
  run_client failover-tcp "F=$net.1"
  run_client failover-efa "F=$net.1"
  check_alive F
else
  echo "NOTE: failover across hosts needs two transports (tcp,efa): not run"
fi

# 6. Rails: two more hosts, x and y, joined by two links of their own (no bridge), shaped to
# 1 and 3 Gbit/s by default; tcp.rails names both addresses on each side. The client measures each rail
# alone and both (printed), then takes rail 2 down mid-batch (its slices move to rail 1: no op
# fails) and brings it back (it carries traffic again after its pause).
have_htb && {
ip netns add "$p-x"
ip netns add "$p-y"
# FERRY_NETNS_RAIL_GBIT="2 6" shapes them otherwise (a machine with the CPU to fill faster links).
read -r rail1_gbit rail2_gbit <<<"${FERRY_NETNS_RAIL_GBIT:-1 3}"
declare -A rail_rate=([1]="${rail1_gbit}gbit" [2]="${rail2_gbit}gbit")
for r in 1 2; do
  ip link add "${p}x$r" netns "$p-x" type veth peer name "${p}y$r" netns "$p-y"
  in_ns x ip addr add "10.213.7$r.1/24" dev "${p}x$r"
  in_ns y ip addr add "10.213.7$r.2/24" dev "${p}y$r"
  for h in x y; do
    in_ns $h ip link set "${p}$h$r" up
    in_ns $h tc qdisc add dev "${p}$h$r" root handle 1: htb default 10
    in_ns $h tc class add dev "${p}$h$r" parent 1: classid 1:10 htb rate "${rail_rate[$r]}" ceil "${rail_rate[$r]}"
  done
done
in_ns x ip link set lo up
in_ns y ip link set lo up
mkfifo "$work/R.in"
ip netns exec "$p-x" "$peer_bin" --size 268435456 --option metadata=P2PHANDSHAKE --option local_ip=10.213.71.1 \
  --option rpc_port=7600 --option plugins=tcp --option tcp.rails=auto --option host_id=host-x \
  <"$work/R.in" >"$work/R.out" 2>"$work/R.err" &
R_pid=$!
pids+=("$R_pid")
exec {R_fd}>"$work/R.in"
targets+=(R)
wait_ready R
rails_line=$(grep -m1 "listening on 2 rails" "$work/R.err") || die "R (tcp.rails=auto) does not listen on both of host x's addresses: $(grep -m1 listening "$work/R.err")"
grep -q "10.213.71.1:" <<<"$rails_line" && grep -q "10.213.72.1:" <<<"$rails_line" || die "R's rails are not host x's two addresses: $rails_line"
pass "rails: hosts x and y joined by two links, $rail1_gbit and $rail2_gbit Gbit/s each way (tc htb); target R with tcp.rails=auto found both of host x's addresses (${rails_line#*tcp: })"
rail_event() {
  local dev="${p}y2"
  case "$1" in
    equal-rails)
      for h in x y; do
        in_ns $h tc class change dev "${p}${h}2" parent 1: classid 1:10 htb rate "${rail_rate[1]}" ceil "${rail_rate[1]}"
      done
      log "rail 2 shaped to $rail1_gbit Gbit/s, as rail 1"
      ;;
    rail-down)
      in_ns y ip link set "$dev" down
      log "rail 2 ($dev) down"
      ;;
    rail-blackhole)
      for h in x y; do
        in_ns $h tc class add dev "${p}${h}2" parent 1: classid 1:20 htb rate 8bit ceil 8bit
        in_ns $h tc filter add dev "${p}${h}2" parent 1: protocol ip prio 1 u32 match u32 0 0 flowid 1:20
      done
      log "rail 2: every packet dropped (both ends)"
      ;;
    rail-up)
      in_ns y ip link set "$dev" up
      for h in x y; do
        in_ns $h tc filter del dev "${p}${h}2" parent 1: prio 1 2>/dev/null || true
      done
      log "rail 2 ($dev) up, passing packets"
      ;;
  esac
}
on_wait=rail_event client_ns=y client_metadata=P2PHANDSHAKE client_ip=10.213.71.2 transports=tcp \
  run_client rails "10.213.71.1:7600=10.213.71.1" 10.213.71.2 10.213.72.2 "${p}y2"
check_alive R
}

check_routes
status=0
echo "$passed passed, 0 failed"
