# The memory-starved build (tests/vm/run bench, suite "starved"): one workload standing in for a
# build's analysis step, run with each kind of swap users choose between, on a throttled virtio
# disk (/dev/vda, tests/vm/run sets the limits) standing in for the SSD.
#
# The workload: vmtool swapfill, about 2.5x the MemAvailable measured before any device exists,
# of realistic pages (the corpus mix: several languages' heaps, same-filled and incompressible
# pages), walked and verified PASSES times. Per configuration: time, bytes read from and written
# to the disk (/sys/block/vda/stat), the exit status (0 completed and verified, 1 bad pages, 124
# timed out, >128 killed: 137 is the OOM killer), swap write errors in the kernel log, peak swap
# use, and uzram's policy_stat and bd_stat. One "BENCH: {json}" line each, kind "starved".
#
# Sourced by bench.sh (lib.sh and checks.sh are loaded).

STARVED_X10=${UZRAM_BENCH_STARVED_X10:-25}      # workload, tenths of MemAvailable
STARVED_PASSES=${UZRAM_BENCH_STARVED_PASSES:-2}
# The family of shapes, each "WALK,MIX,X10,PC": WALK swapfill (fill, then passes forward and
# backward), cyclic (every pass forward: the least recently used page is read next), hotcold
# (80 % of reads in a hot fifth), rewrite (cyclic, and every other page's tail rewritten each
# pass) or phases (three cyclic programs, each started once the one before has filled its
# memory and walked half its passes and the one before that has ended, each exiting when done:
# started by the clock, a faster swap let each program end before the next needed its memory,
# and the shape measured speed twice); MIX the
# page mix (vmtool's VMTOOL_MIX: mixed, text, heap, noisy); X10 the workload in tenths of
# MemAvailable ("t" before it: of MemTotal); PC vm.page-cluster. One guest run goes through
# every shape with every configuration. The default is the one starved build of before.
STARVED_FAMILY=${UZRAM_BENCH_STARVED_FAMILY:-swapfill,mixed,$STARVED_X10,0}
STARVED_TIMEOUT=${UZRAM_BENCH_STARVED_TIMEOUT:-1800}
# uzram-lz4-shareN: uzram with pool_share=N; uzram-lz4-nospill: uzram with spill=0;
# uzram-lz4-noreuse: uzram with reuse=0; uzram-lz4-floorN: uzram with share_floor=N;
# uzram-lz4-nopromote: uzram with promote=0; uzram-lz4-groupsN: uzram with recompress_after=Ns
# (cold groups made from pages idle N s, the policy's groups on as by default);
# uzram-lz4-nogroupsN: the same with groups=off (idle pages recompressed page by page)
# zswap comes last: in Debian's 6.12.117 under TCG it has oopsed the guest's kernel under
# zswap_store (in ZSTD_CCtx_reset with zstd; a double fault with lz4), which ends the run.
STARVED_CONFIGS=${UZRAM_BENCH_STARVED_CONFIGS:-disk zram-lz4 uzram-lz4 zram-zstd uzram-lz4-pc3 uzram-lz4-nospill zswap-lz4 zswap-zstd}
STARVED_DISK=/dev/vda
# UZRAM_BENCH_STARVED_PERF=1: profile each configuration with the host's perf (all CPUs, sampled
# by the clock), reported on the console by command, binary and symbol: where a configuration's
# CPU time goes, which the guest's user/system totals do not say; =g: with call chains, each
# busy command's symbols also counted with what they called (the kernel's paths: a swap-in,
# reclaim, a ublk round trip)
STARVED_PERF=${UZRAM_BENCH_STARVED_PERF:-}

# sectors read and written by the disk so far
disk_sectors() { awk '{ print $3, $7 }' /sys/block/vda/stat; }

swap_errors() { dmesg | grep -c 'Write-error on swap-device'; }

oom_kills() { dmesg | grep -c 'Killed process'; }

# pages swapped in and out, and the guest's context switches, so far: the time a configuration
# takes is the number of swap-ins times what each costs
swap_counts() {
    awk '$1 == "pswpin" || $1 == "pswpout" { printf "%s ", $2 }' /proc/vmstat
    awk '$1 == "ctxt" { print $2 }' /proc/stat
}

# cpu_ticks: the guest's CPU time so far, all CPUs, in clock ticks (USER_HZ): user (with nice),
# system (with irq and softirq), idle, iowait
cpu_ticks() { awk '$1 == "cpu" { print $2 + $3, $4 + $7 + $8, $5, $6 }' /proc/stat; }

# daemon_switches: each uzram process's threads, as "name=voluntary+involuntary context
# switches/user+system CPU seconds" (a thread name once per process, its threads summed): where
# its time went
daemon_switches() {
    local p t c
    for p in $(grep -lx uzram /proc/[0-9]*/comm 2>/dev/null | cut -d/ -f3); do
        printf '%s:' "$p"
        for t in /proc/"$p"/task/*; do
            # comm, then the switches, then utime and stime in clock ticks (stat's fields 14 and 15
            # counted after the parenthesised name; USER_HZ, 100 on x86); a thread gone
            # meanwhile is left out
            c=$(cat "$t/comm" 2>/dev/null) || continue
            printf '%s %s %s\n' "$(echo "$c" | tr ' ' _)" \
                "$(awk '/^voluntary_ctxt_switches/ { v = $2 } /^nonvoluntary_ctxt_switches/ { n = $2 } END { print v "+" n }' "$t/status" 2>/dev/null)" \
                "$(sed 's/.*) //' "$t/stat" 2>/dev/null | awk '{ print $12, $13 }')"
        done | awk '{ split($2, a, "+"); v[$1] += a[1]; n[$1] += a[2]; u[$1] += $3; s[$1] += $4 }
            END { for (k in v) printf " %s=%d+%d/%.1f+%.1fs", k, v[k], n[k], u[k] / 100, s[k] / 100 }'
        echo
    done
}

# perf_start LABEL / perf_stop LABEL: the opt-in profile (STARVED_PERF) around one workload
perf_start() {
    [ -n "$STARVED_PERF" ] || return 0
    local r=$UZRAM_VM_ROOT
    [ -x "$r/usr/bin/perf" ] || { note "starved: the host has no perf"; return 0; }
    echo 0 >/proc/sys/kernel/kptr_restrict
    echo -1 >/proc/sys/kernel/perf_event_paranoid
    "$r/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" --library-path "$r/lib/x86_64-linux-gnu:$r/usr/lib/x86_64-linux-gnu" \
        "$r/usr/bin/perf" record -a -F "${PERF_HZ:-97}" -N $([ "$STARVED_PERF" = g ] && echo -g) -o "$UZ_TMP/perf-$1.data" >"$UZ_TMP/perf-$1.log" 2>&1 &
    PERF_PID=$!
}
# (perf_end stops the profiler, before the caller reads its counters; perf_report reads the
# profile back, after them: it takes CPU time of its own)
perf_stop() { perf_end && perf_report "$1"; }
perf_end() {
    [ -n "${PERF_PID:-}" ] || return 1
    kill -INT "$PERF_PID"
    wait "$PERF_PID"
    PERF_PID=
}
perf_report() {
    [ -f "$UZ_TMP/perf-$1.data" ] || return 0
    local r=$UZRAM_VM_ROOT s
    for s in comm comm,dso comm,dso,sym; do
        "$r/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" --library-path "$r/lib/x86_64-linux-gnu:$r/usr/lib/x86_64-linux-gnu" \
            "$r/usr/bin/perf" report -i "$UZ_TMP/perf-$1.data" --stdio --no-children --sort "$s" -g none \
            --percent-limit 0.7 2>&1 | grep -v '^#' | grep -v '^$' | head -60 |
            while read -r l; do note "perf: $1: $s: $l"; done
    done
    [ "$STARVED_PERF" = g ] && for s in vmtool fio uzram kswapd0; do
        "$r/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" --library-path "$r/lib/x86_64-linux-gnu:$r/usr/lib/x86_64-linux-gnu" \
            "$r/usr/bin/perf" report -i "$UZ_TMP/perf-$1.data" --stdio --children --comm "$s" --sort sym \
            -g none --percent-limit 1.5 2>&1 | grep -v '^#' | grep -v '^$' | head -45 |
            while read -r l; do note "perf: $1: $s with callees: $l"; done
    done
    rm -f "$UZ_TMP/perf-$1.data"
}

# zram_after: kernel zram's figures once the workload is done, for its BENCH line (mm_stat's
# mem_used_max is the most RAM its pool took)
zram_after() { printf ',"mm_stat":"%s"' "$(tr -s ' ' <$ZRAM/mm_stat | sed 's/^ //')"; }

# starved_trace LABEL T0: every 30 s of a uzram configuration, the policy's counters that say
# where its disk bytes come from and what it reads back, with bd_stat, and the program's last
# line: the course of a run, where the BENCH line has only its end
starved_trace() {
    [ -n "${UZRAM_DEV:-}" ] && [ -b "$UZRAM_DEV" ] || return 0
    local ps
    ps=$("$UZRAM_BIN" attr "$UZRAM_DEV" policy_stat 2>/dev/null | tr '\n' ' ' |
        awk '{ for (i = 1; i < NF; i += 2) if ($i ~ /^(host_writeback_pages|evicted_pages|spill_pages|early_reads|cold_age_secs|promoted_pages|promote_age_secs|promoted_first_pages|promote_hits|promote_misses|reuse_pages)$/) printf "%s %s ", $i, $(i + 1) }')
    note "starved: $1: at $(elapsed "$2")s: ${ps}bd_stat $("$UZRAM_BIN" attr "$UZRAM_DEV" bd_stat 2>/dev/null | tr -s ' ' | sed 's/^ //'); pool $(dev_mm_stat "$UZRAM_DEV" 2>/dev/null | awk '{ print $3 }') B; $(tail -c 200 "$UZ_TMP/starved-$1.log" | tail -1)"
}

# starved_run LABEL [AFTER]: the workload on whatever swap is on now; one BENCH line, with what
# the command AFTER prints once the workload is done (more JSON fields, each after a comma)
starved_run() {
    local label=$1 after=${2:-} extra= t0 r0 w0 e0 k0 rc peak=0 used p secs si so cs cpu0 cpu
    sync
    echo 3 >/proc/sys/vm/drop_caches
    set -- $(disk_sectors)
    r0=$1 w0=$2
    set -- $(swap_counts)
    si=$1 so=$2 cs=$3
    e0=$(swap_errors)
    k0=$(oom_kills)
    cpu0=$(cpu_ticks)
    note "starved: $STARVED_SHAPE: $label: $STARVED_MB MiB x $STARVED_PASSES passes (timeout ${STARVED_TIMEOUT}s)"
    t0=$(uptime_s)
    case $STARVED_WALK in
    swapfill) set -- swapfill "$STARVED_MB" "$SEED" "$STARVED_PASSES" ;;
    phases) set -- phases "$STARVED_MB" "$SEED" "$STARVED_PASSES" 3 "p$((STARVED_PASSES / 2))" ;;
    *) set -- walk "$STARVED_MB" "$SEED" "$STARVED_PASSES" "$STARVED_WALK" ;;
    esac
    perf_start "$label"
    VMTOOL_MIX=$STARVED_MIX timeout "$STARVED_TIMEOUT" "$TOOL" "$@" >"$UZ_TMP/starved-$label.log" 2>&1 &
    p=$!
    local n=0
    while kill -0 $p 2>/dev/null; do
        used=$(awk 'NR > 1 { s += $4 } END { print s + 0 }' /proc/swaps)
        [ "$used" -gt "$peak" ] && peak=$used
        n=$((n + 1))
        [ $((n % 15)) = 0 ] && starved_trace "$label" "$t0"
        sleep 2
    done
    wait $p
    rc=$?
    secs=$(elapsed "$t0")
    perf_end
    [ -n "$after" ] && extra=$($after)
    # where the guest's CPUs went meanwhile, in seconds: user, system, idle, iowait
    cpu=$(echo "$cpu0 $(cpu_ticks)" | awk '{ printf "%.1f %.1f %.1f %.1f", ($5 - $1) / 100, ($6 - $2) / 100, ($7 - $3) / 100, ($8 - $4) / 100 }')
    set -- $(swap_counts)
    si=$(($1 - si)) so=$(($2 - so)) cs=$(($3 - cs))
    set -- $(disk_sectors)
    note "starved: $label: exit $rc in ${secs}s, disk read $(mib $((($1 - r0) * 512))), written $(mib $((($2 - w0) * 512))), $si pages swapped in, $so out, $cs context switches, CPU user/system/idle/iowait $cpu s; $(tail -1 "$UZ_TMP/starved-$label.log")"
    if [ "$rc" != 0 ]; then
        # why: bad pages the program named, or the kernel killing it
        grep -m 5 -e MISMATCH -e 'FAILED' "$UZ_TMP/starved-$label.log" | while read -r l; do note "starved: $label: $l"; done
        [ "$(oom_kills)" != "$k0" ] && note "starved: $label: $(($(oom_kills) - k0)) process(es) killed: $(dmesg | grep -e 'Killed process' | tail -n $(($(oom_kills) - k0)) | tr '\n' ' ')"
    fi
    emit "{\"kind\":\"starved\",\"shape\":\"$STARVED_SHAPE\",\"label\":\"$label\",\"workload_mb\":$STARVED_MB,\"passes\":$STARVED_PASSES,\"mem_total_kb\":$(meminfo_kb MemTotal),\"page_cluster\":$(cat /proc/sys/vm/page-cluster),\"seconds\":$secs,\"exit\":$rc,\"disk_read_bytes\":$((($1 - r0) * 512)),\"disk_written_bytes\":$((($2 - w0) * 512)),\"swap_write_errors\":$(($(swap_errors) - e0)),\"peak_swap_kb\":$peak,\"swap_ins\":$si,\"swap_outs\":$so,\"context_switches\":$cs,\"cpu_user_system_idle_iowait_s\":\"$cpu\"$extra}"
    perf_report "$label"
}

# disk swap at priority PRIO (below any compressed swap)
# (a uzram configuration's daemon may still be exiting, holding the disk (O_EXCL) after its
# device is gone: tried for up to 20 s)
disk_swap_on() {
    local _
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        mkswap "$STARVED_DISK" >/dev/null 2>&1 && swapon -p "$1" "$STARVED_DISK" && return 0
        sleep 2
    done
    return 1
}
disk_swap_off() { swapoff "$STARVED_DISK" 2>/dev/null; }

starved_disk() {
    disk_swap_on 10 || { note "starved: swapon $STARVED_DISK failed"; return; }
    starved_run disk
    disk_swap_off
}

# zram (disksize 1.5x RAM) at priority 100 in front of the disk swap at 10
starved_zram() { # ALGO
    local algo=$1 ram
    zram_has_algo "$algo" || { note "starved: kernel zram has no $algo"; return; }
    ram=$(($(meminfo_kb MemTotal) / 1024))
    zram_setup "$algo" $((ram * 3 / 2))M || return
    mkswap /dev/zram0 >/dev/null 2>&1 && swapon -p 100 /dev/zram0 || { zram_reset; return; }
    disk_swap_on 10 || { swapoff /dev/zram0; zram_reset; return; }
    starved_run "zram-$algo" zram_after
    disk_swap_off
    swapoff /dev/zram0
    zram_reset
}

# zswap (zsmalloc, max_pool_percent=20) in front of the disk swap
starved_zswap() { # ALGO
    local algo=$1 z=/sys/module/zswap/parameters stats=
    [ -d $z ] || { note "starved: this kernel has no zswap"; return; }
    echo "$algo" >$z/compressor 2>/dev/null || { note "starved: zswap refuses compressor $algo"; return; }
    echo zsmalloc >$z/zpool 2>/dev/null
    echo 20 >$z/max_pool_percent
    echo 1 >$z/enabled
    disk_swap_on 10 || { echo 0 >$z/enabled; return; }
    mountpoint -q /sys/kernel/debug || mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
    starved_run "zswap-$algo"
    if [ -d /sys/kernel/debug/zswap ]; then
        stats=$(for f in written_back_pages reject_reclaim_fail pool_limit_hit stored_pages; do
            [ -r /sys/kernel/debug/zswap/$f ] && printf '%s=%s ' $f "$(cat /sys/kernel/debug/zswap/$f)"
        done)
        note "starved: zswap-$algo: $stats"
    fi
    disk_swap_off
    echo 0 >$z/enabled
}

# uzram lz4 with zstd recompression, the disk as backing device (--force: the disk swap
# configurations left a swap signature on it), no disk swap; the default
# policy, or POLICY's settings on top of it. Its size is the swap zram + disk offers (1.5x
# RAM and the disk): the same room, and the kernel finds swap half full, and starts freeing
# uzram's slots on swap-in (vm_swap_full), where it would for the disk swap (zram, a synchronous
# device, has its slot freed on every swap-in).
starved_uzram() { # LABEL [POLICY]
    local label=$1 policy=${2:-} size dev ps bd ms
    size=$(($(meminfo_kb MemTotal) / 1024 * 3 / 2 + $(cat /sys/block/vda/size) / 2048))
    uzram_reset
    # The last configuration's daemon may still be exiting, holding the disk (O_EXCL) after
    # its device is gone: wait for it, up to 20 s.
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        dev=$(UZRAM_PROGRESS_SECS=10 "$UZRAM_BIN" --find --size ${size}M --algorithm lz4 \
            --recomp-algorithm zstd --backing-dev "$STARVED_DISK" --force ${policy:+--policy "$policy"} \
            --log "$UZRAM_LOG" 2>"$UZ_TMP/starved-$label.err")
        grep -q 'is in use' "$UZ_TMP/starved-$label.err" || break
        sleep 2
    done
    [ -b "$dev" ] || { note "starved: no uzram device: $(cat "$UZ_TMP/starved-$label.err")"; return; }
    UZRAM_DEV=$dev
    mkswap "$dev" >/dev/null 2>&1 && swapon --discard=pages -p 100 "$dev" || { uzram_reset; return; }
    SWAP_DEV=$dev
    starved_run "$label"
    ps=$("$UZRAM_BIN" attr "$dev" policy_stat | tr '\n' ' ')
    bd=$("$UZRAM_BIN" attr "$dev" bd_stat | tr -s ' ' | sed 's/^ //')
    ms=$(dev_mm_stat "$dev" | tr -s ' ' | sed 's/^ //')
    note "starved: $label: policy_stat $ps"
    daemon_switches | while read -r l; do note "starved: $label: context switches of uzram $l"; done
    note "starved: $label: bd_stat $bd; mm_stat $ms; io_stat $("$UZRAM_BIN" attr "$dev" io_stat)"
    emit "{\"kind\":\"starved-uzram\",\"shape\":\"$STARVED_SHAPE\",\"label\":\"$label\",\"policy_stat\":\"$ps\",\"bd_stat\":\"$bd\",\"mm_stat\":\"$ms\"}"
    swapoff "$dev"
    SWAP_DEV=
    uzram_reset
}

starved_suite() {
    local c avail total shape x10 pc
    [ -b "$STARVED_DISK" ] || { note "starved: no $STARVED_DISK (tests/vm/run attaches one)"; return; }
    avail=$(($(meminfo_kb MemAvailable) / 1024))
    total=$(($(meminfo_kb MemTotal) / 1024))
    note "starved: MemAvailable $avail MiB before any device, MemTotal $total MiB; shapes: $STARVED_FAMILY; configurations: $STARVED_CONFIGS"
    for shape in $STARVED_FAMILY; do
        # shellcheck disable=SC2046
        set -- $(echo "$shape" | tr , ' ')
        STARVED_WALK=$1 STARVED_MIX=$2 x10=$3 pc=$4
        case $x10 in
        t*) STARVED_MB=$((total * ${x10#t} / 10)) ;;
        *) STARVED_MB=$((avail * x10 / 10)) ;;
        esac
        STARVED_SHAPE=$shape
        for c in $STARVED_CONFIGS; do
            starved_config "$c" "$pc"
        done
    done
    echo 3 >/proc/sys/vm/page-cluster
}

# starved_config CONFIG PC: one configuration on the current shape, with vm.page-cluster PC
starved_config() {
    local c=$1
    echo "$2" >/proc/sys/vm/page-cluster
    case $c in
    disk) starved_disk ;;
    zram-*) starved_zram "${c#zram-}" ;;
    zswap-*) starved_zswap "${c#zswap-}" ;;
    uzram-lz4) starved_uzram uzram-lz4 ;;
    uzram-lz4-pc3) echo 3 >/proc/sys/vm/page-cluster && starved_uzram uzram-lz4-pc3 ;;
    uzram-lz4-share*) starved_uzram "$c" "pool_share=${c#uzram-lz4-share}" ;;
    uzram-lz4-nospill) starved_uzram "$c" "spill=0" ;;
    uzram-lz4-noreuse) starved_uzram "$c" "reuse=0" ;;
    uzram-lz4-nopromote) starved_uzram "$c" "promote=0" ;;
    uzram-lz4-floor*) starved_uzram "$c" "share_floor=${c#uzram-lz4-floor}" ;;
    uzram-lz4-groups*) starved_uzram "$c" "recompress_after=${c#uzram-lz4-groups}s" ;;
    uzram-lz4-nogroups*) starved_uzram "$c" "recompress_after=${c#uzram-lz4-nogroups}s groups=off" ;;
    *) note "starved: unknown configuration $c" ;;
    esac
}
