# shellcheck shell=sh
# Checks (sourced by checks.sh): swap under pressure and churn: the device as swap.

# ---- swap ----------------------------------------------------------------------------------------
SWAP_DEV=
HOLD_PID=
# MemAvailable in MiB before any device existed (check.sh measures it once), so that kernel zram
# and uzram get the same swap workload; a check measures its own when it is not set.
SWAP_AVAIL_MIB=${SWAP_AVAIL_MIB:-}
# kernel zram's mem_used_total (bytes) once the swap check's program has exited, to hold
# uzram's to (issue 18: at most 2 MiB more).
ZRAM_SWAP_EXIT=
UZRAM_SWAP_EXIT=
# UZRAM_VM_SLOT_FREE=discard: uzram's devices run with --slot-free discard, and the checks say
# and measure that mode; otherwise the probe must be there (the guest's kernel has it).
SLOT_FREE_WANT=${UZRAM_VM_SLOT_FREE:-probe}

# uzram_stat_field DEV KEY: one of uzram_stat's figures
uzram_stat_field() { "$UZRAM_BIN" attr "$1" uzram_stat 2>/dev/null | awk -v k="$2" '$1 == k { print $2 }'; }
# uzram_slot_free DEV: "probe" or "discard", as the daemon says in uzram_stat
uzram_slot_free() {
    case $(uzram_stat_field "$1" slot_free_probe) in
    1) echo probe ;;
    *) echo discard ;;
    esac
}

# settled_mem_used DEV: mem_used_total once it and orig_data_size stop falling (swap's
# discards and uzram's reclaim of freed slots, at least once a second, land within seconds of
# a program's exit, not at once): sampled every half second until four samples (1.5 s) agree,
# at most 30 s. Prints "BYTES SECONDS".
settled_mem_used() {
    _t0=$(uptime_s) _prev=-1 _same=0 _u=0
    for _ in $(seq 1 60); do
        _s=$(dev_mm_stat "$1" | awk '{ print $1, $3 }')
        _u=${_s#* }
        if [ "$_s" = "$_prev" ]; then
            _same=$((_same + 1))
            [ $_same -ge 3 ] && break
        else
            _same=0
        fi
        _prev=$_s
        sleep 0.5
    done
    echo "$_u $(elapsed "$_t0")"
}

# slot_free_ok DEV NAME LOG: on uzram, whether the daemon's slot-free mode (set in MODE) is the
# one wanted; fails NAME when not. Run it in the check's own shell (not in $(...)), so that the
# failure counts.
slot_free_ok() {
    MODE=$(uzram_slot_free "$1")
    [ "$MODE" = "$SLOT_FREE_WANT" ] && return 0
    fail_log "$2" "$3" "slot-free mode $MODE, wanted $SLOT_FREE_WANT: $(grep 'slot-free' "$UZRAM_LOG" | tail -n 1)"
    return 1
}

# memcg_run LIMIT_MIB CMD...: CMD in a fresh memory cgroup (v2, else v1); 99 if there is none.
memcg_run() {
    local lim=$(($1 << 20)) cg procs rc
    shift
    if grep -qw memory /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null; then
        cg=/sys/fs/cgroup/uzram-vm-$$
        mkdir "$cg" && echo "$lim" >"$cg/memory.max" || return 99
    elif [ -d /sys/fs/cgroup/memory ]; then
        cg=/sys/fs/cgroup/memory/uzram-vm-$$
        mkdir "$cg" && echo "$lim" >"$cg/memory.limit_in_bytes" || return 99
    else
        return 99
    fi
    sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' memcg "$cg" "$@"
    rc=$?
    rmdir "$cg" 2>/dev/null
    return $rc
}

# check_swap DEV PREFIX: the device must hold 2x the guest's RAM (or 1 GiB on a host).
#  1. pressure: fill 2x MemAvailable with vmtool's pages (guest; on a host: 512 MiB in a 256 MiB
#     memory cgroup), verify all of it forward and backward: every page comes back from swap;
#  2. swapoff with data out: vmtool fills half of MemAvailable (host: 128 MiB), pushes it out (MADV_PAGEOUT),
#     swapoff pulls it back in, then vmtool verifies it;
#  3. memory comes back: device memory after swapoff is a small fraction of its peak.
check_swap() {
    local dev=$1 name=${2}swap log=$UZ_TMP/${2}swap.log t0 avail fill hold rc o0 i0 dout din peak
    local used_exit used_off orig_off swapped held line how t1 wfail
    if [ "$UZRAM_VM_MODE" = host ] && [ "${UZRAM_VM_HOST_SWAP:-0}" != 1 ]; then
        skip "$name" "not on a host unless UZRAM_VM_HOST_SWAP=1 (it would swapon here)"
        return
    fi
    note "$name: swap under pressure"
    t0=$(uptime_s)
    : >"$log"
    if ! mkswap "$dev" >>"$log" 2>&1; then
        fail_log "$name" "$log" "mkswap failed"
        return
    fi
    if ! swapon --discard=pages -p 32767 "$dev" >>"$log" 2>&1; then
        fail_log "$name" "$log" "swapon --discard=pages failed"
        return
    fi
    SWAP_DEV=$dev
    cat /proc/swaps >>"$log"
    sync
    echo 3 >/proc/sys/vm/drop_caches
    avail=${SWAP_AVAIL_MIB:-$(($(meminfo_kb MemAvailable) / 1024))}
    o0=$(vmstat_val pswpout) i0=$(vmstat_val pswpin)
    if [ "$UZRAM_VM_MODE" = host ]; then
        fill=512 how="512 MiB in a 256 MiB memory cgroup"
        memcg_run 256 "$TOOL" swapfill $fill "$SEED" 2 >>"$log" 2>&1
        rc=$?
        [ $rc = 99 ] && { fail_log "$name" "$log" "no memory cgroup to run in"; return; }
    else
        fill=$((avail * 2)) how="$((avail * 2)) MiB, 2x MemAvailable $avail MiB (before any device)"
        [ -n "$SWAP_AVAIL_MIB" ] || how="$((avail * 2)) MiB, 2x MemAvailable $avail MiB"
        "$TOOL" swapfill $fill "$SEED" 2 >>"$log" 2>&1
        rc=$?
    fi
    grep '^vmtool' "$log" | sed 's/^/VM: /'
    # what uzram's daemon said of the requests it failed, and of its memory
    case $dev in /dev/ublkb*) grep -E 'requests failed|cannot refill' "$UZRAM_LOG" | tail -n 4 | sed 's/^/VM: /' ;; esac
    dout=$(($(vmstat_val pswpout) - o0)) din=$(($(vmstat_val pswpin) - i0))
    peak=$(dev_stat_field "$dev" 5)
    wfail=$(dev_failed_writes "$dev") putoff=$(dev_writes_put_off "$dev")
    echo "pswpout +$dout pswpin +$din, mm_stat $(dev_mm_stat "$dev"), failed writes $wfail, put off $putoff" >>"$log"
    if [ $rc != 0 ]; then
        [ $rc -gt 128 ] && dmesg | tail -n 15 >>"$log"
        fail_log "$name" "$log" "vmtool swapfill $fill MiB exited $rc (1: data mismatch, >128: killed, OOM?)"
        return
    fi
    # at least a quarter of the pages went out, and an eighth came back in
    if [ $dout -lt $((fill * 64)) ] || [ $din -lt $((fill * 32)) ]; then
        fail_log "$name" "$log" "too little swapping to prove anything: pswpout +$dout pswpin +$din for $fill MiB"
        return
    fi
    # kernel zram fails no write here; uzram may fail a handful when its reserve runs dry
    # (ENOMEM, swap keeps the page), hundreds means swap-out is waiting on itself again
    case $dev in /dev/ublkb*)
        if [ "$wfail" -gt 16 ]; then
            fail_log "$name" "$log" "$wfail failed writes on uzram (kernel zram fails none here)"
            return
        fi ;;
    esac
    # what the device still holds once the program's freed slots have been dealt with: kernel
    # zram frees each as swap frees it; uzram as its probe reports it (or, discard only, whole
    # free clusters as swap discards them)
    line=$(settled_mem_used "$dev")
    used_exit=${line% *} exit_how="settled in ${line#* }s"
    case $dev in
    /dev/zram*)
        ZRAM_SWAP_EXIT=$used_exit
        # uzram's check ran first: its figure is held to this one now
        if [ -n "$UZRAM_SWAP_EXIT" ]; then
            if [ "$UZRAM_SWAP_EXIT" -gt $((used_exit + 2097152)) ]; then
                fail swap-exit "after the program exited uzram held mem_used $(mib "$UZRAM_SWAP_EXIT"), kernel zram $(mib "$used_exit"): more than 2 MiB above it"
            else
                pass swap-exit "after the program exited uzram held mem_used $(mib "$UZRAM_SWAP_EXIT"), kernel zram $(mib "$used_exit") (at most 2 MiB above it)"
            fi
        fi ;;
    /dev/ublkb*)
        slot_free_ok "$dev" "$name" "$log" || return
        mode=$MODE
        exit_how="$exit_how, slot-free $mode, $(uzram_stat_field "$dev" slot_free_freed) pages freed by the probe"
        echo "after exit: mem_used $used_exit ($exit_how), kernel zram's ${ZRAM_SWAP_EXIT:-unmeasured}; uzram_stat: $("$UZRAM_BIN" attr "$dev" uzram_stat | grep slot_free | tr '\n' ' ')" >>"$log"
        [ "$mode" = probe ] && UZRAM_SWAP_EXIT=$used_exit
        if [ "$mode" = probe ] && [ -n "$ZRAM_SWAP_EXIT" ] && [ "$used_exit" -gt $((ZRAM_SWAP_EXIT + 2097152)) ]; then
            fail_log "$name" "$log" "after the program exited uzram holds mem_used $(mib "$used_exit") ($exit_how), kernel zram $(mib "$ZRAM_SWAP_EXIT"): more than 2 MiB above it"
            return
        fi
        [ -n "$ZRAM_SWAP_EXIT" ] && exit_how="$exit_how; kernel zram's $(mib "$ZRAM_SWAP_EXIT")" ;;
    esac
    # 2. swapoff while a process has pages out
    hold=$((avail / 2))
    [ "$UZRAM_VM_MODE" = host ] && hold=128
    "$TOOL" swaphold $hold $((SEED + 1)) >"$log.hold" 2>&1 &
    HOLD_PID=$!
    line=
    for _ in $(seq 1 300); do
        line=$(grep 'held' "$log.hold")
        [ -n "$line" ] && break
        kill -0 $HOLD_PID 2>/dev/null || break
        sleep 1
    done
    swapped=$(grep '^/dev/' /proc/swaps | awk -v d="$dev" '$1 == d { print $4 }')
    if [ -z "$line" ]; then
        cat "$log.hold" >>"$log"
        fail_log "$name" "$log" "vmtool swaphold never got its pages out"
        return
    fi
    t1=$(uptime_s)
    if ! swapoff "$dev" >>"$log" 2>&1; then
        fail_log "$name" "$log" "swapoff failed with $swapped KiB in swap"
        return
    fi
    SWAP_DEV=
    kill -USR1 $HOLD_PID
    wait $HOLD_PID
    rc=$?
    HOLD_PID=
    cat "$log.hold" >>"$log"
    note "swapoff took $(elapsed "$t1")s"
    grep '^vmtool' "$log.hold" | sed 's/^/VM: /'
    if [ $rc != 0 ]; then
        fail_log "$name" "$log" "after swapoff, vmtool swaphold found bad pages (exit $rc)"
        return
    fi
    held=$(echo "$line" | sed 's/.*VmSwap \([0-9]*\) kB.*/\1/')
    # zram frees at once; uzram's daemon notices the swapoff within about a second, then frees
    # page by page: wait (up to 10 s) for one mm_stat that shows both given back
    for _ in $(seq 1 20); do
        line=$(dev_mm_stat "$dev")
        orig_off=$(echo "$line" | awk '{ print $1 }') used_off=$(echo "$line" | awk '{ print $3 }')
        [ "$orig_off" -le 1048576 ] && [ "$used_off" -le $((peak / 20 + 1048576)) ] && break
        sleep 0.5
    done
    echo "after swapoff: mm_stat $(dev_mm_stat "$dev")" >>"$log"
    if [ "$used_off" -gt $((peak / 20 + 1048576)) ] || [ "$orig_off" -gt 1048576 ]; then
        fail_log "$name" "$log" "memory not given back after swapoff: mem_used $(mib "$used_off") (peak $(mib "$peak")), orig $(mib "$orig_off")"
        return
    fi
    pass "$name" "filled $how: all pages verified twice, pswpout +$dout pswpin +$din, failed writes $wfail (swap retried them), writes put off ${putoff:-0}, peak mem_used $(mib "$peak"); after exit $(mib "$used_exit") ($exit_how); swapoff with $((held / 1024)) MiB out then verified; after swapoff mem_used $(mib "$used_off"), $(elapsed "$t0")s"
}

# ---- churn ---------------------------------------------------------------------------------------
# check_churn DEV PREFIX: programs that fill memory and are pushed out to swap (MADV_PAGEOUT),
# one a round for CHURN_ROUNDS rounds; in the next round each frees every other page (the slots
# freed sit in clusters still in use, which swap never discards), and in the one after it
# verifies what it kept and exits. At each round's end (once the frees have landed) the device
# must hold what swap says it holds: orig_data_size within 5 % of /proc/swaps' Used for the
# device, less the live programs' zero-filled pages (the kernel keeps those in its zeromap and
# never writes them). Kernel zram frees each slot as swap frees it; uzram must as well (its
# probe): with discards alone the freed half of each program would stay.
CHURN_ROUNDS=${CHURN_ROUNDS:-5}
check_churn() {
    local dev=$1 name=${2}churn log=$UZ_TMP/${2}churn.log t0 mib r pid old rc used zeros orig want
    local pids="" rounds="" bad="" line mode=kernel avail
    note "$name: programs swapping and exiting in turn"
    t0=$(uptime_s)
    : >"$log"
    if ! { mkswap "$dev" && swapon --discard=pages -p 32767 "$dev"; } >>"$log" 2>&1; then
        fail_log "$name" "$log" "mkswap or swapon failed"
        return
    fi
    SWAP_DEV=$dev
    case $dev in
    /dev/ublkb*)
        if ! slot_free_ok "$dev" "$name" "$log"; then
            swapoff "$dev"
            SWAP_DEV=
            return
        fi
        mode=$MODE ;;
    esac
    avail=${SWAP_AVAIL_MIB:-$(($(meminfo_kb MemAvailable) / 1024))}
    mib=$((avail / 5))
    for r in $(seq 1 "$CHURN_ROUNDS"); do
        "$TOOL" swaphold $mib $((SEED + 100 + r)) >"$log.$r" 2>&1 &
        pids="$pids $!"
        if ! held_or_gone "$log.$r" $! 150; then
            cat "$log.$r" >>"$log"
            bad="$bad; round $r: the program never got its pages out"
            break
        fi
        # the program of the round before frees every other page
        if [ $r -gt 1 ]; then
            kill -USR2 "$(echo $pids | awk '{ print $(NF - 1) }')"
            for _ in $(seq 1 120); do
                grep -q dropped "$log.$((r - 1))" && break
                sleep 0.5
            done
            grep -q dropped "$log.$((r - 1))" || { bad="$bad; round $r: the program of round $((r - 1)) never freed its pages"; break; }
        fi
        # the program from two rounds ago verifies what it kept and exits
        if [ $r -gt 2 ]; then
            old=$(echo $pids | cut -d' ' -f1) pids=$(echo $pids | cut -d' ' -f2-)
            kill -USR1 "$old"
            wait "$old"
            rc=$?
            cat "$log.$((r - 2))" >>"$log"
            [ $rc = 0 ] || { bad="$bad; round $r: the program of round $((r - 2)) found bad pages (exit $rc)"; break; }
        fi
        settled_mem_used "$dev" >/dev/null
        used=$(awk -v d="$dev" '$1 == d { print $4 * 1024 }' /proc/swaps)
        # the zero-filled pages of the programs alive: all of this round's, and those the one
        # of the round before kept
        zeros=$(($(sed -n 's/.*pages: zero \([0-9]*\) .*/\1/p' "$log.$r" | head -n 1) * 4096))
        [ $r -gt 1 ] && zeros=$((zeros + $(sed -n 's/.*dropped.*(zero \([0-9]*\)).*/\1/p' "$log.$((r - 1))" | head -n 1) * 4096))
        orig=$(dev_stat_field "$dev" 1)
        want=$((used - zeros))
        line="round $r: orig_data_size $(mib "$orig"), swap used $(mib "$used") less $(mib "$zeros") of zero pages = $(mib "$want")"
        echo "$line" >>"$log"
        note "$name: $line"
        rounds="$rounds $(awk -v o="$orig" -v w="$want" 'BEGIN { printf "%+.1f%%", w ? (o - w) * 100 / w : 0 }')"
        # discards alone cannot free a slot in a cluster still in use: that mode is measured,
        # not held to the bound
        if [ "$mode" != discard ] && { [ $((orig - want)) -gt $((want / 20)) ] || [ $((want - orig)) -gt $((want / 20)) ]; }; then
            bad="$bad; $line: more than 5 % apart"
        fi
    done
    # the programs left verify their pages and exit
    for pid in $pids; do
        kill -USR1 "$pid" 2>/dev/null
        wait "$pid" || bad="$bad; a program found bad pages at the end"
    done
    cat "$log".[0-9]* >>"$log" 2>/dev/null
    rm -f "$log".[0-9]*
    swapoff "$dev" >>"$log" 2>&1 || bad="$bad; swapoff failed"
    SWAP_DEV=
    if [ -n "$bad" ]; then
        fail_log "$name" "$log" "${bad#; }"
        return
    fi
    [ "$mode" = discard ] && mode="discard only, measured, not held to the 5 % bound"
    pass "$name" "$CHURN_ROUNDS rounds of $mib MiB programs, each freeing half its pages a round later and exiting the round after (slot-free $mode), all pages verified: orig_data_size against swap's used (less zero pages) at each round's end:$rounds; $(elapsed "$t0")s"
}

# check_stormstart: the start of a swap storm on a fresh device. For each factor F of
# UZRAM_VM_STORM_FACTORS (tenths of MemAvailable; default "13 20"), UZRAM_VM_STORM_RUNS times
# (default 3): a new uzram device (2x RAM) made swap, then at once a program filling F/10 of
# MemAvailable, verified once. No swap write may fail: none in the device's io_stat and no
# "Write-error on swap-device" in the kernel's log. Each run's figures are printed (failed
# writes, writes put off while the pool's reserve was dry, the slowest arena the memory thread
# mapped); while the memory thread stalls, its daemon logs the thread's kernel stack.
check_stormstart() {
    local name=stormstart log=$UZ_TMP/stormstart.log f r fill rc l0 e wfail putoff slow
    local swapsize bad= runs= avail
    note "$name: a fresh device, then at once a fill of MemAvailable x (${UZRAM_VM_STORM_FACTORS:-13 20})/10, ${UZRAM_VM_STORM_RUNS:-3} run(s) each"
    swapsize=$((($(meminfo_kb MemTotal) / 1024 * 2 + 1023) / 1024 * 1024))M
    : >"$log"
    for f in ${UZRAM_VM_STORM_FACTORS:-13 20}; do
        for r in $(seq 1 "${UZRAM_VM_STORM_RUNS:-3}"); do
            uzram_setup lz4 $swapsize || return
            swap_begin "$UZRAM_DEV" --discard=pages || return
            fill=$((avail * f / 10))
            # the kernel's log from here on, by time stamp (a sysrq dump may make it wrap,
            # and counts or line numbers before and after would then miss this run's lines)
            l0=$(dmesg | tail -n 1 | sed -n 's/^\[ *\([0-9.]*\)\].*/\1/p')
            "$TOOL" swapfill $fill $((SEED + r)) 1 >>"$log" 2>&1
            rc=$?
            dmesg | awk -v t="${l0:-0}" 'match($0, /^\[ *[0-9.]+\]/) {
                s = substr($0, 2, RLENGTH - 2); gsub(/ /, "", s); if (s + 0 > t + 0) print }' >"$log.kmsg"
            e=$(grep -c 'Write-error on swap-device' "$log.kmsg")
            grep 'in the kernel:' "$log.kmsg" >>"$log"
            wfail=$(dev_failed_writes "$UZRAM_DEV") putoff=$(dev_writes_put_off "$UZRAM_DEV")
            slow=$(grep -o 'slowest [0-9]* ms' "$log.kmsg" | tail -n 1)
            swapoff "$UZRAM_DEV" >>"$log" 2>&1
            SWAP_DEV=
            echo "x$f/10 run $r: $fill MiB, vmtool exit $rc, failed writes $wfail (kernel log $e), put off $putoff, ${slow:-no progress line}" | tee -a "$log" | sed 's/^/VM: stormstart: /'
            runs="$runs; x$f/10 #$r: failed $wfail, put off $putoff"
            if [ $rc != 0 ]; then
                [ $rc -gt 128 ] && dmesg | tail -n 15 >>"$log"
                bad="$bad; x$f/10 run $r: vmtool swapfill $fill MiB exited $rc (1: data mismatch, >128: killed)"
            fi
            [ "$wfail" = 0 ] && [ $e = 0 ] || bad="$bad; x$f/10 run $r: $wfail failed writes ($e in the kernel's log)"
            uzram_reset
        done
    done
    if [ -n "$bad" ]; then
        fail_log "$name" "$log" "${bad#; }"
        return
    fi
    pass "$name" "every page verified and no swap write failed: ${runs#; }"
}
