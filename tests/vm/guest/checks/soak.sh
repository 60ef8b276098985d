# The soak: a while of mixed pressure in one guest, faults at random moments, every page verified.

# check_soak: UZRAM_VM_SOAK_MIN minutes (default 5) of, all at once:
# - a uzram swap device (2x RAM, lz4, recompression with zstd, writeback to a file on ext4 on the
#   scratch disk, the policy's idle ages short) started from a shell as the README does, and
#   programs of random sizes (a tenth to 1.2x MemAvailable, two at a time) filling memory
#   through it, each verifying its pages once and exiting, and one holding a quarter of
#   MemAvailable in swap all along, verified at the end;
# - ext4 on a second uzram device and ext4 on kernel zram (the reference), fio verify on each;
# - one fault every UZRAM_VM_SOAK_GAP seconds or so (default 20, at random from half to 1.5x
#   that), in turn: SIGKILL of the swap device's worker, `uzram upgrade`, a discard storm (fstrim
#   of the uzram file system), a writeback storm (every page marked idle and written back),
#   mem_limit cut to 3/4 of what the pool holds (8 MiB at least) for a while, and the freezer
#   test of suspend with uzram's sleep hook.
# Passes if every page read back is right, no swap or file-system write failed on either device,
# no process was killed and every fault ended; names each fault with its time.
check_soak() {
    local name=soak log=$UZ_TMP/soak.log bin=$UZ_TMP/uzram-installed min=${UZRAM_VM_SOAK_MIN:-5}
    local gap=${UZRAM_VM_SOAK_GAP:-20} age=${UZRAM_VM_SOAK_AGE:-20} stop=$UZ_TMP/soak.stop
    local swapdev fsdev cg t0 end pids= p rc bad= k=0 kinds faults= kind l0 ts0 swapsize hpid
    note "$name: $min min of programs swapping through uzram, fio verify on uzram and kernel zram, a fault every ~$gap s"
    : >"$log"
    rm -f "$stop" "$log".*
    uzram_reset
    mkdir -p /mnt/soakwb /mnt/soakfs /mnt/soakref
    if ! { mke2fs -q -t ext4 -E lazy_itable_init=0,lazy_journal_init=0 /dev/vda && mount /dev/vda /mnt/soakwb; } >>"$log" 2>&1; then
        fail_log "$name" "$log" "no file system for the backing file on /dev/vda"
        return
    fi
    cp "$UZRAM_BIN" "$bin" || { fail_log "$name" "$log" "cannot copy $UZRAM_BIN"; umount /mnt/soakwb; return; }
    # the slot-free probe's helper, which a daemon looks for beside its binary
    [ -x "${UZRAM_BIN%/*}/uzram-probe" ] && cp "${UZRAM_BIN%/*}/uzram-probe" "${bin%/*}/uzram-probe"
    swapsize=$((($(meminfo_kb MemTotal) / 1024 * 2 + 1023) / 1024 * 1024))M
    l0=$(wc -l 2>/dev/null <"$UZRAM_LOG" || echo 0)
    swapdev=$(UZRAM_PROGRESS_SECS=5 UZRAM_STALL_SYSRQ=1 "$bin" --find --size $swapsize --algorithm lz4 \
        --recomp-algorithm zstd --backing-dev /mnt/soakwb/backing.img \
        --policy "recompress_after=${age}s writeback_after=$((age * 2))s" --log "$UZRAM_LOG" 2>>"$log")
    fsdev=$(UZRAM_PROGRESS_SECS=5 "$bin" --find --size 256M --algorithm lz4 --log "$UZRAM_LOG" 2>>"$log")
    if [ ! -b "$swapdev" ] || [ ! -b "$fsdev" ]; then
        fail_log "$name" "$log" "uzram --find failed: '$swapdev' '$fsdev'"
        soak_cleanup "$swapdev" "$fsdev"
        return
    fi
    UZRAM_DEV=$fsdev
    if ! { zram_begin && zram_setup lz4 256M && mke2fs -q -t ext4 "$fsdev" && mount -o discard "$fsdev" /mnt/soakfs &&
        mke2fs -q -t ext4 /dev/zram0 && mount /dev/zram0 /mnt/soakref; } >>"$log" 2>&1; then
        fail_log "$name" "$log" "no ext4 on $fsdev and /dev/zram0"
        soak_cleanup "$swapdev" "$fsdev"
        return
    fi
    swap_begin "$swapdev" --discard=pages || { soak_cleanup "$swapdev" "$fsdev"; return; }
    cg=$(workload_cgroup)
    # the kernel's log from here on, by time stamp (counts before and after would miss lines
    # the ring dropped meanwhile)
    ts0=$(dmesg | tail -n 1 | sed -n 's/^\[ *\([0-9.]*\)\].*/\1/p')
    # a program that holds a quarter of MemAvailable in swap all along (the others come and go),
    # verified at the end: what the faults find there
    in_cgroup "${cg:-/sys/fs/cgroup}" "$TOOL" swaphold $((avail / 4)) $((SEED + 999)) >"$log.hold" 2>&1 &
    hpid=$!
    if ! held_or_gone "$log.hold" $hpid 300; then
        cat "$log.hold" >>"$log"
        kill -KILL $hpid 2>/dev/null
        fail_log "$name" "$log" "the holding program never got its pages out"
        soak_cleanup "$swapdev" "$fsdev"
        return
    fi
    t0=$(uptime_s)
    end=$(awk -v t="$t0" -v m="$min" 'BEGIN { printf "%d", t + m * 60 }')
    for p in fs ref; do
        soak_fio $p &
        pids="$pids $!"
    done
    soak_programs big 6 12 &
    pids="$pids $!"
    soak_programs small 1 3 &
    pids="$pids $!"
    soak_rss &
    pids="$pids $!"
    kinds="kill upgrade discard writeback memlimit freeze"
    while awk -v e="$end" -v t="$(uptime_s)" 'BEGIN { exit !(t < e) }'; do
        sleep $((gap / 2 + $(below $((gap + 1)))))
        k=$((k + 1))
        kind=$(echo $kinds | cut -d' ' -f$(((k - 1) % 6 + 1)))
        soak_fault "$kind" "$k" || bad="$bad; fault $k ($kind) did not end: $(tail -n 1 "$log.faults")"
        [ -n "$bad" ] && break
    done
    touch "$stop"
    for p in $pids; do
        wait "$p"
    done
    kill -USR1 $hpid
    wait $hpid
    rc=$?
    cat "$log.hold" >>"$log"
    [ $rc = 0 ] || echo "the holding program exited $rc (1: bad pages, >128: killed)" >>"$log.bad"
    [ $rc = 0 ] && echo $((avail / 4 * 256)) >>"$log.verified"
    [ -s "$log.bad" ] && bad="$bad; $(tr '\n' ';' <"$log.bad")"
    soak_summary
    soak_cleanup "$swapdev" "$fsdev"
    if [ -n "$bad" ]; then
        fail_log "$name" "$log" "${bad#; }"
        return
    fi
    pass "$name" "$(cat "$log.summary")"
}

# below N: a random number in 0..N-1 (the guest's shell may have no $RANDOM).
below() { echo $(($(od -An -N2 -tu2 /dev/urandom) % $1)); }

# soak_programs TAG LO HI (for check_soak): until the stop file, one program at a time filling
# LO..HI tenths of MemAvailable (as read now) through swap, verified once; counts its pages.
soak_programs() {
    local tag=$1 lo=$2 hi=$3 n=0 mib rc
    while [ ! -e "$stop" ]; do
        n=$((n + 1))
        mib=$(($(meminfo_kb MemAvailable) / 1024 * (lo + $(below $((hi - lo + 1))))) / 10))
        [ $mib -lt 16 ] && mib=16
        # (in_cgroup execs: in the background, or it would replace this loop)
        in_cgroup "${cg:-/sys/fs/cgroup}" "$TOOL" swapfill $mib $((SEED + n)) 1 >"$log.$tag" 2>&1 &
        wait $!
        rc=$?
        cat "$log.$tag" >>"$log"
        if [ $rc != 0 ]; then
            echo "program $tag #$n ($mib MiB) exited $rc (1: bad pages, >128: killed)" | tee -a "$log.bad" >>"$log"
            return 1
        fi
        echo $((mib * 256)) >>"$log.verified"
    done
}

# soak_fio fs|ref (for check_soak): until the stop file, rounds of fio verify (4k random writes
# and reads, 2 jobs) in /mnt/soakfs (uzram) or /mnt/soakref (kernel zram), files removed after.
soak_fio() {
    local d=/mnt/soak$1 n=0 rc
    while [ ! -e "$stop" ]; do
        n=$((n + 1))
        fio --name=soak$1 --directory=$d --ioengine=libaio --direct=1 --iodepth=8 --numjobs=2 \
            --size=48M --rw=randwrite --bs=4k --verify=crc32c --verify_fatal=1 \
            --buffer_compress_percentage=50 --randseed=$n >"$log.fio$1" 2>&1
        rc=$?
        if [ $rc != 0 ]; then
            cat "$log.fio$1" >>"$log"
            echo "fio round $n on $d exited $rc (I/O errors or verify mismatches)" | tee -a "$log.bad" >>"$log"
            return 1
        fi
        rm -f $d/soak$1.*
        echo $((48 * 2 * 256)) >>"$log.verified"
    done
}

# soak_rss (for check_soak): the daemons' RSS all in (every uzram process), its peak, every 2 s.
soak_rss() {
    local kb peak=0
    while [ ! -e "$stop" ]; do
        kb=$(cat /proc/[0-9]*/status 2>/dev/null | awk '/^Name:/ { u = ($2 ~ /^uzram/) } u && /^VmRSS:/ { s += $2 } END { print s + 0 }')
        [ "$kb" -gt $peak ] && peak=$kb && echo $peak >"$log.rss"
        sleep 2
    done
}

# soak_fault KIND N (for check_soak): one fault, its time in $log.faults; false if it did not
# end (the device not served again within 60 s, a command that failed).
soak_fault() {
    local kind=$1 n=$2 t=$(uptime_s) pid r0 out rc=0 used i
    case $kind in
    kill)
        pid=$("$bin" --raw --noheadings -o PID "$swapdev" 2>>"$log")
        # the supervisor's line once a successor serves
        r0=$(grep -c 'ms after the last one ended' "$UZRAM_LOG")
        kill -KILL "$pid"
        rc=1
        for i in $(seq 1 600); do
            [ "$(grep -c 'ms after the last one ended' "$UZRAM_LOG")" -gt "$r0" ] && rc=0 && break
            sleep 0.1
        done
        out="worker $pid killed, served again: $(grep -o '[0-9]* ms after the last one ended' "$UZRAM_LOG" | tail -n 1)"
        ;;
    upgrade)
        cp "$UZRAM_BIN" "$bin.new" && mv "$bin.new" "$bin"
        out=$("$bin" upgrade "$swapdev" 2>&1)
        rc=$?
        ;;
    discard)
        out=$(fstrim -v /mnt/soakfs 2>&1)
        rc=$?
        ;;
    writeback)
        r0=$("$bin" attr "$swapdev" bd_stat 2>&1)
        out=$("$bin" attr "$swapdev" idle all 2>&1 && "$bin" attr "$swapdev" writeback idle 2>&1)
        rc=$?
        out="$out bd_stat $r0 -> $("$bin" attr "$swapdev" bd_stat 2>&1)"
        ;;
    memlimit)
        r0=$("$bin" attr "$swapdev" mm_stat 2>&1)
        # 3/4 of what the pool holds, at least 8 MiB (the policy may have written it all back)
        used=$(echo "$r0" | awk '{ u = int($3 * 3 / 4); print u < 8388608 ? 8388608 : u }')
        out="mm_stat $r0: $("$bin" attr "$swapdev" mem_limit "$used" 2>&1)"
        rc=$?
        sleep $((gap / 2))
        out="$out mem_limit $used for $((gap / 2)) s; $("$bin" attr "$swapdev" mem_limit 0 2>&1)"
        [ $rc = 0 ] && { "$bin" attr "$swapdev" mem_limit 0 >/dev/null 2>&1; rc=$?; }
        ;;
    freeze)
        if [ ! -w /sys/power/pm_test ]; then
            # without it, this would be a real suspend
            echo "fault $n $kind: skipped: no /sys/power/pm_test here (CONFIG_PM_DEBUG)" | tee -a "$log.faults" >>"$log"
            return 0
        fi
        out=$("$bin" sleep pre suspend 2>&1)
        rc=$?
        if [ $rc = 0 ]; then
            echo freezer >/sys/power/pm_test
            out="$out; $( (echo freeze >/sys/power/state) 2>&1)"
            rc=$?
            echo none >/sys/power/pm_test
        fi
        out="$out; $("$bin" sleep post suspend 2>&1)"
        ;;
    esac
    echo "fault $n $kind: exit $rc in $(elapsed "$t") s: $(echo "$out" | tr '\n' ' ' | cut -c1-200)" | tee -a "$log.faults" >>"$log"
    note "$name: $(tail -n 1 "$log.faults")"
    [ $rc = 0 ] && return 0
    # the daemons' own account of it
    tail -n +$((l0 + 1)) "$UZRAM_LOG" | grep -v 'requests read/write' | tail -n 40 >>"$log"
    return 1
}

# soak_summary (for check_soak): what was verified and injected, failures, restarts, peak RSS;
# adds what failed to $bad.
soak_summary() {
    local wfail ffail e oom pages
    wfail=$(dev_failed_writes "$swapdev") ffail=$(dev_failed_writes "$fsdev")
    dmesg | awk -v t="${ts0:-0}" 'match($0, /^\[ *[0-9.]+\]/) {
        s = substr($0, 2, RLENGTH - 2); gsub(/ /, "", s); if (s + 0 > t + 0) print }' >"$log.kmsg"
    e=$(grep -c -e 'Write-error on swap-device' -e 'I/O error, dev ublkb' -e 'I/O error, dev zram' "$log.kmsg")
    oom=$(grep -c -e 'Killed process' -e 'SIGBUS' "$log.kmsg")
    pages=$(awk '{ s += $1 } END { print s + 0 }' "$log.verified" 2>/dev/null)
    [ "$wfail" = 0 ] && [ "$ffail" = 0 ] && [ "$e" = 0 ] || bad="$bad; failed writes: swap device $wfail, file system device $ffail, $e in the kernel's log"
    [ "$oom" = 0 ] || bad="$bad; $oom process(es) killed"
    echo "$(elapsed "$t0") s, $pages pages verified, $k faults ($(awk '{ printf "%s%s %s s", s, $3, $7; s = ", " }' "$log.faults" 2>/dev/null | tr -d ':')), failed writes $wfail/$ffail, restarts $(uzram_stat_field "$swapdev" restarts), peak RSS of the daemons $(($(cat "$log.rss" 2>/dev/null || echo 0) / 1024)) MiB" >"$log.summary"
    cat "$log.summary" >>"$log"
}

# soak_cleanup SWAPDEV FSDEV (for check_soak): swap off, file systems unmounted, devices gone.
soak_cleanup() {
    swapoff "$1" 2>/dev/null
    SWAP_DEV=
    umount /mnt/soakfs /mnt/soakref 2>/dev/null
    zram_reset
    for d in "$1" "$2"; do
        [ -b "$d" ] && "$UZRAM_BIN" --reset "$d" >>"$log" 2>&1
    done
    UZRAM_DEV=
    # the backing file's file system last: the swap device's daemon held the file
    umount /mnt/soakwb >>"$log" 2>&1
}
