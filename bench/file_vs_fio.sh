#!/usr/bin/env bash
# file.so next to fio on the same file, with O_DIRECT, the same block size and the same queue
# depth, in the same run.
#   bench/file_vs_fio.sh [build-dir] [file]
# The file (default: <build-dir>/file_vs_fio.bin, so on the build tree's disk) is laid out by fio
# to SIZE first, and removed at the end unless it was there before. Environment: SIZE (bytes of the file both use, default 1073741824), DURATION
# (seconds per measurement, default 5), REPEAT (rounds, default 3), CASES (which rows, default
# all: seqread seqwrite randread).
#
# Rows (name: fio job; transfer_engine_bench flags):
#   seqread  1 MiB sequential READ, 16 in flight: fio --rw=read --bs=1m --iodepth=16;
#            --block_size=1048576 --batch_size=4 --inflight_batches=4
#   seqwrite 1 MiB sequential WRITE, 16 in flight: fio --rw=write ...; the same, --operation=write
#   randread 4 KiB random READ, 32 in flight: fio --rw=randread --bs=4k --iodepth=32;
#            --block_size=4096 --pattern=random --batch_size=8 --inflight_batches=4
# fio runs ioengine=io_uring, direct=1, one job; file.so runs its defaults (direct=auto: every op
# here is aligned, so all go O_DIRECT). Each round runs fio then file.so for every row; the table
# gives the medians over the rounds and the median of the per-round ratios file.so / fio.
set -euo pipefail
build=${1:-build}
file=${2:-$build/file_vs_fio.bin}
size=${SIZE:-1073741824}
duration=${DURATION:-5}
repeat=${REPEAT:-3}
cases=${CASES:-seqread seqwrite randread}
bench="$build/bench/transfer_engine_bench"
py=/usr/bin/python3
command -v fio >/dev/null || { echo "fio is missing: apt-get install fio" >&2; exit 1; }
[ -x "$bench" ] || { echo "$bench is missing: build first (ninja -C $build bench/transfer_engine_bench core/ferry/plugins/file.so)" >&2; exit 1; }
fs=$(stat -f -c %T "$(dirname "$file")")
echo "file: $file on $fs, $size bytes; $duration s per measurement, $repeat rounds"
[ "$fs" = tmpfs ] && echo "note: $file is on tmpfs: O_DIRECT there is a memory copy, not the disk" >&2

# A file this script made goes when it ends; one that was there stays.
[ -e "$file" ] || trap 'rm -f "$file"' EXIT
fio --name=layout --filename="$file" --size="$size" --rw=write --bs=1m --direct=1 --ioengine=io_uring \
  --iodepth=16 --output-format=terse >/dev/null

row_flags() { # case -> "fio_rw bs depth bench-flags..."
  case $1 in
    seqread) echo "read 1m 16 --operation=read --block_size=1048576 --batch_size=4 --inflight_batches=4" ;;
    seqwrite) echo "write 1m 16 --operation=write --block_size=1048576 --batch_size=4 --inflight_batches=4" ;;
    randread) echo "randread 4k 32 --operation=read --pattern=random --block_size=4096 --batch_size=8 --inflight_batches=4" ;;
    *) echo "unknown case $1 (seqread seqwrite randread)" >&2; exit 1 ;;
  esac
}

run_fio() { # rw bs depth -> bytes/s
  fio --name=job --filename="$file" --size="$size" --rw="$1" --bs="$2" --iodepth="$3" --direct=1 \
    --ioengine=io_uring --runtime="$duration" --time_based --norandommap --randrepeat=0 \
    --output-format=json | $py -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; print(j["read"]["bw_bytes"]+j["write"]["bw_bytes"])'
}

run_ferry() { # bench flags -> bytes/s
  "$bench" --protocol=file --segment_id="file:$file" --buffer_size="$size" --duration="$duration" --json "$@" \
    2>/dev/null | $py -c 'import json,sys; j=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(j["bytes"]/j["duration_s"])'
}

declare -A fio_bw ferry_bw
for round in $(seq "$repeat"); do
  for c in $cases; do
    read -r rw bs depth flags <<<"$(row_flags "$c")"
    f=$(run_fio "$rw" "$bs" "$depth")
    # shellcheck disable=SC2086
    t=$(run_ferry $flags)
    fio_bw[$c]+="$f "
    ferry_bw[$c]+="$t "
    printf 'round %d %-8s fio %8.1f MB/s  file.so %8.1f MB/s\n' "$round" "$c" "$($py -c "print($f/1e6)")" "$($py -c "print($t/1e6)")"
  done
done
echo
printf '%-9s %14s %14s %8s\n' case "file.so MB/s" "fio MB/s" ratio
for c in $cases; do
  $py - "$c" "${ferry_bw[$c]}" "${fio_bw[$c]}" <<'EOF'
import statistics, sys
name, ferry, fio = sys.argv[1], [float(x) for x in sys.argv[2].split()], [float(x) for x in sys.argv[3].split()]
ratio = statistics.median(a / b for a, b in zip(ferry, fio))
print(f"{name:<9} {statistics.median(ferry) / 1e6:14.1f} {statistics.median(fio) / 1e6:14.1f} {ratio:8.3f}")
EOF
done
