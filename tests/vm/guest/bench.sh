#!/bin/sh
# The benchmarks (tests/vm/run bench), by suite (UZRAM_VM_CHECKS): "starved", the memory-starved
# build on each kind of swap (starved.sh); "devices", uzram and kernel zram in the same guest, same
# data, same fio jobs, lz4 and zstd, then a swap workload on disk swap, zram and uzram.
# Prints one "BENCH: {json}" line per measurement; tests/vm/bench-report turns them into the
# table, the JSON file and the plot. Under TCG the absolute figures mean little (and userspace is
# slowed more than the kernel): compare the ratios, and only between runs of the same setup.
D=$(dirname "$0")
. "$D/lib.sh"
. "$D/checks.sh"
# the host's UZRAM_BENCH_* settings (tests/vm/run writes them here)
[ -f "$UZRAM_VM_DIR/cache/bench.env" ] && . "$UZRAM_VM_DIR/cache/bench.env"
. "$D/starved.sh"

RUNTIME=${UZRAM_BENCH_RUNTIME:-5}
FILL_MB=${UZRAM_BENCH_FILL_MB:-128}
PAGES=$UZRAM_VM_DIR/cache/sample.pages

trap 'check_cleanup; zram_reset; uzram_reset' EXIT
vm_setup
note "bench: $(uname -r), $(nproc) cpus, MemTotal $(($(meminfo_kb MemTotal) / 1024)) MiB, fio ${RUNTIME}s per job"

emit() { echo "BENCH: $*"; }

# fill DEV: FILL_MB of real pages (the checked-in corpus, repeated), written once with dd
fill() {
    local dev=$1 i=0 n
    n=$(($(stat -c %s "$PAGES") / 1048576))
    [ "$n" -gt 0 ] || { note "no page corpus at $PAGES"; return 1; }
    while [ $((i * n)) -lt "$FILL_MB" ]; do
        dd if="$PAGES" of="$dev" bs=1M seek=$((i * n)) count=$n conv=notrunc oflag=direct 2>/dev/null || return 1
        i=$((i + 1))
    done
    sync
}

# fio_one DEV LABEL RW QD JOBS: one fio run on the filled region, its JSON on one line
fio_one() {
    local dev=$1 label=$2 rw=$3 qd=$4 jobs=$5 out=$UZ_TMP/bench-fio.json
    fio --name=b --filename="$dev" --direct=1 --ioengine=libaio --rw="$rw" --bs=4k --iodepth="$qd" \
        --numjobs="$jobs" --group_reporting=1 --size=${FILL_MB}m --time_based --runtime="$RUNTIME" \
        --randrepeat=0 --norandommap=1 --buffer_compress_percentage=58 --refill_buffers=1 \
        --output-format=json --output="$out" >/dev/null 2>&1 || { note "fio $label $rw failed"; return; }
    emit "{\"kind\":\"fio\",\"label\":\"$label\",\"rw\":\"$rw\",\"iodepth\":$qd,\"jobs\":$jobs,\"fio\":$(tr -d '\n' <"$out")}"
}

# device_bench DEV LABEL: fill, memory for the data, then the fio matrix
device_bench() {
    local dev=$1 label=$2 rss=0 t0
    t0=$(uptime_s)
    fill "$dev" || return
    case $dev in /dev/ublkb*)
        rss=$("$UZRAM_BIN" attr "$dev" uzram_stat | awk '$1 == "daemon_rss" { print $2 }') ;;
    esac
    emit "{\"kind\":\"memory\",\"label\":\"$label\",\"fill_mb\":$FILL_MB,\"fill_s\":$(elapsed "$t0"),\"mm_stat\":\"$(dev_mm_stat "$dev" | tr -s ' ' | sed 's/^ //')\",\"daemon_rss\":$rss}"
    for qd in 1 32; do
        for jobs in 1 2; do
            fio_one "$dev" "$label" randread $qd $jobs
        done
    done
    for qd in 1 32; do
        for jobs in 1 2; do
            fio_one "$dev" "$label" randwrite $qd $jobs
        done
    done
}

# swap_workload DEV LABEL: vmtool touching 2x MemAvailable of realistic pages, 3 passes
swap_workload() {
    local dev=$1 label=$2 avail t0 rc peak=0 used
    mkswap "$dev" >/dev/null 2>&1 && swapon --discard=pages -p 32767 "$dev" || { note "swapon $dev failed"; return; }
    SWAP_DEV=$dev
    sync
    echo 3 >/proc/sys/vm/drop_caches
    avail=$(($(meminfo_kb MemAvailable) / 1024))
    t0=$(uptime_s)
    "$TOOL" swapfill $((avail * 2)) "$SEED" 3 >"$UZ_TMP/bench-swap.log" 2>&1 &
    _p=$!
    while kill -0 $_p 2>/dev/null; do
        used=$(awk -v d="$dev" '$1 == d { print $4 }' /proc/swaps)
        [ "${used:-0}" -gt "$peak" ] && peak=$used
        sleep 1
    done
    wait $_p
    rc=$?
    emit "{\"kind\":\"swap\",\"label\":\"$label\",\"fill_mb\":$((avail * 2)),\"passes\":3,\"seconds\":$(elapsed "$t0"),\"exit\":$rc,\"peak_swap_kb\":$peak}"
    swapoff "$dev"
    SWAP_DEV=
}

devices_suite() {
    for algo in lz4 zstd; do
        if zram_has_algo $algo; then
            zram_setup $algo 512M && device_bench /dev/zram0 "zram-$algo"
            zram_reset
        fi
        uzram_setup $algo 512M && device_bench "$UZRAM_DEV" "uzram-$algo"
        uzram_reset
    done
    if [ -b /dev/vda ]; then
        swap_workload /dev/vda disk
    fi
    for algo in lz4 zstd; do
        if zram_has_algo $algo; then
            zram_setup $algo 2048M && swap_workload /dev/zram0 "zram-$algo"
            zram_reset
        fi
        uzram_setup $algo 2048M && swap_workload "$UZRAM_DEV" "uzram-$algo"
        uzram_reset
    done
}

SUITES=${UZRAM_VM_CHECKS:-starved devices}
zram_begin || exit 1
uzram_begin || exit 1
case " $SUITES " in *" starved "*) starved_suite ;; esac
case " $SUITES " in *" devices "*) devices_suite ;; esac
echo "UZRAM-BENCH-DONE"
