# shellcheck shell=sh
# Checks (sourced by checks.sh): recompression, writeback, tiering, and the helpers that show a daemon's state.

# check_recompress: a device with zstd as its recompression algorithm; written with lz4, all of
# it marked idle and recompressed through zram's attributes; less memory, every byte intact.
check_recompress() {
    local name=recompress log=$UZ_TMP/recompress.log dev m0 m1 c0 c1 t0 took MB=1048576
    note "$name: idle + recompress through the attributes"
    : >"$log"
    uzram_reset
    dev=$(UZRAM_PROGRESS_SECS=5 "$UZRAM_BIN" --find --size 128M --algorithm lz4 \
        --recomp-algorithm "algo=zstd priority=1" --log "$UZRAM_LOG" 2>>"$log")
    if [ ! -b "$dev" ]; then
        fail_log "$name" "$log" "no device with --recomp-algorithm"
        return
    fi
    UZRAM_DEV=$dev
    if ! "$TOOL" write "$dev" 0 $((32 * MB)) "$SEED" >>"$log" 2>&1; then
        echo "io_stat $("$UZRAM_BIN" attr "$dev" io_stat)" >>"$log"
        fail_log "$name" "$log" "writing 32 MiB failed (before any recompression)"
        return
    fi
    m0=$(dev_mem_used "$dev") c0=$(dev_stat_field "$dev" 2)
    "$UZRAM_BIN" attr "$dev" recomp_algorithm >>"$log" 2>&1
    t0=$(uptime_s)
    if ! "$UZRAM_BIN" attr "$dev" idle all >>"$log" 2>&1 ||
        ! "$UZRAM_BIN" attr "$dev" recompress "type=idle" >>"$log" 2>&1; then
        fail_log "$name" "$log" "idle/recompress refused after $(elapsed "$t0") s"
        return
    fi
    took=$(elapsed "$t0")
    m1=$(dev_mem_used "$dev") c1=$(dev_stat_field "$dev" 2)
    echo "mem_used $m0 -> $m1, compr $c0 -> $c1" >>"$log"
    if ! "$TOOL" verify "$dev" 0 $((32 * MB)) "$SEED" >>"$log" 2>&1; then
        fail_log "$name" "$log" "data changed by recompression"
        return
    fi
    if [ $((m1 * 100)) -gt $((m0 * 90)) ]; then
        fail_log "$name" "$log" "mem_used_total $(mib "$m0") -> $(mib "$m1"): recompression saved less than 10 %"
        return
    fi
    uzram_reset
    pass "$name" "32 MiB written with lz4, idle all, recompress type=idle (zstd) in $took s: mem_used_total $(mib "$m0") -> $(mib "$m1"), compr $(mib "$c0") -> $(mib "$c1"), verified"
}

# check_writeback FSDEV: a device whose backing file lives on ext4 on FSDEV (the scratch disk, or
# kernel zram without one); pages written back compressed and encrypted, read back intact (also
# under swap load), no plain text in the file, and discard frees the records' space.
check_writeback() {
    local name=writeback log=$UZ_TMP/writeback.log dev img=/mnt/wb/uzram-backing.img m0 m1 a0 a1 a2 bd MB=1048576
    local fsdev=$1
    note "$name: writeback to a file on ext4 on $fsdev"
    : >"$log"
    uzram_reset
    mkdir -p /mnt/wb
    # 512 MiB of the disk, its inode tables and journal written now (no lazy init running later)
    if ! { mke2fs -q -t ext4 -E lazy_itable_init=0,lazy_journal_init=0 "$fsdev" 512M && mount "$fsdev" /mnt/wb; } >>"$log" 2>&1; then
        fail_log "$name" "$log" "no filesystem for the backing file"
        return
    fi
    # what mke2fs dirtied written out now: reclaim waiting on it starved the daemon's memory
    # thread for 8 s once, and a write to this device (not swap) fails after 4 s without room
    sync
    # the policy off: this check counts what the manual writeback moves (tier tests the policy)
    dev=$(UZRAM_PROGRESS_SECS=5 UZRAM_STALL_SYSRQ=1 "$UZRAM_BIN" --find --size 128M --backing-dev "$img" \
        --policy "writeback_after=off min_free=0 psi=off evict=0" --log "$UZRAM_LOG" 2>>"$log")
    if [ ! -b "$dev" ]; then
        fail_log "$name" "$log" "no device with --backing-dev $img"
        umount /mnt/wb
        return
    fi
    UZRAM_DEV=$dev
    local bad= out
    # the file's first 4 KiB are uzram's label
    head -c 13 "$img" | grep -q '^uzram backing$' || bad="$bad; no label at the backing file's start"
    # a tampered record fails its read: page 0 alone written back lands right after the label
    "$TOOL" write "$dev" 0 4096 "$SEED" >>"$log" 2>&1 || bad="$bad; writing page 0 failed"
    "$UZRAM_BIN" attr "$dev" writeback page_index=0 >>"$log" 2>&1 || bad="$bad; writeback page_index=0 refused"
    "$TOOL" flip "$img" $((4096 + 40)) >>"$log" 2>&1
    echo 3 >/proc/sys/vm/drop_caches
    if ! dd if="$dev" of=/dev/null bs=4096 count=1 2>&1 | tee -a "$log" | grep -qi 'input/output error'; then
        bad="$bad; a flipped byte in the backing file read back without an I/O error"
    fi
    # page 0: a marker that must never reach the file in plain text
    yes UZRAM-SECRET-MARKER | head -c 4096 | dd of="$dev" bs=4096 count=1 conv=fsync 2>>"$log"
    "$TOOL" write "$dev" $MB $((32 * MB)) "$SEED" >>"$log" 2>&1 || bad="$bad; writing 32 MiB failed"
    m0=$(dev_mem_used "$dev")
    a0=$(bd_used_kib "$dev")
    if ! "$UZRAM_BIN" attr "$dev" idle all >>"$log" 2>&1 || ! "$UZRAM_BIN" attr "$dev" writeback idle >>"$log" 2>&1; then
        fail_log "$name" "$log" "idle/writeback refused"
        umount /mnt/wb
        return
    fi
    sync
    m1=$(dev_mem_used "$dev") bd=$("$UZRAM_BIN" attr "$dev" bd_stat)
    a1=$(bd_used_kib "$dev")
    echo "mem_used $m0 -> $m1, records $a0 -> $a1 KiB in a file of $(du -k "$img" | cut -f1) KiB, bd_stat $bd, mode $(stat -c %a "$img")" >>"$log"
    [ "$(stat -c %a "$img")" = 600 ] || bad="$bad; backing file mode $(stat -c %a "$img")"
    [ "$(echo "$bd" | awk '{ print $1 }')" -gt 4000 ] || bad="$bad; bd_stat '$bd'"
    [ "$m1" -lt $((m0 / 4)) ] || bad="$bad; mem_used_total $(mib "$m0") -> $(mib "$m1")"
    [ "$a1" -lt $((32 * 1024 * 6 / 10)) ] || bad="$bad; $a1 KiB on disk for 32 MiB: not compressed"
    grep -q UZRAM-SECRET-MARKER "$img" && bad="$bad; the marker is in the backing file in plain text"
    echo 3 >/proc/sys/vm/drop_caches
    dd if="$dev" bs=4096 count=1 2>>"$log" | grep -q UZRAM-SECRET-MARKER || bad="$bad; page 0 reads back wrong"
    # read back under swap load: a second uzram device as swap, a program pushing memory out to it
    # while every written-back page is read and verified
    local swapdev hog avail hogrc
    swapdev=$(UZRAM_PROGRESS_SECS=5 UZRAM_STALL_SYSRQ=1 "$UZRAM_BIN" --find --size 512M --log "$UZRAM_LOG" 2>>"$log")
    if [ -b "$swapdev" ] && mkswap "$swapdev" >>"$log" 2>&1 && swapon --discard=pages "$swapdev" >>"$log" 2>&1; then
        avail=$(($(meminfo_kb MemAvailable) / 1024))
        "$TOOL" swapfill $((avail * 3 / 2)) $((SEED + 7)) 1 >>"$log" 2>&1 &
        hog=$!
        sleep 2
        if ! "$TOOL" verify "$dev" $MB $((32 * MB)) "$SEED" >>"$log" 2>&1; then
            bad="$bad; written-back data reads back wrong under swap load"
            dev_state "$dev" >>"$log"
        fi
        wait $hog
        hogrc=$?
        echo "swap load: vmtool swapfill $((avail * 3 / 2)) MiB exit $hogrc, $(grep "^$swapdev" /proc/swaps)" >>"$log"
        [ $hogrc = 0 ] || bad="$bad; the swap load itself failed (exit $hogrc)"
        swapoff "$swapdev" >>"$log" 2>&1
    else
        bad="$bad; no second device for the swap load"
    fi
    [ -b "$swapdev" ] && "$UZRAM_BIN" --reset "$swapdev" >>"$log" 2>&1
    blkdiscard -o $MB -l $((16 * MB)) "$dev" >>"$log" 2>&1
    sync
    a2=$(bd_used_kib "$dev")
    echo "after discarding 16 MiB: records $a2 KiB" >>"$log"
    [ "$a2" -lt $((a1 * 8 / 10)) ] || bad="$bad; discard left $a2 KiB of records (was $a1)"
    if ! "$TOOL" verify "$dev" $((17 * MB)) $((16 * MB)) "$SEED" >>"$log" 2>&1; then
        bad="$bad; data beside the discard changed"
        dev_state "$dev" >>"$log"
    fi
    # the worker's death, twice: its successor reopens the backing file with the key the
    # supervisor holds (a sealed memfd) and rebuilds the space map from the slots; the second
    # kill lands while a writeback runs, whose pages must each be in RAM or wholly on the file
    local k pid wbpid= bd1 bd2 survived=
    bd1=$("$UZRAM_BIN" attr "$dev" bd_stat | awk '{ print $1 }')
    "$TOOL" write "$dev" $MB $((16 * MB)) $((SEED + 3)) >>"$log" 2>&1 || bad="$bad; writing 16 MiB again failed"
    "$UZRAM_BIN" attr "$dev" idle all >>"$log" 2>&1
    for k in 1 2; do
        pid=$("$UZRAM_BIN" --raw --noheadings -o PID "$dev" 2>>"$log")
        if [ $k = 2 ]; then
            "$UZRAM_BIN" attr "$dev" writeback idle >>"$log" 2>&1 &
            wbpid=$!
            sleep 0.2
            echo "kill 2: 0.2 s into a writeback, bd_stat pages $("$UZRAM_BIN" attr "$dev" bd_stat | awk '{ print $1 }') (was $bd1)" >>"$log"
        fi
        kill -KILL "$pid"
        if [ -n "$wbpid" ]; then
            wait "$wbpid"
            echo "kill 2: the writeback command exited $? (non-zero: the kill cut it short)" >>"$log"
        fi
        for _ in $(seq 1 600); do
            [ "$(uzram_stat_field "$dev" restarts)" = $k ] && break
            sleep 0.1
        done
        if [ "$(uzram_stat_field "$dev" restarts)" != $k ]; then
            bad="$bad; no successor served $dev 60 s after SIGKILL $k to worker $pid: $(tail -n 3 "$UZRAM_LOG" | tr '\n' ' ')"
            break
        fi
        bd2=$("$UZRAM_BIN" attr "$dev" bd_stat | awk '{ print $1 }')
        echo "kill $k: worker $pid; bd_stat pages $bd1 -> $bd2; $(grep 'adopted from' "$UZRAM_LOG" | tail -n 1)" >>"$log"
        [ $k = 1 ] && [ "$bd2" != "$bd1" ] && bad="$bad; $bd1 pages written back before the kill, $bd2 after"
        echo 3 >/proc/sys/vm/drop_caches
        if ! "$TOOL" verify "$dev" $((17 * MB)) $((16 * MB)) "$SEED" >>"$log" 2>&1 ||
            ! "$TOOL" verify "$dev" $MB $((16 * MB)) $((SEED + 3)) >>"$log" 2>&1; then
            bad="$bad; data reads back wrong after SIGKILL $k"
            dev_state "$dev" >>"$log"
            break
        fi
        survived="$survived $k"
    done
    # the successor writes back under the same key, beside the records of its predecessors
    if [ "$survived" = " 1 2" ]; then
        "$UZRAM_BIN" attr "$dev" idle all >>"$log" 2>&1
        "$UZRAM_BIN" attr "$dev" writeback idle >>"$log" 2>&1 || bad="$bad; writeback after the restarts refused"
        bd2=$("$UZRAM_BIN" attr "$dev" bd_stat | awk '{ print $1 }')
        echo "after the restarts: bd_stat pages $bd2" >>"$log"
        [ "$bd2" -gt "$bd1" ] || bad="$bad; only $bd2 pages written back after the restarts (before: $bd1)"
        if ! "$TOOL" verify "$dev" $((17 * MB)) $((16 * MB)) "$SEED" >>"$log" 2>&1 ||
            ! "$TOOL" verify "$dev" $MB $((16 * MB)) $((SEED + 3)) >>"$log" 2>&1; then
            bad="$bad; data reads back wrong after the successor's writeback"
        fi
    fi
    uzram_reset
    if ! umount /mnt/wb 2>>"$log"; then
        # the daemon is gone from the kernel and its socket, yet something holds the file
        sleep 5
        umount /mnt/wb 2>>"$log" || bad="$bad; /mnt/wb still busy after uzram --reset, held by:$(holders /mnt/wb)"
    fi
    # someone's data is never a backing device: a mounted partition is in use, an unmounted
    # one with a file system holds data uzram did not write; both refused, the file system intact
    mount "$fsdev" /mnt/wb 2>>"$log"
    out=$("$UZRAM_BIN" --find --size 64M --backing-dev "$fsdev" --log "$UZRAM_LOG" 2>&1) &&
        bad="$bad; a mounted $fsdev was taken as backing device: $out"
    echo "$out" | grep -q "in use" || bad="$bad; the refusal of a mounted $fsdev says: $out"
    umount /mnt/wb 2>>"$log"
    out=$("$UZRAM_BIN" --find --size 64M --backing-dev "$fsdev" --log "$UZRAM_LOG" 2>&1) &&
        bad="$bad; $fsdev with a file system was taken as backing device: $out"
    echo "$out" | grep -q "holds data uzram did not write" || bad="$bad; the refusal of $fsdev says: $out"
    e2fsck -fn "$fsdev" >>"$log" 2>&1 || bad="$bad; the file system on $fsdev is damaged after the refusals"
    echo "refusals: $out" >>"$log"
    if [ -n "$bad" ]; then
        fail_log "$name" "$log" "${bad#; }"
        return
    fi
    pass "$name" "32 MiB written back: mem_used_total $(mib "$m0") -> $(mib "$m1"), records ${a1} KiB (file 0600, allocated in full, no plain text), bd_stat $(echo $bd); verified under swap load; a flipped byte fails its read; discarding half left ${a2} KiB of records; the worker killed twice (once 0.2 s into a writeback), every page verified after each and after the successor's own writeback ($bd1 -> $bd2 pages written back); a mounted partition and one holding a file system refused, e2fsck clean"
}


# openers PATTERN: the pids with an open file whose `ls -l` line matches PATTERN (grep -E)
openers() {
    local p
    for p in /proc/[0-9]*; do
        ls -l "$p/fd" 2>/dev/null | grep -qE "$1" && echo "${p#/proc/}"
    done
}

# threads PID: each thread of PID as " name=state/wait channel"
threads() {
    local t
    for t in /proc/"$1"/task/*; do
        printf ' %s=%s/%s' "$(cat "$t/comm" 2>/dev/null)" "$(awk '{ print $3 }' "$t/stat" 2>/dev/null)" "$(cat "$t/wchan" 2>/dev/null)"
    done
}

# dev_state DEV: what the daemon of DEV says and is doing, for a failure's log
dev_state() {
    local pid
    echo "state of $1: io_stat $("$UZRAM_BIN" attr "$1" io_stat 2>&1) bd_stat $("$UZRAM_BIN" attr "$1" bd_stat 2>&1)"
    # the daemon holds the device's control node open
    for pid in $(openers " /dev/ublkc${1#/dev/ublkb}\$"); do
        echo "  daemon $pid:$(threads "$pid")"
    done
}

# holders PATH: the processes with a file under PATH open, with their threads' states
holders() {
    local pid
    for pid in $(openers " $1/"); do
        printf ' %s (%s:%s)' "$pid" "$(cat "/proc/$pid/comm" 2>/dev/null)" "$(threads "$pid")"
    done
}

# bd_used_kib DEV: KiB the written-back records take in the first backing file (uzram_stat)
bd_used_kib() { "$UZRAM_BIN" attr "$1" uzram_stat | awk '$1 == "bd_file0_used" { print int($2 / 1024) }'; }

# ---- tiering: a small mem_limit and a backing file on a disk ----------------------------------------
# check_tier: kernel zram and uzram, each as the only swap with the same small mem_limit, take a
# program that fills 1.5x MemAvailable (three to six times the limit in swap) and verifies every
# page twice. zram can only fail the writes
# past its limit (io_stat failed_writes, "Write-error on swap-device"; it writes back only when
# told to). uzram evicts cold pages to the guest's disk (/dev/vda, its backing device) instead: the
# program must complete, verified, with at most a handful of failed writes, and policy_stat must show the evictions,
# the watermark writeback and the idle recompression.
check_tier() {
    local name=tier log=$UZ_TMP/tier.log lim=48 size avail fill rc zrc=skipped zfail=0 zerr=0 e0
    local dev io fw ps bd used_max wm ev rp gp bad= t0 zline
    if [ ! -b /dev/vda ]; then
        skip "$name" "no /dev/vda: tests/vm/run attaches a scratch disk as backing device"
        return
    fi
    note "$name: mem_limit ${lim}M with a backing file, against kernel zram with the same limit"
    t0=$(uptime_s)
    : >"$log"
    size=$((($(meminfo_kb MemTotal) / 1024 * 2 + 1023) / 1024 * 1024))M
    # 1. kernel zram: the same limit, no writeback (zram's is a manual trigger)
    if [ "$ZRAM_OURS" = 1 ] && zram_setup lz4 "$size" && echo ${lim}M >$ZRAM/mem_limit &&
        mkswap /dev/zram0 >>"$log" 2>&1 && swapon -p 32767 /dev/zram0 >>"$log" 2>&1; then
        SWAP_DEV=/dev/zram0
        sync
        echo 3 >/proc/sys/vm/drop_caches
        avail=$(($(meminfo_kb MemAvailable) / 1024)) fill=$((avail * 3 / 2))
        e0=$(dmesg | grep -c 'Write-error on swap-device')
        timeout 240 "$TOOL" swapfill $fill "$SEED" 2 >>"$log" 2>&1
        zrc=$?
        zfail=$(awk '{ print $2 }' $ZRAM/io_stat)
        zerr=$(($(dmesg | grep -c 'Write-error on swap-device') - e0))
        zline="kernel zram: vmtool swapfill $fill MiB exit $zrc (124: timed out, >128: killed), io_stat failed_writes $zfail, $zerr 'Write-error on swap-device' lines, mm_stat $(cat $ZRAM/mm_stat)"
        echo "$zline" >>"$log"
        note "$zline"
        swapoff /dev/zram0 >>"$log" 2>&1
        SWAP_DEV=
        zram_reset
    fi
    # 2. uzram: the same limit, the disk itself as backing device (zram's kind of backing_dev;
    # --force: earlier checks left a filesystem on this scratch disk).
    # Not a file on a filesystem: the I/O threads' direct I/O to a file takes its bios from the
    # pool the swap writes to this very device hold (fs_bio_set), which ran dry here; a block
    # device's direct I/O has its own.
    uzram_reset
    dev=$(UZRAM_PROGRESS_SECS=5 UZRAM_STALL_SYSRQ=1 "$UZRAM_BIN" --find --size "$size" --mem-limit ${lim}M \
        --backing-dev /dev/vda --force --recomp-algorithm zstd --policy "recompress_after=5s" \
        --log "$UZRAM_LOG" 2>>"$log")
    if [ ! -b "$dev" ]; then
        fail_log "$name" "$log" "no device with --mem-limit ${lim}M --backing-dev /dev/vda"
        return
    fi
    UZRAM_DEV=$dev
    if ! { mkswap "$dev" && swapon --discard=pages -p 32767 "$dev"; } >>"$log" 2>&1; then
        fail_log "$name" "$log" "mkswap/swapon failed"
        uzram_reset
        return
    fi
    SWAP_DEV=$dev
    sync
    echo 3 >/proc/sys/vm/drop_caches
    avail=$(($(meminfo_kb MemAvailable) / 1024)) fill=$((avail * 3 / 2))
    "$TOOL" swapfill $fill "$SEED" 2 >>"$log" 2>&1
    rc=$?
    grep '^vmtool' "$log" | tail -1 | sed 's/^/VM: /'
    io=$("$UZRAM_BIN" attr "$dev" io_stat) ps=$("$UZRAM_BIN" attr "$dev" policy_stat)
    bd=$("$UZRAM_BIN" attr "$dev" bd_stat) used_max=$(dev_stat_field "$dev" 5)
    {
        echo "uzram: vmtool exit $rc; io_stat $io; bd_stat $bd; mm_stat $(dev_mm_stat "$dev")"
        echo "$ps"
        "$UZRAM_BIN" attr "$dev" uzram_stat
        "$UZRAM_BIN" -o NAME,DATA,TOTAL,MEM-LIMIT,BD-USED,WRITTEN-BACK,EVICTED,RECOMPRESSED "$dev"
    } >>"$log" 2>&1
    note "uzram policy_stat: $(echo $ps)"
    note "uzram io_stat: $io; uzram_stat: $("$UZRAM_BIN" attr "$dev" uzram_stat | tr '\n' ' ')"
    swapoff "$dev" >>"$log" 2>&1
    SWAP_DEV=
    uzram_reset
    fw=$(echo "$io" | awk '{ print $2 }')
    stat_of() { echo "$ps" | awk -v k="$1" '$1 == k { print $2 }'; }
    wm=$(stat_of watermark_writeback_pages) ev=$(stat_of evicted_pages) rp=$(stat_of recompressed_pages)
    gp=$(stat_of groups_made) # (grouped_pages is a gauge: none are left once swap has freed them)
    [ $rc = 0 ] || bad="$bad; vmtool swapfill $fill MiB exited $rc on uzram (1: data mismatch, >128: killed)"
    # zram fails millions; uzram may fail a rare write whose store found no room after 8
    # eviction rounds (seen in four runs: 6, 1, 1, 4 of about 200k requests; swap retries them)
    [ "$fw" -le 16 ] || bad="$bad; $fw failed writes on uzram"
    [ $((wm + ev)) -gt 0 ] || bad="$bad; nothing was written back (watermark $wm, evicted $ev)"
    [ $((rp + gp)) -gt 0 ] || bad="$bad; nothing was recompressed or grouped"
    [ "$used_max" -le $((lim << 20)) ] || bad="$bad; mem_used_max $(mib "$used_max") passed the ${lim}M limit"
    if [ "$zrc" != skipped ] && [ "$zfail" = 0 ] && [ "$zerr" = 0 ] && [ "$zrc" = 0 ]; then
        bad="$bad; kernel zram with the same limit did not fail: the check proves nothing (limit too generous?)"
    fi
    if [ -n "$bad" ]; then
        fail_log "$name" "$log" "${bad#; }"
        return
    fi
    pass "$name" "mem_limit ${lim}M: $fill MiB (1.5x MemAvailable) verified twice on uzram with $fw failed writes, watermark writeback $wm pages, evicted $ev, recompressed $rp, groups made $gp, bd_stat $(echo $bd), peak mem_used $(mib "$used_max"); kernel zram with the same limit: exit $zrc, $zfail failed writes, $zerr write-error lines; $(elapsed "$t0")s"
}
