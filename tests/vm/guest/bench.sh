#!/bin/sh
# The benchmarks (tests/vm/run bench), by suite (UZRAM_VM_CHECKS): "starved", the memory-starved
# build on each kind of swap (starved.sh); "devices", uzram and kernel zram in the same guest, same
# data, same fio jobs, lz4 and zstd, then a swap workload on disk swap, zram and uzram.
# "memory", the daemon's whole cost at idle and for the same pages as kernel zram's.
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

# round_trips DEV: uzram's queue threads' counts (uzram_stat's queue_*), as JSON fields
round_trips() {
    "$UZRAM_BIN" attr "$1" uzram_stat | awk '$1 ~ /^queue_/ { printf "%s\"%s\":%s", s, substr($1, 7), $2; s = "," }'
}

# fio_one DEV LABEL RW QD JOBS: one fio run on the filled region, its JSON on one line (for
# uzram, with its queue threads' counts before and after)
fio_one() {
    local dev=$1 label=$2 rw=$3 qd=$4 jobs=$5 out=$UZ_TMP/bench-fio.json rt= pn=$2-$3-qd$4-x$5
    case $dev in /dev/ublkb*) rt="{$(round_trips "$dev")}" ;; esac
    # UZRAM_BENCH_DEVICES_PERF=1|g: each job profiled as the starved suite's configurations are
    STARVED_PERF=${UZRAM_BENCH_DEVICES_PERF:-} PERF_HZ=499 perf_start "$pn"
    fio --name=b --filename="$dev" --direct=1 --ioengine=libaio --rw="$rw" --bs=4k --iodepth="$qd" \
        --numjobs="$jobs" --group_reporting=1 --size=${FILL_MB}m --time_based --runtime="$RUNTIME" \
        --randrepeat=0 --norandommap=1 --buffer_compress_percentage=58 --refill_buffers=1 \
        --output-format=json --output="$out" >/dev/null 2>&1 || { STARVED_PERF=${UZRAM_BENCH_DEVICES_PERF:-} perf_stop "$pn"; note "fio $label $rw failed"; return; }
    STARVED_PERF=${UZRAM_BENCH_DEVICES_PERF:-} perf_stop "$pn"
    [ -n "$rt" ] && rt=",\"round_trips\":{\"before\":$rt,\"after\":{$(round_trips "$dev")}}"
    emit "{\"kind\":\"fio\",\"label\":\"$label\",\"rw\":\"$rw\",\"iodepth\":$qd,\"jobs\":$jobs$rt,\"fio\":$(tr -d '\n' <"$out")}"
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

# swap_workload DEV LABEL AVAIL_MB: vmtool touching 2x AVAIL_MB (MemAvailable measured before any
# device existed, so every device gets the same workload) of realistic pages, 3 passes
swap_workload() {
    local dev=$1 label=$2 avail=$3 t0 rc peak=0 used
    mkswap "$dev" >/dev/null 2>&1 && swapon --discard=pages -p 32767 "$dev" || { note "swapon $dev failed"; return; }
    SWAP_DEV=$dev
    sync
    echo 3 >/proc/sys/vm/drop_caches
    note "swap workload on $label: MemAvailable $(($(meminfo_kb MemAvailable) / 1024)) MiB now, $avail MiB before any device"
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

# UZRAM_BENCH_DEVICES_FIO=0 skips the fio jobs, UZRAM_BENCH_DEVICES_ALGOS picks their
# algorithms (default "lz4 zstd"); UZRAM_BENCH_SWAP_ALGOS picks the swap workload's (default
# "lz4 zstd"; "none" skips it, disk swap's included): for a quick side-by-side of two builds.
devices_suite() {
    local avail
    for algo in ${UZRAM_BENCH_DEVICES_ALGOS:-lz4 zstd}; do
        [ "${UZRAM_BENCH_DEVICES_FIO:-1}" = 0 ] && break
        if zram_has_algo $algo; then
            zram_setup $algo 512M && device_bench /dev/zram0 "zram-$algo"
            zram_reset
        fi
        uzram_setup $algo 512M && device_bench "$UZRAM_DEV" "uzram-$algo"
        uzram_reset
    done
    [ "${UZRAM_BENCH_SWAP_ALGOS-}" = none ] && return
    sync
    echo 3 >/proc/sys/vm/drop_caches
    avail=$(($(meminfo_kb MemAvailable) / 1024))
    if [ -b /dev/vda ]; then
        swap_workload /dev/vda disk "$avail"
    fi
    for algo in ${UZRAM_BENCH_SWAP_ALGOS:-lz4 zstd}; do
        if zram_has_algo $algo; then
            zram_setup $algo 2048M && swap_workload /dev/zram0 "zram-$algo" "$avail"
            zram_reset
        fi
        uzram_setup $algo 2048M && swap_workload "$UZRAM_DEV" "uzram-$algo" "$avail"
        uzram_reset
    done
}

# daemon_mem PID: the process's VmRSS RssAnon RssFile RssShmem VmLck, kB, from its status, then
# its Pss (proportional: a page shared with N processes counts 1/N) Pss_Anon Pss_File Pss_Shmem,
# kB, from its smaps_rollup
daemon_mem() {
    awk '$1 ~ /^(VmRSS|RssAnon|RssFile|RssShmem|VmLck):$/ { v[$1] = $2 }
        END { printf "%d %d %d %d %d", v["VmRSS:"], v["RssAnon:"], v["RssFile:"], v["RssShmem:"], v["VmLck:"] }' "/proc/$1/status"
    awk '$1 ~ /^(Pss|Pss_Anon|Pss_File|Pss_Shmem):$/ { v[$1] = $2 }
        END { printf " %d %d %d %d", v["Pss:"], v["Pss_Anon:"], v["Pss_File:"], v["Pss_Shmem:"] }' "/proc/$1/smaps_rollup"
}

# uzram_mem DEV: {"pid":..,"rss_kb":..,...} for DEV's daemon, all of it: the worker that serves
# the device (uzram_stat's daemon_pid) and every other process named uzram (its supervisor and
# its standby; the bench runs one device at a time). "all_kb" is the sum of their Pss (the
# binary's code, mapped by each, counts once), "rss_kb" the worker's own VmRSS;
# "processes" says each one's role, pid and Pss.
uzram_mem() {
    local pid p role all=0 anon=0 file=0 shmem=0 locked=0 procs= wrss=0 m
    pid=$("$UZRAM_BIN" attr "$1" uzram_stat | awk '$1 == "daemon_pid" { print $2 }')
    pid=${pid:-0}
    for p in /proc/[0-9]*; do
        [ "$(cat "$p/comm" 2>/dev/null)" = uzram ] || continue
        m=$(daemon_mem "${p#/proc/}" 2>/dev/null) || continue
        set -- $m 0 0 0 0 0 0 0 0 0
        if [ "${p#/proc/}" = "$pid" ]; then
            role=worker wrss=$1
        elif tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -q -- --standby; then
            role=standby
        elif [ "$(awk '$1 == "PPid:" { print $2 }' "/proc/$pid/status" 2>/dev/null)" = "${p#/proc/}" ]; then
            role=supervisor
        else
            role=other
        fi
        all=$((all + $6)) anon=$((anon + $7)) file=$((file + $8)) shmem=$((shmem + $9)) locked=$((locked + $5))
        procs="$procs${procs:+ }$role:${p#/proc/}:$6"
    done
    printf '"pid":%s,"all_kb":%s,"rss_kb":%s,"anon_kb":%s,"file_kb":%s,"shmem_kb":%s,"locked_kb":%s,"processes":"%s"' \
        "$pid" "$all" "$wrss" "$anon" "$file" "$shmem" "$locked" "$procs"
}

# smaps_big PID: "Rss_kB:range:perms:name" for each mapping of PID with 256 kB or more resident,
# largest first, separated by spaces
smaps_big() {
    awk '/^[0-9a-f]+-[0-9a-f]+ / { m = $1 ":" $2 ":" ($6 == "" ? "anon" : $6) }
        $1 == "Rss:" && $2 >= 256 { print $2 ":" m }' "/proc/$1/smaps" | sort -rn | tr '\n' ' '
}

# smaps_pss: "Pss_kB:pid:Private_kB:name" for each mapping of every uzram process with 64 kB or
# more of Pss, largest first, separated by spaces (where the all-in figure goes)
smaps_pss() {
    local p
    for p in /proc/[0-9]*; do
        [ "$(cat "$p/comm" 2>/dev/null)" = uzram ] || continue
        awk -v pid="${p#/proc/}" '/^[0-9a-f]+-[0-9a-f]+ / { n = ($6 == "" ? "anon" : $6) }
            $1 == "Pss:" { pss = $2 } $1 == "Private_Clean:" { priv = $2 }
            $1 == "Private_Dirty:" { priv += $2; if (pss >= 64) print pss ":" pid ":" priv ":" n }' "$p/smaps" 2>/dev/null
    done | sort -rn | tr '\n' ' '
}

# reserve_target DEV: the bytes DEV's pool reserve is kept at now
reserve_target() {
    "$UZRAM_BIN" attr "$1" uzram_stat | awk '$1 == "pool_reserve_target" { print $2 }'
}

# settle DEV: waits (up to 150 s) until DEV's pool reserve is at its least (none by default):
# it is whole while the guest's memory is short (as after an earlier suite's swap
# workload, until PSI's 10 s average falls) and halves each 10 s after; the I/O heap gives back
# what it committed then too. Prints the seconds it waited.
settle() {
    local t0 r
    t0=$(uptime_s)
    while [ "$(elapsed "$t0" | cut -d. -f1)" -lt 150 ]; do
        r=$(reserve_target "$1")
        [ -n "$r" ] && [ "$r" -gt 0 ] || break
        sleep 5
    done
    elapsed "$t0"
}

# memory_part NAME: whether UZRAM_BENCH_MEMORY_PARTS (default "idle fills recompressed") names
# NAME: the idle daemon, the fills of each algorithm, the recompressed pages
memory_part() {
    case " ${UZRAM_BENCH_MEMORY_PARTS:-idle fills recompressed} " in *" $1 "*) return 0 ;; esac
    return 1
}

# The daemon's memory all in (issue 14): a fresh 1 GiB device's whole cost at idle, then each
# algorithm's cost for the same pages against kernel zram's pool + table (16 B a page of
# disksize) in the same guest. UZRAM_BENCH_MEMORY_FILLS: MiB of pages (default 130).
memory_suite() {
    local disk=1073741824 table mb stat mem burst settle_s
    table=$((disk / 4096 * 16))
    if memory_part idle && uzram_setup lz4 1G; then
        # What the daemon holds once it has settled (its threads started, the reserve at its
        # least).
        sleep 5
        settle_s=$(settle "$UZRAM_DEV")
        emit "{\"kind\":\"smaps\",\"algorithm\":\"idle\",\"cpus\":$(nproc),\"fill_mb\":0,\"mappings\":\"$(smaps_big "$(uzram_mem "$UZRAM_DEV" | sed 's/"pid":\([0-9]*\).*/\1/')")\"}"
        emit "{\"kind\":\"idle\",\"cpus\":$(nproc),\"disksize\":$disk,\"slot_table\":$table,$(uzram_mem "$UZRAM_DEV"),\"settle_s\":$settle_s,\"uzram_stat\":\"$("$UZRAM_BIN" attr "$UZRAM_DEV" uzram_stat | tr '\n' ' ')\"}"
        uzram_reset
    fi
    for mb in ${UZRAM_BENCH_MEMORY_FILLS:-130}; do
        for algo in $(memory_part fills && echo lz4 zstd); do
            FILL_MB=$mb
            # What kernel zram holds beyond mem_used_total, measured: its table (vmalloc) and
            # zsmalloc's handles and zspage records (slab), as the guest's counters move from
            # before the device to after the writes (an idle guest: little else moves them).
            zram_reset
            slab0=$(meminfo_kb SUnreclaim) vm0=$(meminfo_kb VmallocUsed)
            if zram_has_algo $algo && zram_setup $algo 1G && fill /dev/zram0; then
                stat=$(dev_mm_stat /dev/zram0 | tr -s ' ' | sed 's/^ //')
                slab=$(($(meminfo_kb SUnreclaim) - slab0)) vmalloc=$(($(meminfo_kb VmallocUsed) - vm0))
                emit "{\"kind\":\"allin\",\"device\":\"zram\",\"algorithm\":\"$algo\",\"cpus\":$(nproc),\"fill_mb\":$mb,\"disksize\":$disk,\"table\":$table,\"mm_stat\":\"$stat\",\"slab_delta_kb\":$slab,\"vmalloc_delta_kb\":$vmalloc}"
            fi
            zram_reset
            if uzram_setup $algo 1G && fill "$UZRAM_DEV"; then
                # Right after the burst the reserve may be at its most; it halves every 10 s
                # without writes, down to its least. Both are reported: the burst's cost and
                # the settled one.
                burst=$(uzram_mem "$UZRAM_DEV" | sed 's/.*"all_kb":\([0-9]*\).*/\1/')
                settle_s=$(settle "$UZRAM_DEV")
                stat=$(dev_mm_stat "$UZRAM_DEV" | tr -s ' ' | sed 's/^ //')
                mem=$(uzram_mem "$UZRAM_DEV")
                # Where it is: every mapping holding 256 kB or more, largest first.
                emit "{\"kind\":\"smaps\",\"algorithm\":\"$algo\",\"cpus\":$(nproc),\"fill_mb\":$mb,\"mappings\":\"$(smaps_big "$(uzram_mem "$UZRAM_DEV" | sed 's/"pid":\([0-9]*\).*/\1/')")\"}"
                emit "{\"kind\":\"allin\",\"device\":\"uzram\",\"algorithm\":\"$algo\",\"cpus\":$(nproc),\"fill_mb\":$mb,\"disksize\":$disk,\"table\":$table,\"mm_stat\":\"$stat\",$mem,\"burst_rss_kb\":$burst,\"settle_s\":$settle_s,\"uzram_stat\":\"$("$UZRAM_BIN" attr "$UZRAM_DEV" uzram_stat | tr '\n' ' ')\"}"
            fi
            uzram_reset
        done
    done
    for mb in $(memory_part recompressed && echo "${UZRAM_BENCH_MEMORY_FILLS:-130}"); do
        FILL_MB=$mb
        memory_recompressed $mb
    done
    FILL_MB=${UZRAM_BENCH_FILL_MB:-128}
}

# memory_recompressed MB: the same pages idle and recompressed through zram's own attributes
# (`idle all`, `recompress type=idle`). Kernel zram at its best on this kernel: lz4 with zstd
# as its recompression algorithm where it has CONFIG_ZRAM_MULTI_COMP, zstd alone where it has
# not (Debian's 6.12 is built without it: no recomp_algorithm). uzram as a user would set it up: lz4 with
# --recomp-algorithm zstd, every other setting its default (the policy's groups among them).
memory_recompressed() {
    local mb=$1 disk=1073741824 table stat slab vmalloc zalgo usetup mem burst settle_s t0 rs slab0 vm0
    table=$((disk / 4096 * 16))
    zram_reset
    slab0=$(meminfo_kb SUnreclaim) vm0=$(meminfo_kb VmallocUsed)
    zalgo=
    # recomp_algorithm (CONFIG_ZRAM_MULTI_COMP only) is set before disksize, as comp_algorithm is
    if [ "$ZRAM_OURS" = 1 ] && [ -e $ZRAM/recomp_algorithm ] && echo lz4 >$ZRAM/comp_algorithm &&
        echo "algo=zstd" 2>/dev/null >$ZRAM/recomp_algorithm && echo 1G >$ZRAM/disksize; then
        zalgo=lz4+zstd
        note "zram0: lz4, recomp_algorithm zstd, disksize 1G"
    elif zram_reset; zram_has_algo zstd && zram_setup zstd 1G; then
        zalgo=zstd
    fi
    if [ -n "$zalgo" ] && fill /dev/zram0; then
        if [ "$zalgo" = lz4+zstd ] && ! { echo all >$ZRAM/idle && echo type=idle >$ZRAM/recompress; }; then
            note "memory: zram's recompress failed"
            zalgo=lz4-not-recompressed
        fi
        stat=$(dev_mm_stat /dev/zram0 | tr -s ' ' | sed 's/^ //')
        slab=$(($(meminfo_kb SUnreclaim) - slab0)) vmalloc=$(($(meminfo_kb VmallocUsed) - vm0))
        emit "{\"kind\":\"allin\",\"device\":\"zram\",\"algorithm\":\"recompressed\",\"setup\":\"$zalgo\",\"cpus\":$(nproc),\"fill_mb\":$mb,\"disksize\":$disk,\"table\":$table,\"mm_stat\":\"$stat\",\"slab_delta_kb\":$slab,\"vmalloc_delta_kb\":$vmalloc}"
    fi
    zram_reset
    if UZRAM_SETUP_EXTRA="--recomp-algorithm zstd" uzram_setup lz4 1G && fill "$UZRAM_DEV"; then
        t0=$(uptime_s)
        usetup=lz4+zstd
        if ! { "$UZRAM_BIN" attr "$UZRAM_DEV" idle all >/dev/null &&
            rs=$("$UZRAM_BIN" attr "$UZRAM_DEV" recompress type=idle 2>&1); }; then
            note "memory: uzram's recompress failed: $rs"
            usetup=lz4-not-recompressed
        fi
        note "memory: uzram recompressed $mb MiB in $(elapsed "$t0") s"
        burst=$(uzram_mem "$UZRAM_DEV" | sed 's/.*"all_kb":\([0-9]*\).*/\1/')
        settle_s=$(settle "$UZRAM_DEV")
        stat=$(dev_mm_stat "$UZRAM_DEV" | tr -s ' ' | sed 's/^ //')
        mem=$(uzram_mem "$UZRAM_DEV")
        emit "{\"kind\":\"smaps\",\"algorithm\":\"recompressed\",\"cpus\":$(nproc),\"fill_mb\":$mb,\"mappings\":\"$(smaps_big "$(uzram_mem "$UZRAM_DEV" | sed 's/"pid":\([0-9]*\).*/\1/')")\"}"
        emit "{\"kind\":\"smaps_pss\",\"algorithm\":\"recompressed\",\"cpus\":$(nproc),\"fill_mb\":$mb,\"mappings\":\"$(smaps_pss)\"}"
        emit "{\"kind\":\"allin\",\"device\":\"uzram\",\"algorithm\":\"recompressed\",\"setup\":\"$usetup\",\"cpus\":$(nproc),\"fill_mb\":$mb,\"disksize\":$disk,\"table\":$table,\"mm_stat\":\"$stat\",$mem,\"burst_rss_kb\":$burst,\"settle_s\":$settle_s,\"policy_stat\":\"$("$UZRAM_BIN" attr "$UZRAM_DEV" policy_stat | tr '\n' ' ')\",\"uzram_stat\":\"$("$UZRAM_BIN" attr "$UZRAM_DEV" uzram_stat | tr '\n' ' ')\"}"
    fi
    uzram_reset
}

SUITES=${UZRAM_VM_CHECKS:-starved devices memory}
zram_begin || exit 1
uzram_begin || exit 1
case " $SUITES " in *" starved "*) starved_suite ;; esac
case " $SUITES " in *" devices "*) devices_suite ;; esac
case " $SUITES " in *" memory "*) memory_suite ;; esac
echo "UZRAM-BENCH-DONE"
