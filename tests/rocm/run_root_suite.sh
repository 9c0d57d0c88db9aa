#!/usr/bin/env bash
# Ferry's ROCm variant choice against ROCm's real user space: a Debian sid root (made once by
# make_root.sh, cached) holding sid's HIP 6.4 and experimental's HIP 7.2 and rocm-core 7.2,
# switched between installs with dpkg. In each, this build's ferry-info (Debian 12 binaries,
# with their Boost/yaml-cpp copied in) reports, as JSON, the detected ROCm and its source, the
# variant chosen and why, and every rocm<N>/ plugin's state; check_info.py checks them. With
# each major's hipRTC, hip_kernel_check_rocmN compiles hip_ipc.so's copy kernel for the GPU
# architectures that ROCm serves (MI250, MI300X, MI355X, RDNA 3 and 4) and checks the code objects.
#   tests/rocm/run_root_suite.sh BUILD_DIR [--wheels DIST_DIR]
# --wheels: instead, the core wheel and each ferry-transfer-engine-rocm<N> plugin wheel in DIST_DIR, installed
# in a fresh venv of sid's CPython with ROCm N's user space, where ferry-info must pick it.
# Exits 77 after "SKIPPED: <reason>" when no root can be made; ends with "N passed, N failed".
set -euo pipefail
build=$(cd "${1:?usage: run_root_suite.sh BUILD_DIR [--wheels DIST_DIR]}" && pwd)
wheels=""
[ "${2:-}" = --wheels ] && wheels=$(cd "${3:?--wheels needs a directory}" && pwd)
root=${FERRY_ROCM_ROOT:-/var/cache/ferry-rocm/sid-root}
here=$(cd "$(dirname "$0")" && pwd)
start=$(date +%s)
variants=()
for d in "$build"/plugins/rocm/rocm*/; do [ -f "$d/hip_ipc.so" ] && variants+=("$(basename "$d")"); done
if [[ " ${variants[*]} " != *" rocm6 "* || " ${variants[*]} " != *" rocm7 "* ]]; then
  echo "SKIPPED: this build has no rocm6 and rocm7 hip_ipc.so (it has: ${variants[*]:-none}); configure with -Drocm_roots=\$(tests/rocm/fetch_rocm.sh | paste -sd,)"
  exit 77
fi
[ "$(id -u)" = 0 ] || { echo "SKIPPED: the sid root needs root (debootstrap, chroot, mount)"; exit 77; }
mkdir -p "$(dirname "$root")"
exec 9>"$root.lock"
flock 9 # one suite at a time per root
rc=0
"$here/make_root.sh" "$root" || rc=$?
[ $rc = 77 ] && exit 77
[ $rc = 0 ] || { echo "could not make the sid root (exit $rc)"; exit 1; }
echo "root ready after $(( $(date +%s) - start )) s"

# Ferry as installed: ferry-info next to libferry (its RUNPATH is $ORIGIN), the plugins in
# <libdir>/ferry/plugins/rocm<N>/, and the Debian 12 libraries they need in their own directory.
stage=$root/opt/ferry
rm -rf "$stage" "$root/opt/rocm" "$root"/opt/rocm-* "$root/etc/ld.so.conf.d/rocm.conf"
mkdir -p "$stage/lib/ferry/plugins" "$stage/hostlib"
cp -L "$build/core/ferry-info" "$build/core/libferry.so.0" "$stage/lib/"
for v in "${variants[@]}"; do
  mkdir -p "$stage/lib/ferry/plugins/$v"
  cp "$build/plugins/rocm/$v"/*.so "$stage/lib/ferry/plugins/$v/"
  if [ -f "$build/tests/rocm/hip_kernel_check_$v" ]; then cp "$build/tests/rocm/hip_kernel_check_$v" "$stage/lib/"; fi
done
for lib in $(ldd "$build/core/ferry-info" "$build/core/libferry.so.0" "$build"/plugins/rocm/*/rdma.so |
             awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u); do
  case $(basename "$lib") in
    libc.so*|libm.so*|libstdc++.so*|libgcc_s.so*|ld-linux*|libferry.so*) ;; # sid's own, or staged
    *) cp -L "$lib" "$stage/hostlib/" ;;
  esac
done
printf '/opt/ferry/lib\n/opt/ferry/hostlib\n' >"$root/etc/ld.so.conf.d/ferry.conf"
# The HIP runtime and $ORIGIN read /proc.
if ! mountpoint -q "$root/proc" && ! mount -t proc proc "$root/proc" 2>/dev/null; then
  echo "SKIPPED: cannot mount /proc in the sid root (an unprivileged container?)"; exit 77
fi
trap 'umount "$root/proc" 2>/dev/null || true' EXIT

in_root() { chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }
debs=/var/cache/apt/archives
deb() { (cd "$root$debs" && ls "$1"_"$2"*.deb | head -1); } # newest cached .deb of a package/version
have() { in_root dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
remove() { for p in "$@"; do if have "$p"; then in_root dpkg --purge --force-depends "$p" >/dev/null; fi; done; }
install() { # package=version-prefix ...
  local files=()
  for spec in "$@"; do files+=("$debs/$(deb "${spec%%=*}" "${spec#*=}")"); done
  in_root dpkg -i --force-depends --force-downgrade "${files[@]}" >/dev/null 2>&1
}
hsa6=(libhsa-runtime64-1=6 libamd-comgr3=7.0)
hsa7=(libhsa-runtime64-1=7 libamd-comgr3=7.2)

passed=0 failed=0
check() { # name, then check_info.py arguments; ferry-info runs in the root as it is now
  local name=$1; shift
  local bin=/opt/ferry/lib/ferry-info
  [ "${*: -2:1}" = --ferry-info ] && { bin=${*: -1}; set -- "${@:1:$(($# - 2))}"; }
  in_root ldconfig
  local out
  out=$(in_root "$bin" --json 2>&1) || true
  if /usr/bin/python3 "$here/check_info.py" "$@" <<<"$out"; then
    passed=$((passed + 1)); echo "ok: $name"
  else
    failed=$((failed + 1)); echo "FAILED: $name"; echo "$out" | head -c 6000; echo
  fi
}
kernel_check() { # major, then hip_kernel_check.cpp's architectures: hipRTC as the root has it now
  local v=rocm$1 out rc=0; shift
  in_root ldconfig
  # AMD_COMGR_CACHE=0: comgr 7 keeps compiled code in ~/.cache/comgr; each run compiles afresh.
  out=$(in_root env AMD_COMGR_CACHE=0 "/opt/ferry/lib/hip_kernel_check_$v" "$@" 2>&1) || rc=$?
  if [ $rc = 0 ]; then
    passed=$((passed + 1)); echo "ok: hipRTC ${v#rocm}: the copy kernel compiles for $*"
  else
    failed=$((failed + 1)); echo "FAILED: hipRTC ${v#rocm}: hip_kernel_check_$v exit $rc"
  fi
  sed 's/^/    /' <<<"$out" | cut -c1-300
}
kernel_archs=(gfx90a gfx942 gfx942:sramecc+:xnack- gfx950 gfx1100 gfx1201 '!gfx9999')
kfd() { if [ "$1" = on ]; then rm -f "$root/dev/kfd"; : >"$root/dev/kfd"; else rm -f "$root/dev/kfd"; fi; }
kfd off
rocm6() { remove libamdhip64-7 librocm-core1; install "${hsa6[@]}" libamdhip64-6=6.4; }
rocm7() { remove libamdhip64-6; install "${hsa7[@]}" libamdhip64-7=7.2 librocm-core1=7.2; }
restore() { install libamdhip64-6=6.4 libamdhip64-7=7.2 librocm-core1=7.2; in_root ldconfig; } # as make_root.sh left it

if [ -n "$wheels" ]; then
  core=$(ls "$wheels"/ferry_transfer_engine-*-py3-none-*.whl 2>/dev/null | head -1)
  [ -n "$core" ] || { echo "SKIPPED: no core wheel in $wheels"; exit 77; }
  rm -rf "$root/tmp/wheels" && mkdir -p "$root/tmp/wheels" && cp "$wheels"/*.whl "$root/tmp/wheels/"
  echo "sid's CPython: $(in_root python3 --version)"
  for v in rocm6 rocm7; do
    whl=$(ls "$wheels"/ferry_transfer_engine_${v}-*.whl 2>/dev/null | head -1)
    [ -n "$whl" ] || { failed=$((failed + 1)); echo "FAILED: no ferry-transfer-engine-$v wheel in $wheels"; continue; }
    echo "== $(basename "$whl") with ROCm ${v#rocm}'s user space, in a fresh venv =="
    $v
    in_root rm -rf /tmp/venv
    # --system-site-packages: sid's python3-cffi (nothing here may reach an index).
    in_root python3 -m venv --system-site-packages /tmp/venv
    in_root /tmp/venv/bin/pip install -q --no-index --no-deps "/tmp/wheels/$(basename "$core")" "/tmp/wheels/$(basename "$whl")"
    plugdir=$(in_root /tmp/venv/bin/python -c "import ferry_te, os; print(os.path.join(ferry_te.package_root(), 'lib/ferry/plugins'))")
    check "$(basename "$whl"): ferry-info picks $plugdir/$v/hip_ipc.so" --major "${v#rocm}" --variant "$v" \
      --hip "$v=unavailable:no /dev/kfd" --path "$v=$plugdir/$v/hip_ipc.so" --ferry-info /tmp/venv/bin/ferry-info
    if in_root env FERRY_PLUGINS=tcp /tmp/venv/bin/python -c "import ferry_te; ferry_te.Engine(plugins='tcp').close()"; then
      passed=$((passed + 1)); echo "ok: the core wheel's bindings run on sid's CPython"
    else
      failed=$((failed + 1)); echo "FAILED: import ferry_te / Engine on sid's CPython"
    fi
  done
  # The Python test suite (python/tests) on sid's CPython against the installed core wheel and
  # the rocm7 plugin wheel beside it (bookworm's 3.11 runs it in python_wheels). The tests that
  # build or inspect wheels need the host's tools and stay there (FERRY_TEST_WHEEL_DIR unset).
  echo "== python/tests on $(in_root python3 --version), core + $(basename "$whl") installed =="
  rm -rf "$root/tmp/pytests" && cp -r "$here/../../python/tests" "$root/tmp/pytests"
  if in_root env HOME=/tmp /tmp/venv/bin/python -m pytest -q -rs -p no:cacheprovider /tmp/pytests \
      >"$root/tmp/pytests.log" 2>&1; then
    passed=$((passed + 1)); echo "ok: $(tail -1 "$root/tmp/pytests.log")"
  else
    failed=$((failed + 1)); echo "FAILED: python/tests on sid's CPython:"; tail -40 "$root/tmp/pytests.log"
  fi
  in_root rm -rf /tmp/venv /tmp/wheels /tmp/pytests /tmp/pytests.log
  restore
  echo "wheel suite: $(( $(date +%s) - start )) s"
  echo "$passed passed, $failed failed"
  [ "$failed" = 0 ]
  exit
fi

echo "== sid: ROCm 6.4 (libamdhip64-6, no rocm-core) =="
rocm6
check "6.4: rocm6 chosen from the soname, no /dev/kfd" --major 6 --source-has libamdhip64.so.6 \
  --variant rocm6 --hip rocm6=unavailable:"no /dev/kfd" --skipped rocm5,rocm7 --skip-reason rocm7="libamdhip64.so.7 is not on the loader path"
kfd on
check "6.4: with a /dev/kfd file, HIP 6.4 itself answers" --variant rocm6 --hip rocm6=unavailable:"(HIP error 100)"
kfd off
kernel_check 6 "${kernel_archs[@]}"

echo "== experimental: ROCm 7.2 (libamdhip64-7, librocm-core1) =="
rocm7
check "7.2: rocm7 chosen, rocm-core says 7.2.4" --major 7 --source rocm-core --detail "ROCm 7.2.4" \
  --variant rocm7 --hip rocm7=unavailable:"no /dev/kfd" --skipped rocm5,rocm6 --skip-reason rocm6="libamdhip64.so.6 is not on the loader path"
kfd on
check "7.2: with a /dev/kfd file, HIP 7.2 itself answers" --variant rocm7 --hip rocm7=unavailable:"(HIP error 100)"
kfd off
kernel_check 7 "${kernel_archs[@]}" gfx1250

echo "== mixed: rocm-core 7.2 with only libamdhip64.so.6 =="
remove libamdhip64-7
install libamdhip64-6=6.4
check "rocm-core 7 + HIP 6: rocm6 chosen, and why" --major 7 --source rocm-core --variant rocm6 \
  --choice-has "ROCm 7.2.4 (rocm-core) but libamdhip64.so.7 is not on the loader path; libamdhip64.so.6 is" \
  --hip rocm6=unavailable:"no /dev/kfd" --skipped rocm7 --skip-reason rocm7="ROCm 7.2.4 found (rocm-core) but libamdhip64.so.7 is not on the loader path"

echo "== mixed: libamdhip64.so.6 and .so.7 both installed =="
install libamdhip64-7=7.2
check "HIP 6 + HIP 7: rocm7 chosen, rocm6 shadowed" --major 7 --variant rocm7 --hip rocm7=unavailable:"no /dev/kfd" \
  --shadowed rocm6

echo "== AMD's layout: /opt/rocm-7.2.3 with an /opt/rocm symlink =="
remove libamdhip64-6 libamdhip64-7 librocm-core1
tmp=$(mktemp -d)
dpkg-deb -x "$root$debs/$(deb libamdhip64-7 7.2)" "$tmp"
mkdir -p "$root/opt/rocm-7.2.3/lib" "$root/opt/rocm-7.2.3/.info"
cp -a "$tmp"/usr/lib/x86_64-linux-gnu/libamdhip64.so.7* "$root/opt/rocm-7.2.3/lib/"
rm -rf "$tmp"
echo "7.2.3-131" >"$root/opt/rocm-7.2.3/.info/version"
ln -s rocm-7.2.3 "$root/opt/rocm"
check "/opt/rocm-7.2.3 off the loader path: says what to add" --major 7 --source /opt/rocm/.info/version \
  --no-variant --skipped rocm5,rocm6,rocm7 \
  --skip-reason rocm7="ROCm 7.2.3-131 found (/opt/rocm/.info/version) but libamdhip64.so.7 is not on the loader path: add /opt/rocm/lib to ld.so.conf (then run ldconfig) or LD_LIBRARY_PATH"
echo /opt/rocm/lib >"$root/etc/ld.so.conf.d/rocm.conf"
check "/opt/rocm-7.2.3 with /opt/rocm/lib in ld.so.conf: rocm7 chosen" --major 7 --variant rocm7 \
  --hip rocm7=unavailable:"no /dev/kfd" --skipped rocm5,rocm6
rm -rf "$root/etc/ld.so.conf.d/rocm.conf" "$root/opt/rocm" "$root"/opt/rocm-*
restore

echo "run-time suite: $(( $(date +%s) - start )) s"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
