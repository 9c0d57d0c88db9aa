#!/usr/bin/env bash
# Builds the core wheel (meson-python, then retagged py3-none-<platform>) and plugin wheels,
# installs them into a fresh virtualenv (Debian's /usr/bin/python3, --system-site-packages for
# cffi, numpy and pytest), and runs pytest against the INSTALLED package, from outside the
# source tree.
#
#   run_wheel_tests.sh BUILDDIR [NAME:VARIANT:PLUGIN.so ...]
#
# BUILDDIR is the main meson build directory; its example.so becomes two test plugin wheels (one
# in the plain plugin directory, one in a cuda99/ variant directory), and each NAME:VARIANT:FILE
# argument (e.g. ferry-transfer-engine-rocm5:rocm5:build/plugins/rocm/rocm5/hip_ipc.so) one real plugin wheel.
# The core wheel is built in BUILDDIR's sibling BUILDDIR-pywheel (FERRY_WHEEL_BUILDDIR), with
# the same compiler flags and relative paths as a default build so ccache serves its objects.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:?usage: run_wheel_tests.sh BUILDDIR [NAME:VARIANT:PLUGIN.so ...]}" && pwd)
shift
PY=/usr/bin/python3  # Debian's: python3-mesonpy, python3-wheel, python3-cffi, python3-numpy
work="$build/python/wheel-test"
dist="$work/dist"
wheelbuild=${FERRY_WHEEL_BUILDDIR:-$(dirname "$build")/$(basename "$build")-pywheel}
rm -rf "$work"
mkdir -p "$dist"
t0=$(date +%s)
step() { echo "== $* ($(($(date +%s) - t0)) s)"; }

missing=()
for m in mesonpy wheel cffi numpy pytest venv; do
  $PY -c "import $m" 2>/dev/null || missing+=("$m")
done
command -v patchelf >/dev/null || missing+=(patchelf)
if [ ${#missing[@]} -gt 0 ]; then
  echo "missing: ${missing[*]} (Debian: python3-mesonpy python3-wheel python3-cffi python3-numpy" \
       "python3-pytest python3-venv patchelf; .ci/deps.sh installs them)" >&2
  [ "${CI:-}" = true ] && exit 1
  exit 77  # meson: skipped
fi

# The checkout as git sees it, ignored files included (build directories aside): a wheel
# build must leave it exactly so (meson-python 0.12 used to leave .mesonpy-native-file.ini).
tree_state() { git -C "$src" status --porcelain --ignored --untracked-files=all 2>/dev/null | grep -vE '^!! build[^/]*/' || true; }
before=$(tree_state)
# A stale native file in the source tree, as an interrupted build of an older wheels.py left
# it (the very text meson-python writes): meson-python 0.12 then took a fresh build dir for one
# to reconfigure and failed ("Directory does not contain a valid build tree"). The build must
# not depend on it (removed again below); the second build's dir is always fresh.
stale=""
[ -e "$src/.mesonpy-native-file.ini" ] || { stale="$src/.mesonpy-native-file.ini"; printf "\n[binaries]\npython = '%s'\n" "$PY" >"$stale"; }
before_stale=$(tree_state)

# Where the main build found NIXL, the core wheel carries the NIXL drop-in directory built
# against it (ferry_te/lib/nixl/); test_wheels.py loads it copied out of the wheel.
setup=()
if [ -n "${FERRY_TEST_NIXL_PREFIX:-}" ]; then
  setup=("--setup-arg=-Dpath_nixl=$FERRY_TEST_NIXL_PREFIX" "--setup-arg=-Dnixl=enabled")
fi

step "core wheel, twice at once: $wheelbuild and ${wheelbuild}-2 (logs: $work/core-wheel*.log)"
# The second build has the same depth (so ccache serves it too) and must not disturb the first.
rm -rf "${wheelbuild}-2"
$PY "$src/python/tools/wheels.py" core --out "$work/dist-2" --builddir "${wheelbuild}-2" \
  --jobs 1 ${setup[@]+"${setup[@]}"} >"$work/core-wheel-2.log" 2>&1 &
second=$!
$PY "$src/python/tools/wheels.py" core --out "$dist" --builddir "$wheelbuild" \
  --jobs "${FERRY_WHEEL_JOBS:-2}" ${setup[@]+"${setup[@]}"} >"$work/core-wheel.log" 2>&1 &
first=$!
# A cold build (no ccache) takes minutes: say where each build is every 30 s.
while kill -0 $first 2>/dev/null; do
  for _ in $(seq 30); do kill -0 $first 2>/dev/null && sleep 1; done
  kill -0 $first 2>/dev/null || break
  echo "   ... $(($(date +%s) - t0)) s: first $(grep -aoE '^\[[0-9]+/[0-9]+\]' "$work/core-wheel.log" | tail -1 || true)," \
       "second $(grep -aoE '^\[[0-9]+/[0-9]+\]' "$work/core-wheel-2.log" | tail -1 || true)"
done
if ! wait $first; then
  tail -60 "$work/core-wheel.log"
  echo "core wheel build failed; full log: $work/core-wheel.log" >&2
  wait $second || true; [ -n "$stale" ] && rm -f "$stale"
  exit 1
fi
step "first core wheel done; waiting for the second"
second_rc=0; wait $second || second_rc=$?
after_stale=$(tree_state)
[ -n "$stale" ] && rm -f "$stale"
after=$(tree_state)
if [ $second_rc != 0 ]; then
  tail -40 "$work/core-wheel-2.log"
  echo "the second, concurrent core wheel build failed (exit $second_rc); log: $work/core-wheel-2.log" >&2
  exit 1
fi
if [ "$before_stale" != "$after_stale" ] || [ "$before" != "$after" ]; then
  echo "the wheel builds changed the checkout:" >&2
  diff <(echo "$before_stale") <(echo "$after_stale") >&2 || true
  exit 1
fi
echo "checkout unchanged by two concurrent wheel builds (git status --ignored, build*/ aside)"
grep -E "^wheels: (dropping|vendored|  ferry_te/|newest|core wheel|NIXL drop-in|no NIXL)" "$work/core-wheel.log" || true

step "plugin wheels"
specs=()
example="$build/plugins/example/example.so"
if [ -f "$example" ]; then
  specs+=("ferry-transfer-engine-example-plugin::$example" "ferry-transfer-engine-cuda99:cuda99:$example")
fi
specs+=("$@")
plugin_wheels=()
for spec in "${specs[@]}"; do
  IFS=: read -r name variant file <<<"$spec"
  whl=$($PY "$src/python/tools/wheels.py" plugin --out "$dist" --name "$name" --variant "$variant" \
        --summary "Ferry plugin wheel built by run_wheel_tests.sh" "$file" 2>>"$work/plugin-wheels.log" \
        | tail -1) || { cat "$work/plugin-wheels.log"; exit 1; }
  plugin_wheels+=("$whl")
done
if [ ${#plugin_wheels[@]} -gt 0 ]; then
  $PY "$src/python/tools/wheels.py" manifest --out "$dist/plugin-wheels.json" "${plugin_wheels[@]}"
fi

step "auditwheel (sid's python3-auditwheel, a Debian package: python/tools/fetch_auditwheel.sh)"
if aw=$("$src/python/tools/fetch_auditwheel.sh" 2>"$work/auditwheel-fetch.log"); then
  export FERRY_AUDITWHEEL_PATH=$aw
  PYTHONPATH=$aw $PY -m auditwheel --version
else
  cat "$work/auditwheel-fetch.log"
  echo "could not fetch auditwheel (log above): test_auditwheel_agrees_with_every_tag will say so" >&2
fi

step "virtualenv"
$PY -m venv --system-site-packages "$work/venv"
vpy="$work/venv/bin/python"
$vpy -m pip install -q --no-index --no-deps "$dist"/ferry_transfer_engine-*-py3-none-*.whl
for whl in "${plugin_wheels[@]}"; do  # one at a time, each adding files next to the others
  $vpy -m pip install -q --no-index --no-deps "$whl"
done
$vpy -m pip list 2>/dev/null | grep -i ferry || true

step "pytest (installed package; cwd $work)"
cd "$work"
status=0
env -u FERRY_PLUGIN_PATH -u FERRY_PLUGINS -u FERRY_LIBRARY -u FERRY_HEADER -u PYTHONPATH \
  FERRY_SOURCE_ROOT="$src" FERRY_TEST_WHEEL_DIR="$dist" FERRY_AUDITWHEEL_PATH="${FERRY_AUDITWHEEL_PATH:-}" \
  "$vpy" -m pytest -v -rs -p no:cacheprovider --junitxml="$work/junit.xml" \
  --rootdir "$src/python/tests" "$src/python/tests" || status=$?
# Counted by .ci/test.sh's closing "N passed, N failed" line, which reads GoogleTest's format.
$PY - "$work/junit.xml" <<'PY' || true
import sys, xml.etree.ElementTree as ET
s = ET.parse(sys.argv[1]).getroot()
s = s if s.tag == "testsuite" else s.find("testsuite")
total, fail, err, skip = (int(s.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
print("[  PASSED  ] %d tests." % (total - fail - err - skip))
if fail + err:
    print("[  FAILED  ] %d tests" % (fail + err))
PY
step "done"
exit $status
