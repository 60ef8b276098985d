# The device checks: each takes the block device and a name prefix, and prints its PASS/FAIL/SKIP
# lines through lib.sh. They know nothing of which driver serves the device, except through
# dev_mm_stat/dev_compact (lib.sh), so the same functions check kernel zram ("zram-" names) and
# uzram's ublk device ("" prefix):
#   check_fio DEV PREFIX      fio random writes + crc32c verify (io_uring, libaio; beside discards)
#   check_ext4 DEV PREFIX     a filesystem of real files survives drop_caches, remount, fsck
#   check_swap DEV PREFIX     swap under real pressure: every page comes back; swapoff frees memory
#   check_discard DEV PREFIX  discarded ranges read zeros, neighbours stay, memory is given back
#   check_churn DEV PREFIX    programs swap and exit in turn: the device holds what swap holds
# Device sizes they need: fio 160 MiB, ext4 256 MiB, discard 64 MiB, swap: see check_swap.

SEED=${UZRAM_VM_SEED:-20250520}

# ---- fio -----------------------------------------------------------------------------------------
FIO_MB=48       # per verify job
FIO_STRIDE=112  # MiB between the two verify jobs; the trim run's discards go in between
FIO_BSSPLIT=4k/30:8k/10:16k/15:32k/15:64k/15:128k/15

fio_global() { # DEV ENGINE
    cat <<EOF
[global]
filename=$1
direct=1
ioengine=$2
iodepth=32
bssplit=$FIO_BSSPLIT
buffer_compress_percentage=50
refill_buffers=1
verify=crc32c
verify_fatal=1
verify_state_save=0
randrepeat=1
group_reporting=1
EOF
}

# two jobs, each writing every block of its own 48 MiB once at random, verified as it goes
fio_verify_job() { # VERIFY_ONLY
    printf '[verify]\nrw=randwrite\nsize=%sm\nnumjobs=2\noffset_increment=%sm\n' $FIO_MB $FIO_STRIDE
    if [ "$1" = 1 ]; then echo verify_only=1; else echo verify_backlog=256; fi
}

fio_why() { # LOG: the line that best says what went wrong
    local re
    for re in 'verify failed|bad header|bad magic|crc32c: ' 'err=[ ]*[1-9]' 'io_uring_|error|fio: '; do
        grep -v 'multiple writers may overwrite' "$1" | grep -m1 -iE "$re" && break
    done | tr -s ' \t' ' ' | cut -c1-220
}

io_uring_problem() { # prints why io_uring cannot be used, if it cannot (1 still lets root in)
    _d=$(cat /proc/sys/kernel/io_uring_disabled 2>/dev/null || echo 0)
    [ "$_d" != 2 ] || echo "io_uring is disabled (kernel.io_uring_disabled=$_d)"
}

# fio_verify DEV NAME ENGINE: write + verify, then (after an optional deliberate corruption)
# read everything back again with verify_only.
fio_verify() {
    local dev=$1 name=$2 eng=$3 log=$UZ_TMP/$2.log job=$UZ_TMP/$2.fio t0 w r why
    note "$name: fio $eng"
    { fio_global "$dev" "$eng"; fio_verify_job 0; } >"$job"
    { fio_global "$dev" "$eng"; fio_verify_job 1; } >"$job.reread"
    t0=$(uptime_s)
    if ! fio "$job" >"$log" 2>&1; then
        why=$(fio_why "$log")
        case $why in *io_uring*) why="io_uring unavailable in this kernel: $why" ;; esac
        fail_log "$name" "$log" "fio write+verify with $eng failed: $why"
        return
    fi
    w=$(elapsed "$t0")
    if [ "$UZRAM_VM_BREAK" = 1 ]; then
        "$TOOL" flip "$dev" $((1048576 + 4099)) >>"$log" 2>&1
        note "UZRAM_VM_BREAK=1: flipped byte 1 MiB + 4099 of $dev before the re-read"
    fi
    t0=$(uptime_s)
    if ! fio "$job.reread" >>"$log" 2>&1; then
        fail_log "$name" "$log" "fio re-read (verify_only) with $eng failed: $(fio_why "$log")"
        return
    fi
    r=$(elapsed "$t0")
    pass "$name" "$eng, 2 jobs x $FIO_MB MiB, bs 4k-128k, qd32, crc32c: write+verify ${w}s, re-read ${r}s; $(dev_summary "$dev")"
}

# fio_trim DEV NAME: the verify jobs run while two jobs discard in the 64 MiB between them: one
# trims and rewrites it sequentially (trimwrite), one trims at random (randtrim), 4k-256k (fio 3.33's
# randtrimwrite issues one trim in all, so it is not used). Then a re-read, and the region between,
# discarded once more, must read as zeros.
fio_trim() {
    local dev=$1 name=$2 log=$UZ_TMP/$2.log job=$UZ_TMP/$2.fio eng=libaio t0 w toff tlen trims
    [ -z "$(io_uring_problem)" ] && eng=io_uring
    toff=$((FIO_MB << 20)) tlen=$(((FIO_STRIDE - FIO_MB) << 20))
    note "$name: fio $eng with concurrent discards"
    {
        fio_global "$dev" "$eng"
        fio_verify_job 0
        # randtrim is fast: 20 loops keep it going while the verify jobs run
        for j in trimwrite:3 randtrim:20; do
            printf '[%s]\nrw=%s\noffset=%s\nsize=%s\nbssplit=4k/25:32k/25:128k/25:256k/25\n' \
                "${j%:*}" "${j%:*}" "$toff" "$tlen"
            printf 'iodepth=8\nloops=%s\nverify=0\ndo_verify=0\n' "${j#*:}"
        done
    } >"$job"
    { fio_global "$dev" "$eng"; fio_verify_job 1; } >"$job.reread"
    t0=$(uptime_s)
    if ! fio "$job" >"$log" 2>&1; then
        fail_log "$name" "$log" "fio verify beside discards failed: $(fio_why "$log")"
        return
    fi
    # "issued rwts: total=R,W,T,0": the trims must have been issued
    trims=$(sed -n 's/.*issued rwts: total=[0-9]*,[0-9]*,\([0-9]*\),.*/\1/p' "$log" | head -n 1)
    if [ "${trims:-0}" -lt 1000 ]; then
        fail_log "$name" "$log" "fio issued only ${trims:-0} trims"
        return
    fi
    if ! fio "$job.reread" >>"$log" 2>&1; then
        fail_log "$name" "$log" "fio re-read after the discards failed: $(fio_why "$log")"
        return
    fi
    if ! blkdiscard -o "$toff" -l "$tlen" "$dev" >>"$log" 2>&1; then
        fail_log "$name" "$log" "blkdiscard -o $toff -l $tlen failed"
        return
    fi
    if ! "$TOOL" zeros "$dev" "$toff" "$tlen" >>"$log" 2>&1; then
        fail_log "$name" "$log" "the discarded region does not read as zeros"
        return
    fi
    w=$(elapsed "$t0")
    pass "$name" "$eng: 2 verify jobs beside $trims trims (trimwrite + randtrim, 4k-256k) on the 64 MiB between them: verified, re-read, that region discarded reads zeros, ${w}s; $(dev_summary "$dev")"
}

check_fio() { # DEV PREFIX
    local why
    why=$(io_uring_problem)
    if [ -n "$why" ]; then
        fail "${2}fio-verify-io_uring" "$why"
    else
        fio_verify "$1" "${2}fio-verify-io_uring" io_uring
    fi
    fio_verify "$1" "${2}fio-verify-libaio" libaio
    fio_trim "$1" "${2}fio-verify-trim"
}

# check_cleanup: undo what a failed check left behind, so the device can be reset for the next one
check_cleanup() {
    [ -n "$HOLD_PID" ] && kill -9 "$HOLD_PID" 2>/dev/null && wait "$HOLD_PID" 2>/dev/null
    HOLD_PID=
    [ -n "$EXT4_MNT" ] && umount "$EXT4_MNT" 2>/dev/null
    EXT4_MNT=
    [ -n "$SWAP_DEV" ] && swapoff "$SWAP_DEV" 2>/dev/null
    SWAP_DEV=
    return 0
}

# ---- ext4 ----------------------------------------------------------------------------------------
EXT4_MB=24      # of real files from the host's /usr
EXT4_MNT=

# ext4_pick_files LIST: about 240 regular files (< 1 MiB, at most EXT4_MB in all) of the host's
# /usr: binaries and libraries (top level of bin/ and lib/x86_64-linux-gnu/) and C headers
# (include/linux/ and include/x86_64-linux-gnu/, nested; from libc6-dev, which run installs).
# Few directories on purpose: each costs a 9p walk, slow under TCG. Paths relative to $SRC.
ext4_pick_files() {
    local all=$UZ_TMP/ext4.all n step
    (cd "$SRC" && {
        find bin lib/x86_64-linux-gnu -maxdepth 1 -type f -size -1024k
        find include/linux include/x86_64-linux-gnu -type f -size -1024k
    } 2>/dev/null) | grep -v '[[:space:]]' | sort >"$all"
    n=$(wc -l <"$all")
    step=$((n / 240))
    [ "$step" -ge 1 ] || step=1
    (cd "$SRC" && awk -v s="$step" 'NR % s == 0' "$all" | head -n 300 | xargs stat -c '%s %n') |
        awk -v max=$((EXT4_MB << 20)) '$1 + sum <= max { sum += $1; print $2 }' >"$1"
}

check_ext4() { # DEV PREFIX
    local dev=$1 name=${2}ext4 log=$UZ_TMP/${2}ext4.log mnt=$UZ_TMP/mnt-ext4
    local man=$UZ_TMP/ext4.manifest list=$UZ_TMP/ext4.list t0 i sz rep nfiles nreal kib
    SRC=$UZRAM_VM_ROOT/usr
    note "$name: mkfs, files, drop_caches, fsck"
    t0=$(uptime_s)
    : >"$log"
    mkdir -p "$mnt"
    if ! mke2fs -q -F -t ext4 "$dev" >>"$log" 2>&1; then
        fail_log "$name" "$log" "mke2fs -t ext4 $dev failed"
        return
    fi
    if ! mount -t ext4 "$dev" "$mnt" >>"$log" 2>&1; then
        fail_log "$name" "$log" "mount -t ext4 $dev failed"
        return
    fi
    EXT4_MNT=$mnt
    # real files, copied with their tree; checksums taken from the source
    ext4_pick_files "$list"
    note "$name: picked $(wc -l <"$list") files at $(elapsed "$t0")s"
    mkdir -p "$mnt/usr" "$mnt/gen"
    (cd "$SRC" && cpio -o -H newc <"$list") 2>>"$log" | (cd "$mnt/usr" && cpio -id) 2>>"$log"
    note "$name: copied at $(elapsed "$t0")s"
    (cd "$SRC" && xargs sha256sum <"$list") | sed 's|  |  usr/|' >"$man"
    note "$name: source checksums at $(elapsed "$t0")s"
    # generated files: sizes around page and block boundaries, every page kind of vmtool
    i=0
    for sz in 0 1 511 512 4095 4096 4097 8191 65535 65536 131073 262144 1000000 1048576 3000001; do
        for rep in 0 1 2 3; do
            "$TOOL" gen $((SEED + rep)) $((i * 1000)) $((sz + rep * 4096)) | tee "$mnt/gen/f$i" |
                sha256sum | sed "s|  *-\$|  gen/f$i|" >>"$man"
            i=$((i + 1))
        done
    done
    # a sparse file with one page of data in the middle
    dd if=/dev/zero of="$mnt/gen/sparse" bs=1 count=0 seek=8388608 2>>"$log"
    "$TOOL" gen "$SEED" 7 4096 | dd of="$mnt/gen/sparse" bs=4096 seek=1000 conv=notrunc 2>>"$log"
    { head -c 4096000 /dev/zero; "$TOOL" gen "$SEED" 7 4096; head -c $((8388608 - 4100096)) /dev/zero; } |
        sha256sum | sed 's|  *-$|  gen/sparse|' >>"$man"
    nfiles=$(wc -l <"$man") nreal=$(wc -l <"$list")
    note "$name: generated at $(elapsed "$t0")s"
    kib=$(du -sk "$mnt" | cut -f1)
    sync
    echo 3 >/proc/sys/vm/drop_caches
    if ! (cd "$mnt" && sha256sum -c "$man") >>"$log" 2>&1; then
        fail_log "$name" "$log" "checksums differ after sync + drop_caches ($(grep -c FAILED "$log") files)"
        return
    fi
    note "$name: verified at $(elapsed "$t0")s"
    if ! umount "$mnt" >>"$log" 2>&1; then
        fail_log "$name" "$log" "umount failed"
        return
    fi
    EXT4_MNT=
    if ! e2fsck -fn "$dev" >>"$log" 2>&1; then
        fail_log "$name" "$log" "e2fsck -fn reports problems"
        return
    fi
    note "$name: fsck at $(elapsed "$t0")s"
    mount -t ext4 -o ro "$dev" "$mnt" >>"$log" 2>&1 && EXT4_MNT=$mnt
    if ! (cd "$mnt" && sha256sum -c "$man") >>"$log" 2>&1; then
        fail_log "$name" "$log" "checksums differ after remount ($(grep -c FAILED "$log") files)"
        return
    fi
    umount "$mnt" && EXT4_MNT=
    pass "$name" "$nfiles files ($nreal from the host's /usr, $((nfiles - nreal)) generated), $((kib / 1024)) MiB: checksums ok after drop_caches and remount, e2fsck -fn clean, $(elapsed "$t0")s; $(dev_summary "$dev")"
}

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

# ---- discard -------------------------------------------------------------------------------------
# check_discard DEV PREFIX: 64 MiB of vmtool pages; discard the middle 32 MiB: zeros read back,
# the 16 MiB either side intact, orig_data_size down by exactly 32 MiB, and (after compaction)
# mem_used_total down by at least 30% of what the 64 MiB took; discarding all gives it all back.
check_discard() {
    local dev=$1 name=${2}discard log=$UZ_TMP/${2}discard.log t0 m0 m1 m2 o0 o1 o2 MB=1048576
    note "$name: blkdiscard"
    t0=$(uptime_s)
    : >"$log"
    if ! "$TOOL" write "$dev" 0 $((64 * MB)) "$SEED" >>"$log" 2>&1; then
        fail_log "$name" "$log" "writing 64 MiB failed"
        return
    fi
    m0=$(dev_mem_used "$dev") o0=$(dev_stat_field "$dev" 1)
    echo "after write: $(dev_mm_stat "$dev")" >>"$log"
    if ! blkdiscard -o $((16 * MB)) -l $((32 * MB)) "$dev" >>"$log" 2>&1; then
        fail_log "$name" "$log" "blkdiscard failed"
        return
    fi
    dev_compact "$dev"
    m1=$(dev_mem_used "$dev") o1=$(dev_stat_field "$dev" 1)
    echo "after discard: $(dev_mm_stat "$dev")" >>"$log"
    if ! "$TOOL" zeros "$dev" $((16 * MB)) $((32 * MB)) >>"$log" 2>&1; then
        fail_log "$name" "$log" "the discarded 32 MiB do not read as zeros"
        return
    fi
    if ! "$TOOL" verify "$dev" 0 $((16 * MB)) "$SEED" >>"$log" 2>&1 ||
        ! "$TOOL" verify "$dev" $((48 * MB)) $((16 * MB)) "$SEED" >>"$log" 2>&1; then
        fail_log "$name" "$log" "data beside the discarded range changed"
        return
    fi
    if [ $((o0 - o1)) != $((32 * MB)) ]; then
        fail_log "$name" "$log" "orig_data_size fell by $((o0 - o1)), not 32 MiB ($o0 -> $o1)"
        return
    fi
    if [ $((m0 - m1)) -lt $((m0 * 3 / 10)) ]; then
        fail_log "$name" "$log" "mem_used_total $(mib "$m0") -> $(mib "$m1"): discard gave back too little"
        return
    fi
    if ! blkdiscard "$dev" >>"$log" 2>&1; then
        fail_log "$name" "$log" "blkdiscard of the whole device failed"
        return
    fi
    dev_compact "$dev"
    m2=$(dev_mem_used "$dev") o2=$(dev_stat_field "$dev" 1)
    echo "after discarding all: $(dev_mm_stat "$dev")" >>"$log"
    if [ "$o2" != 0 ] || [ "$m2" -gt $((m0 / 20 + 262144)) ]; then
        fail_log "$name" "$log" "after discarding everything: orig $o2 B, mem_used $(mib "$m2") (was $(mib "$m0"))"
        return
    fi
    pass "$name" "32 of 64 MiB discarded: zeros read back, neighbours intact, orig_data_size -32 MiB, mem_used_total $(mib "$m0") -> $(mib "$m1") -> $(mib "$m2") after discarding all, $(elapsed "$t0")s"
}

# ---- uzram's own: the command line, its attributes, bad input, a killed daemon ------------------
# These need uzram (no zram counterpart) but hold it to zram where zram has an answer: attribute
# formats are compared with kernel zram's in the same guest.

# fmt_like TEMPLATE TEXT: TEXT is exactly printf TEMPLATE applied to TEXT's own numbers.
fmt_like() {
    # shellcheck disable=SC2086,SC2046
    [ "$(printf "$1" $(echo "$2" | tr -c '0-9\n' ' '))" = "$2" ]
}

# check_attrs DEV: mm_stat, io_stat, debug_stat, comp_algorithm, disksize read the way kernel
# zram prints them (the templates are first proven on /sys/block/zram0); writes and errors
# behave as zram's; reads are open to every user, writes are root's.
check_attrs() {
    local dev=$1 name=attrs log=$UZ_TMP/attrs.log a t z u bad=
    note "$name: zram's attributes on $dev"
    : >"$log"
    "$TOOL" write "$dev" 0 $((8 * 1048576)) "$SEED" >>"$log" 2>&1 || bad="$bad; writing 8 MiB failed"
    # zram dropped debug_stat's writestall in Linux 6.14: a bare 0 in its place
    local ds='version: %s\n%8s %8s\n'
    case $(uname -r) in 6.1[4-9]* | 6.[2-9][0-9]* | [7-9].* | [1-9][0-9].*) ds='version: %s\n%s %8s\n' ;; esac
    for a in 'mm_stat:%8s %8s %8s %8s %8s %8s %8s %8s %8s\n' 'io_stat:%8s %8s %s %8s\n' \
        "debug_stat:$ds"; do
        t=${a#*:} a=${a%%:*}
        z=$(cat "$ZRAM/$a" 2>/dev/null) u=$("$UZRAM_BIN" attr "$dev" "$a" 2>>"$log")
        echo "$a: zram '$z' uzram '$u'" >>"$log"
        if [ -n "$z" ] && ! fmt_like "$t" "$z"; then
            bad="$bad; kernel zram's $a is not '$t' here: '$z'"
        elif ! fmt_like "$t" "$u"; then
            bad="$bad; $a '$u' is not '$t'"
        fi
    done
    # the attributes this kernel's zram has that 6.12's had not: the same answer to each value
    # (ok, or the same errno), zram's written with a shell's echo
    local errs
    for a in writeback_batch_size compressed_writeback; do
        [ -e "$ZRAM/$a" ] || continue
        errs=0
        for t in 0 2 many yes off; do
            z=$({ echo "$t" >"$ZRAM/$a"; } 2>&1 | sed -n 's/.*write error: //p')
            # uzram's errno words, or its whole complaint when it failed some other way
            if "$UZRAM_BIN" attr "$dev" "$a" "$t" >/dev/null 2>"$UZ_TMP/attr.err"; then
                u=
            else
                u=$(sed -n "s|.*$dev: $a: \([^:]*\):.*|\1|p" "$UZ_TMP/attr.err")
                [ -n "$u" ] || u="failed: $(head -c 200 "$UZ_TMP/attr.err")"
            fi
            echo "$a '$t': zram '${z:-ok}' uzram '${u:-ok}'" >>"$log"
            [ "$z" = "$u" ] || bad="$bad; $a '$t': zram '${z:-ok}' uzram '${u:-ok}'"
            [ -z "$z" ] || errs=$((errs + 1))
        done
        # each refuses some of these values: a comparison that read no error compared nothing
        [ "$errs" -gt 0 ] || bad="$bad; no error read from zram's $a (the comparison saw nothing)"
    done
    u=$("$UZRAM_BIN" attr "$dev" comp_algorithm)
    echo "$u" | grep -Eq '^([a-z0-9-]+ )*\[lz4\] ([a-z0-9-]+ )*$' || bad="$bad; comp_algorithm '$u'"
    [ "$("$UZRAM_BIN" attr "$dev" disksize)" = $((256 * 1048576)) ] || bad="$bad; disksize"
    [ "$("$UZRAM_BIN" attr "$dev" initstate)" = 1 ] || bad="$bad; initstate"
    "$UZRAM_BIN" attr "$dev" mem_limit 2M >>"$log" 2>&1 || bad="$bad; mem_limit 2M refused"
    [ "$(dev_stat_field "$dev" 4)" = 2097152 ] || bad="$bad; mem_limit not in mm_stat"
    "$UZRAM_BIN" attr "$dev" mem_limit 0 >>"$log" 2>&1
    "$UZRAM_BIN" attr "$dev" mem_used_max 0 >>"$log" 2>&1 || bad="$bad; mem_used_max 0 refused"
    "$UZRAM_BIN" attr "$dev" mem_used_max 5 >>"$log" 2>&1 && bad="$bad; mem_used_max 5 accepted"
    "$UZRAM_BIN" attr "$dev" mem_limit >>"$log" 2>&1 && bad="$bad; write-only mem_limit read"
    "$UZRAM_BIN" attr "$dev" disksize 1G >>"$log" 2>&1 && bad="$bad; disksize changed on a live device"
    "$UZRAM_BIN" attr "$dev" nonsense >>"$log" 2>&1 && bad="$bad; unknown attribute read"
    if command -v setpriv >/dev/null 2>&1; then
        setpriv --reuid=65534 --regid=65534 --clear-groups "$UZRAM_BIN" attr "$dev" mm_stat >>"$log" 2>&1 ||
            bad="$bad; an unprivileged user cannot read mm_stat"
        setpriv --reuid=65534 --regid=65534 --clear-groups "$UZRAM_BIN" attr "$dev" mem_limit 1G >>"$log" 2>&1 &&
            bad="$bad; an unprivileged user changed mem_limit"
        grep -q 'needs root' "$log" || bad="$bad; no 'needs root' message"
        ls -ld / /run /run/uzram /run/uzram/* >>"$log" 2>&1
    else
        note "$name: no setpriv, the unprivileged-user part is left out"
    fi
    # the listing: zramctl's default columns, and uzram's STATE/RSS
    "$UZRAM_BIN" >>"$log" 2>&1
    u=$("$UZRAM_BIN" --raw --noheadings --bytes -o NAME,ALGORITHM,DISKSIZE,STATE "$dev" 2>>"$log")
    [ "$u" = "$dev lz4 $((256 * 1048576)) live" ] || bad="$bad; listing '$u'"
    "$UZRAM_BIN" | head -1 | grep -q '^NAME  *ALGORITHM DISKSIZE  *DATA  *COMPR  *TOTAL STREAMS MOUNTPOINT$' ||
        bad="$bad; default heading '$("$UZRAM_BIN" | head -1)'"
    if [ -n "$bad" ]; then
        fail_log "$name" "$log" "${bad#; }"
        return
    fi
    pass "$name" "mm_stat, io_stat, debug_stat as kernel zram prints them; comp_algorithm, disksize, initstate, mem_limit, mem_used_max, errors as zram's; reads open to all, writes root's; listing"
}

# check_badinput: clear errors, exit 1, and nothing created or changed.
check_badinput() {
    local name=badinput log=$UZ_TMP/badinput.log bad= before after out dev i
    note "$name: bad sizes, algorithms, names, and resets of busy devices"
    : >"$log"
    before=$(ls /sys/class/ublk-char 2>/dev/null | wc -l)
    for args in "--find --size lots" "--find --size 0" "--find --size 1G --algorithm lzo" \
        "--find --size 1G --algorithm-params level=x" "--find --streams 0" "--size 1G /dev/zram0" "--reset /dev/ublkb99" \
        "--output NOPE" "--bogus"; do
        # shellcheck disable=SC2086
        out=$("$UZRAM_BIN" $args 2>&1)
        rc=$?
        echo "uzram $args -> $rc: $out" >>"$log"
        [ $rc = 1 ] || bad="$bad; 'uzram $args' exited $rc"
        [ -n "$out" ] || bad="$bad; 'uzram $args' said nothing"
    done
    # zramctl's -f alone: the name the next device would get, nothing created
    out=$("$UZRAM_BIN" --find 2>&1)
    echo "uzram --find -> $?: $out" >>"$log"
    echo "$out" | grep -Eq '^/dev/ublkb[0-9]+$' || bad="$bad; 'uzram --find' printed '$out'"
    [ -e "$out" ] && bad="$bad; 'uzram --find' names $out, which exists"
    after=$(ls /sys/class/ublk-char 2>/dev/null | wc -l)
    [ "$before" = "$after" ] || bad="$bad; ublk devices $before -> $after after bad input"
    # a busy device refuses --reset, keeps serving, and resets once free
    if uzram_setup lz4 128M; then
        dev=$UZRAM_DEV
        "$TOOL" write "$dev" 0 1048576 "$SEED" >>"$log" 2>&1 || bad="$bad; writing 1 MiB failed"
        mkswap "$dev" >>"$log" 2>&1 && swapon "$dev" >>"$log" 2>&1
        out=$("$UZRAM_BIN" --reset "$dev" 2>&1) && bad="$bad; reset of a swap device succeeded"
        echo "reset while swap: $out" >>"$log"
        echo "$out" | grep -q swap || bad="$bad; reset-while-swap message '$out'"
        swapoff "$dev" >>"$log" 2>&1
        mke2fs -q -t ext4 "$dev" >>"$log" 2>&1 || bad="$bad; mke2fs right after swapoff failed"
        mkdir -p /mnt/bi && mount "$dev" /mnt/bi >>"$log" 2>&1
        out=$("$UZRAM_BIN" --reset "$dev" 2>&1) && bad="$bad; reset of a mounted device succeeded"
        echo "reset while mounted: $out" >>"$log"
        echo "$out" | grep -q mounted || bad="$bad; reset-while-mounted message '$out'"
        echo data >/mnt/bi/f && sync && umount /mnt/bi
        [ -b "$dev" ] || bad="$bad; the busy device vanished"
        uzram_reset
        [ -b "$dev" ] && bad="$bad; reset of the free device did not delete it"
    fi
    if [ -n "$bad" ]; then
        fail_log "$name" "$log" "${bad#; }"
        return
    fi
    pass "$name" "9 bad command lines exit 1 with a message and create nothing; --find alone names the next free device; --reset refused while swap and while mounted, done once free"
}

# check_swapoffmkfs: `swapoff && mkfs.ext4 && mount`, UZRAM_VM_SWAPOFF_RUNS times (20), mke2fs
# right after the swapoff or 0.3, 0.7 or 1.2 s later (while the daemon may be freeing the swap
# area's old pages): the daemon holds no claim meanwhile, so mke2fs never finds the device
# busy, and frees nothing a new user wrote: each round's file system passes e2fsck and its file
# reads back 3 s later (after any freeing), and the program whose pages were in swap (read
# back in by the swapoff) verifies them.
check_swapoffmkfs() {
    local name=swapoffmkfs log=$UZ_TMP/swapoffmkfs.log dev bad= r pid runs=${UZRAM_VM_SWAPOFF_RUNS:-20} delay
    note "$name: swapoff && mkfs.ext4 && mount, $runs rounds"
    uzram_setup lz4 128M || return
    dev=$UZRAM_DEV
    : >"$log"
    mkdir -p /mnt/som
    for r in $(seq 1 "$runs"); do
        delay=$(echo "0 0.3 0.7 1.2" | cut -d' ' -f$((r % 4 + 1)))
        { mkswap "$dev" && swapon "$dev"; } >>"$log" 2>&1 || { bad="round $r: mkswap or swapon failed"; break; }
        "$TOOL" swaphold 16 $((SEED + r)) >"$log.p" 2>&1 &
        pid=$!
        if ! held_or_gone "$log.p" $pid 60; then
            cat "$log.p" >>"$log"
            kill "$pid"
            wait "$pid"
            swapoff "$dev"
            bad="round $r: the program never got its pages out"
            break
        fi
        if ! { swapoff "$dev" && sleep "$delay" && mke2fs -q -F -t ext4 "$dev" && mount "$dev" /mnt/som; } >>"$log" 2>&1; then
            kill "$pid"
            wait "$pid"
            swapoff "$dev" 2>/dev/null
            bad="round $r: swapoff, ${delay}s, mke2fs -t ext4, mount failed: $(tail -2 "$log" | tr '\n' ' ')"
            break
        fi
        echo "round $r" >/mnt/som/f && sync && umount /mnt/som
        sleep 3
        e2fsck -fn "$dev" >>"$log" 2>&1 || bad="round $r: e2fsck found the file system damaged"
        if mount "$dev" /mnt/som; then
            grep -qx "round $r" /mnt/som/f || bad="${bad:+$bad; }round $r: the file did not read back"
            umount /mnt/som
        else
            bad="${bad:+$bad; }round $r: the file system did not mount again"
        fi
        kill -USR1 "$pid"
        wait "$pid" || bad="${bad:+$bad; }round $r: the program found bad pages: $(tail -1 "$log.p")"
        cat "$log.p" >>"$log"
        [ -n "$bad" ] && break
    done
    uzram_reset
    if [ -n "$bad" ]; then
        fail_log "$name" "$log" "$bad"
        return
    fi
    pass "$name" "$runs rounds of swapoff, 0-1.2 s, mke2fs -t ext4 and mount with a program's pages in swap: none busy, each file system clean by e2fsck and its file read back 3 s later, every page verified"
}

# check_sigterm: SIGTERM to the daemon deletes its device and socket.
check_sigterm() {
    local name=sigterm log=$UZ_TMP/sigterm.log pid id i
    note "$name: SIGTERM to the daemon"
    uzram_setup lz4 64M || return
    id=${UZRAM_DEV#/dev/ublkb}
    pid=$("$UZRAM_BIN" --raw --noheadings -o PID "$UZRAM_DEV" 2>"$log")
    kill -TERM "$pid"
    # the process too: it ends by closing the slot-free probe's link, and the kernel waits for
    # an RCU-tasks grace period to take the program off the function (a fraction of a second)
    for i in $(seq 1 100); do
        [ -e /sys/class/ublk-char/ublkc$id ] || [ -e /run/uzram/ublkb$id.sock ] ||
            kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if [ -e /sys/class/ublk-char/ublkc$id ] || [ -e /run/uzram/ublkb$id.sock ] || kill -0 "$pid" 2>/dev/null; then
        fail_log "$name" "$log" "after SIGTERM to $pid: device, socket or daemon still there"
        return
    fi
    UZRAM_DEV=
    pass "$name" "daemon $pid exited, /dev/ublkb$id and its socket gone in $((i / 10)).$((i % 10)) s"
}

# check_kill: SIGKILL to the whole daemon (its supervisor and its worker) under I/O. With no one
# left to take the device over, its I/O waits (user recovery holds it for a successor); the
# listing says dead, --reset deletes it, the writer then gets errors (no hang), and the same id
# can be created again.
check_kill() {
    local name=kill log=$UZ_TMP/kill.log pid sup id i wpid rc out dev
    note "$name: SIGKILL to the daemon (supervisor and worker) under I/O"
    uzram_setup lz4 256M || return
    dev=$UZRAM_DEV id=${dev#/dev/ublkb}
    pid=$("$UZRAM_BIN" --raw --noheadings -o PID "$dev" 2>"$log")
    sup=$(awk '$1 == "PPid:" { print $2 }' /proc/"$pid"/status)
    echo "worker $pid, supervisor $sup ($(cat /proc/"$sup"/comm 2>/dev/null))" >>"$log"
    fio --name=w --filename="$dev" --direct=1 --ioengine=libaio --iodepth=16 --rw=randwrite --bs=4k \
        --time_based --runtime=60 --buffer_compress_percentage=50 >>"$log" 2>&1 &
    wpid=$!
    sleep 3
    kill -KILL "$sup" "$pid"
    sleep 2
    out=$("$UZRAM_BIN" --raw --noheadings -o NAME,STATE 2>>"$log")
    echo "listing: $out" >>"$log"
    if ! echo "$out" | grep -q "^$dev dead$"; then
        kill -KILL $wpid
        fail_log "$name" "$log" "the listing does not show $dev dead: '$out'"
        return
    fi
    if ! "$UZRAM_BIN" --reset "$dev" >>"$log" 2>&1 || [ -e /sys/class/ublk-char/ublkc$id ]; then
        kill -KILL $wpid
        fail_log "$name" "$log" "uzram --reset of the dead $dev failed"
        return
    fi
    for i in $(seq 1 300); do
        kill -0 $wpid 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 $wpid 2>/dev/null; then
        kill -KILL $wpid
        fail_log "$name" "$log" "the writer still runs 30 s after the dead device was reset (I/O hangs)"
        return
    fi
    wait $wpid
    rc=$?
    echo "fio exit $rc" >>"$log"
    UZRAM_DEV=$(UZRAM_PROGRESS_SECS=5 "$UZRAM_BIN" --size 64M "$dev" --log "$UZRAM_LOG" 2>>"$log")
    if [ "$UZRAM_DEV" != "$dev" ] || ! "$TOOL" write "$dev" 0 1048576 "$SEED" >>"$log" 2>&1 ||
        ! "$TOOL" verify "$dev" 0 1048576 "$SEED" >>"$log" 2>&1; then
        fail_log "$name" "$log" "re-creating $dev after the reset failed ('$UZRAM_DEV')"
        return
    fi
    uzram_reset
    pass "$name" "listed dead with its I/O held; --reset removed it and the writer ended (fio exit $rc) $((i / 10)).$((i % 10)) s later; $dev re-created and verified"
}

# check_recover KILLS: swap on uzram under pressure (vmtool swapfill of 2x MemAvailable, every
# page verified on the way back); while the program's pages are out in swap, SIGKILL to the
# worker (the listing's PID) KILLS times, 2 s of the program running between two. Each time the
# supervisor hands the device to a successor that adopts its pages and takes it over (its I/O
# held meanwhile): the program must finish with every page verified, no process may be killed,
# and the device must count KILLS restarts. The program is stopped (SIGSTOP) for each kill and
# continued once a successor serves: a kill in the middle of its fill storm, with every task
# waiting on the device, can stall the kernel's side of the takeover (see ARCHITECTURE.md,
# "Surviving the daemon"); UZRAM_VM_RECOVER_STORM=1 kills without stopping it.
check_recover() {
    local kills=$1 name=recover$1 log=$UZ_TMP/recover$1.log dev swapsize avail fill tpid o0 i k pid
    local rc oom0 oom1 times worst wfail cg probe freed
    note "$name: SIGKILL to the worker $kills time(s) while swap holds 2x RAM"
    swapsize=$((($(meminfo_kb MemTotal) / 1024 * 2 + 1023) / 1024 * 1024))M
    # The daemon in a cgroup that is never swapped (as the systemd unit puts it): while no
    # worker maps the device's region its pages are not locked, and swapped out to the device
    # itself they would wait for the successor that reads them.
    cg=$(noswap_cgroup)
    if [ -z "$cg" ]; then
        fail "$name" "no memory cgroup with memory.swap.max here: cannot run uzram as its unit would"
        return
    fi
    echo $$ >"$cg/cgroup.procs"
    uzram_setup lz4 $swapsize
    rc=$?
    echo $$ >/sys/fs/cgroup/cgroup.procs
    [ $rc = 0 ] || return
    dev=$UZRAM_DEV
    grep -q 'lets its memory be swapped' "$UZRAM_LOG" && note "$name: $(grep 'lets its memory be swapped' "$UZRAM_LOG" | tail -n 1)"
    : >"$log"
    swap_begin "$dev" --discard=pages || return
    fill=$((avail * 2))
    oom0=$(dmesg | grep -c -e 'Killed process' -e 'SIGBUS')
    o0=$(vmstat_val pswpout)
    "$TOOL" swapfill $fill "$SEED" 3 >>"$log" 2>&1 &
    tpid=$!
    quarter_out $tpid
    k=0
    while [ $k -lt "$kills" ] && kill -0 $tpid 2>/dev/null; do
        pid=$("$UZRAM_BIN" --raw --noheadings -o PID "$dev" 2>>"$log")
        if [ "${UZRAM_VM_RECOVER_STORM:-0}" != 1 ]; then
            kill -STOP $tpid
            sleep 1
        fi
        kill -KILL "$pid"
        k=$((k + 1))
        for i in $(seq 1 600); do
            [ "$(uzram_stat_field "$dev" restarts)" = "$k" ] && break
            sleep 0.1
        done
        kill -CONT $tpid
        if [ "$(uzram_stat_field "$dev" restarts)" != "$k" ]; then
            kill -KILL $tpid
            swapoff "$dev" 2>/dev/null
            fail_log "$name" "$log" "no successor served $dev 60 s after SIGKILL $k to worker $pid: $(tail -n 3 "$UZRAM_LOG" | tr '\n' ' ')"
            return
        fi
        echo "kill $k: worker $pid; now $("$UZRAM_BIN" attr "$dev" uzram_stat | grep restart | tr '\n' ' ')" >>"$log"
        sleep 2
    done
    wait $tpid
    rc=$?
    grep '^vmtool' "$log" | sed 's/^/VM: /'
    oom1=$(dmesg | grep -c -e 'Killed process' -e 'SIGBUS')
    wfail=$(dev_failed_writes "$dev")
    times=$(grep -o '[0-9]* ms after the last one ended' "$UZRAM_LOG" | tail -n "$k" | awk '{ print $1 }' | tr '\n' ' ')
    worst=$(echo "$times" | tr ' ' '\n' | sort -n | tail -n 1)
    echo "restart times (ms): $times; failed writes $wfail" >>"$log"
    # the last successor's slot-free mode: the probe its supervisor holds, and what it freed
    probe=$("$UZRAM_BIN" attr "$dev" uzram_stat | awk '$1 == "slot_free_probe" { print $2 }')
    freed=$("$UZRAM_BIN" attr "$dev" uzram_stat | awk '$1 == "slot_free_freed" { print $2 }')
    swapoff "$dev" >>"$log" 2>&1
    SWAP_DEV=
    if [ $rc != 0 ]; then
        [ $rc -gt 128 ] && dmesg | tail -n 15 >>"$log"
        fail_log "$name" "$log" "vmtool swapfill $fill MiB exited $rc after $k kill(s) (1: data mismatch, >128: killed)"
        return
    fi
    if [ "${UZRAM_VM_SLOT_FREE:-probe}" = probe ] && [ "$probe" != 1 ]; then
        fail_log "$name" "$log" "the successor frees only what swap discards (slot_free_probe '$probe'): it should have its supervisor's probe"
        return
    fi
    if [ "$oom1" != "$oom0" ]; then
        dmesg | grep -e 'Killed process' -e 'SIGBUS' | tail -n 5 >>"$log"
        fail_log "$name" "$log" "a process was killed while the worker restarted"
        return
    fi
    if [ $k -lt "$kills" ]; then
        fail_log "$name" "$log" "the program finished after $k of $kills kills: too little to prove anything"
        return
    fi
    uzram_reset
    pass "$name" "$fill MiB (2x MemAvailable) through swap, worker killed $k time(s) while it ran: every page verified, no process killed, restarts $k, time from the death to serving again: $times ms (worst $worst), failed writes $wfail; the successor's slot-free probe ${probe:-?} ($freed pages freed by it)"
}

# check_upgrade: `uzram upgrade` during a fio verify job (qd32, 2 jobs). The device is started
# from a copy of the binary on tmpfs, which is then replaced as a package upgrade replaces it (a
# new file renamed over the old path); `uzram upgrade` must hand the device to a worker running
# the new file while fio writes, and fio must end with 0 I/O errors and 0 verify mismatches.
check_upgrade() {
    local name=upgrade log=$UZ_TMP/upgrade.log bin=$UZ_TMP/uzram-installed dev pid0 pid1 fpid
    local rc frc out t0 ino1 ino2
    note "$name: uzram upgrade during fio verify (qd32, 2 jobs)"
    uzram_reset
    : >"$log"
    cp "$UZRAM_BIN" "$bin" || { fail_log "$name" "$log" "cannot copy $UZRAM_BIN"; return; }
    UZRAM_DEV=$(UZRAM_PROGRESS_SECS=5 "$bin" --find --size 512M --algorithm lz4 --slot-free discard \
        --log "$UZRAM_LOG" 2>>"$log")
    dev=$UZRAM_DEV
    if [ ! -b "$dev" ]; then
        UZRAM_DEV=
        fail_log "$name" "$log" "$bin --find failed: $dev"
        return
    fi
    pid0=$("$bin" --raw --noheadings -o PID "$dev" 2>>"$log")
    fio --name=v --filename="$dev" --direct=1 --ioengine=libaio --iodepth=32 --numjobs=2 \
        --size=192M --offset_increment=192M --rw=randwrite --bs=4k --verify=crc32c \
        --verify_fatal=1 --buffer_compress_percentage=50 >"$log.fio" 2>&1 &
    fpid=$!
    sleep 2
    cp "$UZRAM_BIN" "$bin.new" && mv "$bin.new" "$bin"
    ino1=$(stat -c %i "$bin")
    t0=$(uptime_s)
    out=$("$bin" upgrade "$dev" 2>&1)
    rc=$?
    echo "uzram upgrade: exit $rc in $(elapsed "$t0") s: $out" >>"$log"
    wait $fpid
    frc=$?
    cat "$log.fio" >>"$log"
    pid1=$("$bin" --raw --noheadings -o PID "$dev" 2>>"$log")
    ino2=$(stat -L -c %i /proc/"$pid1"/exe 2>/dev/null)
    if [ $rc != 0 ]; then
        fail_log "$name" "$log" "uzram upgrade $dev exited $rc: $out"
        return
    fi
    if [ $frc != 0 ] || grep -q 'err= *[1-9]' "$log.fio"; then
        fail_log "$name" "$log" "fio exited $frc across the upgrade (I/O errors or verify mismatches)"
        return
    fi
    if [ "$pid1" = "$pid0" ] || [ "$ino2" != "$ino1" ]; then
        fail_log "$name" "$log" "the worker after the upgrade ($pid1, inode $ino2) is not a new one running the new file (inode $ino1; before: $pid0)"
        return
    fi
    if [ "$(uzram_stat_field "$dev" last_restart)" != upgrade ]; then
        fail_log "$name" "$log" "last_restart is $(uzram_stat_field "$dev" last_restart), not upgrade"
        return
    fi
    pass "$name" "worker $pid0 handed $dev to $pid1 (the new file) in $(elapsed "$t0") s while fio wrote and verified (2 jobs, qd32): fio exit 0, no I/O error, no mismatch; $(grep -o 'serves it again, [0-9]* ms after the last one ended' "$UZRAM_LOG" | tail -n 1)"
}

# check_corrupt: a state corrupted on purpose. 8 MiB of random bytes written to a fresh device
# and read back; fio reading it (random 4 KiB reads, 8 in flight); one bit of the header of the
# device's memory region (the memfd its supervisor holds, opened through /proc/SUPERVISOR/fd)
# flipped; the worker killed. The successor must refuse the region and say why, and the
# supervisor delete the device: the reads held meanwhile must fail with EIO, and a descriptor
# opened before must read no byte.
check_corrupt() {
    local name=corrupt log=$UZ_TMP/corrupt.log dev pid sup f fd v err i fpid frc r0
    note "$name: a bit of the device's memory region flipped, then the worker killed"
    uzram_setup lz4 64M || return
    dev=$UZRAM_DEV
    : >"$log"
    head -c 8388608 /dev/urandom >"$UZ_TMP/corrupt.in"
    dd if="$UZ_TMP/corrupt.in" of="$dev" bs=1M oflag=direct 2>>"$log" &&
        dd if="$dev" of="$UZ_TMP/corrupt.out" bs=1M count=8 iflag=direct 2>>"$log" &&
        cmp "$UZ_TMP/corrupt.in" "$UZ_TMP/corrupt.out" >>"$log" 2>&1 || {
        fail_log "$name" "$log" "8 MiB written to $dev did not read back the same"
        return
    }
    pid=$("$UZRAM_BIN" --raw --noheadings -o PID "$dev" 2>>"$log")
    sup=$(awk '$1 == "PPid:" { print $2 }' /proc/"$pid"/status)
    fd=
    for f in /proc/"$sup"/fd/*; do
        case $(readlink "$f") in /memfd:uzram*) fd=$f ;; esac
    done
    if [ -z "$fd" ]; then
        fail_log "$name" "$log" "supervisor $sup of worker $pid holds no memfd: $(ls -l /proc/"$sup"/fd | tr '\n' ' ')"
        return
    fi
    echo "before fio: $(ls -l "$dev" 2>&1); supervisor $sup holds $(ls -l /proc/"$sup"/fd | grep -c memfd) memfd(s), chosen $fd -> $(readlink "$fd")" >>"$log"
    if [ ! -b "$dev" ]; then
        fail_log "$name" "$log" "$dev is not a block device before the kill"
        return
    fi
    exec 3<"$dev"
    # fio must be reading the device before the flip: under emulation it can take seconds to
    # start, and one that opens the path after the device is deleted would make a plain file
    # there (allow_file_create=0 forbids that).
    r0=$(awk '{ print $1 }' /sys/block/"${dev#/dev/}"/stat)
    fio --name=r --filename="$dev" --direct=1 --ioengine=libaio --iodepth=8 --rw=randread \
        --bs=4k --size=8M --time_based --runtime=60 --allow_file_create=0 >"$log.fio" 2>&1 &
    fpid=$!
    for i in $(seq 1 300); do
        [ "$(awk '{ print $1 }' /sys/block/"${dev#/dev/}"/stat 2>/dev/null || echo 0)" -gt $((r0 + 64)) ] && break
        kill -0 $fpid 2>/dev/null || break
        sleep 0.1
    done
    echo "fio read $(($(awk '{ print $1 }' /sys/block/"${dev#/dev/}"/stat) - r0)) requests before the flip ($i polls)" >>"$log"
    # header word 4 (the arena count): covered by the header's checksum
    v=$(dd if="$fd" bs=1 skip=32 count=1 2>/dev/null | od -An -tu1 | tr -d ' ')
    printf "\\$(printf %o $((v ^ 1)))" | dd of="$fd" bs=1 seek=32 count=1 conv=notrunc 2>>"$log"
    echo "flipped bit 0 of byte 32 of $fd (was $v)" >>"$log"
    kill -KILL "$pid"
    for i in $(seq 1 600); do
        [ -b "$dev" ] || break
        sleep 0.1
    done
    for i in $(seq 1 100); do
        kill -0 $fpid 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL $fpid 2>/dev/null
    wait $fpid
    frc=$?
    cat "$log.fio" >>"$log"
    err=$(dd bs=4096 count=1 iflag=direct of="$UZ_TMP/corrupt.got" <&3 2>&1)
    exec 3<&-
    echo "read through the descriptor opened before: $err" >>"$log"
    UZRAM_DEV=
    if [ -b "$dev" ]; then
        fail_log "$name" "$log" "$dev still there 60 s after its worker was killed with its region corrupted"
        return
    fi
    if [ $frc = 0 ] || ! grep -q 'Input/output error' "$log.fio"; then
        echo "the daemons' last lines:" >>"$log"
        tail -n 12 "$UZRAM_LOG" >>"$log" 2>&1
        fail_log "$name" "$log" "fio's reads across the refusal did not fail with EIO (fio exit $frc)"
        return
    fi
    if [ -s "$UZ_TMP/corrupt.got" ]; then
        fail_log "$name" "$log" "a descriptor opened before read bytes of the deleted $dev: $err"
        return
    fi
    if ! grep -q "checksum" "$UZRAM_LOG"; then
        fail_log "$name" "$log" "the log does not say why the region was refused: $(tail -n 3 "$UZRAM_LOG" | tr '\n' ' ')"
        return
    fi
    pass "$name" "$(grep -o 'not restarting its worker.*' "$UZRAM_LOG" | tail -n 1); fio's held reads: $(grep -o 'Input/output error[^,]*' "$log.fio" | head -n 1) (fio exit $frc); a descriptor opened before reads no byte"
}

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

# check_setup: `uzram setup --config` turns a zram-generator.conf into swap with its priority and
# algorithm, again changes nothing, and `uzram teardown` removes it.
check_setup() {
    local name=setup log=$UZ_TMP/setup.log conf=$UZ_TMP/zram-generator.conf line again
    note "$name: uzram setup from a zram-generator.conf"
    uzram_reset
    printf '[zram3]\nzram-size = 96\ncompression-algorithm = zstd lz4\nswap-priority = 42\n' >"$conf"
    : >"$log"
    "$UZRAM_BIN" setup --dry-run --config "$conf" >>"$log" 2>&1
    if ! "$UZRAM_BIN" setup --config "$conf" >>"$log" 2>&1; then
        fail_log "$name" "$log" "uzram setup failed"
        return
    fi
    line=$(awk '$1 == "/dev/ublkb3" { print $2, $5 }' /proc/swaps)
    echo "/proc/swaps: $line; comp_algorithm $("$UZRAM_BIN" attr /dev/ublkb3 comp_algorithm); recomp $("$UZRAM_BIN" attr /dev/ublkb3 recomp_algorithm)" >>"$log"
    local bad=
    [ "$line" = "partition 42" ] || bad="$bad; /proc/swaps says '$line' for /dev/ublkb3, not 'partition 42'"
    "$UZRAM_BIN" attr /dev/ublkb3 comp_algorithm | grep -q '\[zstd\]' || bad="$bad; not zstd"
    "$UZRAM_BIN" attr /dev/ublkb3 recomp_algorithm | grep -q '#1: \[lz4\]' || bad="$bad; no lz4 recompression"
    [ "$("$UZRAM_BIN" attr /dev/ublkb3 disksize)" = $((96 * 1048576)) ] || bad="$bad; disksize"
    again=$("$UZRAM_BIN" setup --config "$conf" 2>>"$log")
    echo "again: $again" >>"$log"
    echo "$again" | grep -q 'exists, swap already on' || bad="$bad; a second setup did something: '$again'"
    [ "$(ls /sys/class/ublk-char | wc -l)" = 1 ] || bad="$bad; $(ls /sys/class/ublk-char | wc -l) ublk devices after two setups"
    "$UZRAM_BIN" teardown --config "$conf" >>"$log" 2>&1 || bad="$bad; teardown failed"
    grep -q '^/dev/ublkb3 ' /proc/swaps && bad="$bad; still swap after teardown"
    [ -e /sys/class/ublk-char/ublkc3 ] && bad="$bad; device still there after teardown"
    if [ -n "$bad" ]; then
        fail_log "$name" "$log" "${bad#; }"
        return
    fi
    pass "$name" "zram-generator.conf [zram3] -> /dev/ublkb3: swap at priority 42, zstd with lz4 recompression, 96 MiB; setup twice is idempotent; teardown removes it"
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
# program that fills 2x MemAvailable and verifies every page twice. zram can only fail the writes
# past its limit (io_stat failed_writes, "Write-error on swap-device"; it writes back only when
# told to). uzram evicts cold pages to the guest's disk (/dev/vda, its backing device) instead: the
# program must complete, verified, with at most a handful of failed writes, and policy_stat must show the evictions,
# the watermark writeback and the idle recompression.
check_tier() {
    local name=tier log=$UZ_TMP/tier.log lim=48 size avail fill rc zrc=skipped zfail=0 zerr=0 e0
    local dev io fw ps bd used_max wm ev rp bad= t0 zline
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
        avail=$(($(meminfo_kb MemAvailable) / 1024)) fill=$((avail * 2))
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
    avail=$(($(meminfo_kb MemAvailable) / 1024)) fill=$((avail * 2))
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
    [ $rc = 0 ] || bad="$bad; vmtool swapfill $fill MiB exited $rc on uzram (1: data mismatch, >128: killed)"
    # zram fails millions; uzram may fail a rare write whose store found no room after 8
    # eviction rounds (seen in four runs: 6, 1, 1, 4 of about 200k requests; swap retries them)
    [ "$fw" -le 16 ] || bad="$bad; $fw failed writes on uzram"
    [ $((wm + ev)) -gt 0 ] || bad="$bad; nothing was written back (watermark $wm, evicted $ev)"
    [ "$rp" -gt 0 ] || bad="$bad; nothing was recompressed"
    [ "$used_max" -le $((lim << 20)) ] || bad="$bad; mem_used_max $(mib "$used_max") passed the ${lim}M limit"
    if [ "$zrc" != skipped ] && [ "$zfail" = 0 ] && [ "$zerr" = 0 ] && [ "$zrc" = 0 ]; then
        bad="$bad; kernel zram with the same limit did not fail: the check proves nothing (limit too generous?)"
    fi
    if [ -n "$bad" ]; then
        fail_log "$name" "$log" "${bad#; }"
        return
    fi
    pass "$name" "mem_limit ${lim}M: $fill MiB (2x MemAvailable) verified twice on uzram with $fw failed writes, watermark writeback $wm pages, evicted $ev, recompressed $rp, bd_stat $(echo $bd), peak mem_used $(mib "$used_max"); kernel zram with the same limit: exit $zrc, $zfail failed writes, $zerr write-error lines; $(elapsed "$t0")s"
}

# quarter_out PID: waits (up to 10 min) until a quarter of $fill MiB went out to swap since
# $o0 (pswpout then), or program PID ended.
quarter_out() {
    for _i in $(seq 1 1200); do
        [ $(($(vmstat_val pswpout) - o0)) -ge $((fill * 64)) ] && break
        kill -0 "$1" 2>/dev/null || break
        sleep 0.5
    done
}

# swap_begin DEV [SWAPON-OPTION]: mkswap and swapon DEV at the highest priority for a check
# (its $name and $log), caches dropped; sets SWAP_DEV and avail (MemAvailable in MiB, or
# SWAP_AVAIL_MIB). Fails the check and returns 1 when it cannot.
swap_begin() {
    if ! mkswap "$1" >>"$log" 2>&1 || ! swapon ${2:+"$2"} -p 32767 "$1" >>"$log" 2>&1; then
        fail_log "$name" "$log" "mkswap/swapon failed"
        return 1
    fi
    SWAP_DEV=$1
    sync
    echo 3 >/proc/sys/vm/drop_caches
    avail=${SWAP_AVAIL_MIB:-$(($(meminfo_kb MemAvailable) / 1024))}
}

# check_sleep DEV PREFIX: the system's sleep with swap on DEV under pressure (issue 17). A
# program (in a cgroup of its own, as systemd puts every process) holds 1.3x MemAvailable through
# swap and keeps verifying it (swap-ins and outs all along); meanwhile the kernel's freezer test
# (pm_test=freezer: every task frozen, 5 s, thawed) of suspend-to-idle ("freeze") 3 times and,
# on kernel zram, of hibernation ("disk", which also preallocates the image by reclaim). On uzram
# the sleep hook runs around each, as uzram's units do around systemd's: before hibernation it
# must refuse (the pages cannot come back), so hibernation is not tried (with swap on uzram it
# hangs: the preallocation's swap writes wait for a frozen daemon). Then a lighter program (a
# quarter of MemAvailable, pushed out to swap): the hook swaps uzram off, the hibernation freezer
# test runs, the hook swaps it on again, and the program's pages verify.
# UZRAM_VM_SLEEP_HOOK=0: uzram without the hook (3 freezes only; the "before" figures).
# Why the freezer test here: a real sleep suspends the devices, and virtio-9p, which brings the
# tools from the host, has no restore (Linux's p9_virtio_drv has no freeze/restore). The real
# ones run last, from copies in RAM: check_hibernate and check_rtcwake (suspend to RAM; a real
# suspend-to-idle, `rtcwake -m freeze -s 3`, never woke the QEMU guest: tried 2026-12-03).
check_sleep() {
    local dev=$1 name=${2}sleep log=$UZ_TMP/${2}sleep.log avail fill tpid o0 i rc st n0 res= bad=
    local hook=0 cg round out hold hpid
    case $dev in /dev/ublkb*) [ "${UZRAM_VM_SLEEP_HOOK:-1}" = 1 ] && hook=1 ;; esac
    if [ "$UZRAM_VM_MODE" = host ] && [ "${UZRAM_VM_HOST_SLEEP:-0}" != 1 ]; then
        skip "$name" "not on a host unless UZRAM_VM_HOST_SLEEP=1 (it would freeze this machine's tasks)"
        return
    fi
    if [ ! -w /sys/power/state ] || [ ! -w /sys/power/pm_test ]; then
        skip "$name" "no /sys/power/pm_test here (CONFIG_PM_DEBUG)"
        return
    fi
    cg=$(workload_cgroup)
    if [ -z "$cg" ]; then
        skip "$name" "no cgroup v2 here to run the program in"
        return
    fi
    note "$name: freezer tests with swap on $dev under pressure (sleep hook: $hook)"
    : >"$log"
    # the power code's messages on the console (which phase a sleep is in), 10 s to freeze
    _printk=$(cut -f1 /proc/sys/kernel/printk) _freeze_ms=$(cat /sys/power/pm_freeze_timeout)
    echo 1 >/sys/power/pm_debug_messages 2>/dev/null
    echo 10000 >/sys/power/pm_freeze_timeout 2>/dev/null
    echo 7 >/proc/sys/kernel/printk
    swap_begin "$dev" || return
    fill_start 13 8
    for round in 1 2 3; do
        sleep_test freeze suspend
    done
    if [ $hook = 1 ]; then
        sleep_hook pre hibernate
        if [ $rc = 0 ]; then
            bad="$bad hibernate-not-refused"
            res="$res hibernation: the hook did not refuse ($out);"
            sleep_hook post hibernate
        else
            res="$res hibernation refused by the hook (exit $rc: ${out#*hibernation refused: }"
            res="${res%%; swap on uzram must*});"
        fi
    else
        case $dev in
        /dev/zram*)
            # kernel zram's hibernation, for reference: its failure is the kernel's, not a
            # failure of this check
            sleep_test disk hibernate
            bad=${bad% disk}
            ;;
        esac
    fi
    # a program that has not finished 3 minutes on (its passes take about 10 s each), said on
    # the console: where its threads wait
    (
        sleep 60
        while sleep 120 && kill -0 $tpid 2>/dev/null; do
            for t in /proc/$tpid/task/*; do
                note "$name: vmtool thread ${t##*/}: $(grep State "$t/status") wchan $(cat "$t/wchan") $(tr '\n' ' ' <"$t/stack" 2>/dev/null | cut -c1-300)"
            done
            note "$name: $cg: $(tr '\n' ' ' <"$cg/cgroup.events") freeze $(cat "$cg/cgroup.freeze")"
        done
    ) &
    i=$!
    wait $tpid
    rc=$?
    kill $i 2>/dev/null
    grep '^vmtool' "$log" | sed 's/^/VM: /'
    if [ $rc != 0 ]; then
        sleep_fail "vmtool swapfill $fill MiB exited $rc (1: data mismatch, >128: killed);$res"
        return
    fi
    # The hibernation a hook lets through: a light program, its pages out in swap, and disk swap
    # (the scratch disk, at a lower priority) for the image's preallocation to write to
    if [ $hook = 1 ]; then
        if [ -b /dev/vda ] && ! grep -q '^/dev/vda ' /proc/mounts && mkswap /dev/vda >>"$log" 2>&1 &&
            swapon -p 0 /dev/vda >>"$log" 2>&1; then
            res="$res disk swap on /dev/vda;"
        fi
        hold=$((avail / 4))
        hold_start $((SEED + 7))
        if ! grep -q 'held' "$log.hold"; then
            kill -KILL $hpid 2>/dev/null
            wait $hpid
            cat "$log.hold" >>"$log"
            sleep_fail "the light program ($hold MiB) did not hold its pages in swap within 300 s ($(tail -1 "$log.hold"));$res"
            return
        fi
        sleep_test disk hibernate
        grep -q "^$dev " /proc/swaps || { bad="$bad swap-not-back"; res="$res swap on $dev not back after the hook's post;"; }
        kill -USR1 $hpid
        wait $hpid
        rc=$?
        cat "$log.hold" >>"$log"
        if [ $rc != 0 ]; then
            sleep_fail "the light program's $hold MiB did not verify after the hibernation test (exit $rc);$res"
            return
        fi
        res="$res $hold MiB held in swap verified after;"
    fi
    sleep_restore
    swapoff "$dev" >>"$log" 2>&1
    SWAP_DEV=
    echo "result:$res" >>"$log"
    if [ -n "$bad" ]; then
        fail_log "$name" "$log" "$fill MiB through swap, all pages verified, but:$bad:$res"
        return
    fi
    pass "$name" "$fill MiB (1.3x MemAvailable) through swap, all pages verified, while:$res"
}

# sleep_restore (for check_sleep): the console's level and the power code's settings as before.
sleep_restore() {
    echo "$_printk" >/proc/sys/kernel/printk
    echo 0 >/sys/power/pm_debug_messages 2>/dev/null
    echo "$_freeze_ms" >/sys/power/pm_freeze_timeout 2>/dev/null
    grep -q '^/dev/vda ' /proc/swaps && swapoff /dev/vda >>"$log" 2>&1
}

# sleep_fail REASON (for check_sleep): settings restored, the device's swap off, the check failed.
sleep_fail() {
    sleep_restore
    swapoff "$dev" >>"$log" 2>&1
    SWAP_DEV=
    fail_log "$name" "$log" "$1"
}

# sleep_hook PHASE ACTION: `uzram sleep PHASE ACTION`, as uzram's units run it; its output and exit
# in $out and $rc, in $log and on the console.
sleep_hook() {
    out=$("$UZRAM_BIN" sleep "$1" "$2" 2>&1)
    rc=$?
    echo "hook $1 $2: exit $rc: $out" >>"$log"
    note "$name: hook $1 $2: exit $rc: $(echo "$out" | tr '\n' ' ')"
}

# fill_start TENTHS PASSES (for check_sleep and check_rtcwake): the heavy program, vmtool swapfill
# of TENTHS/10 of $avail MiB verified PASSES times, in cgroup $cg, its output in $log; sets fill
# and tpid. Returns once a quarter of it is out in swap.
fill_start() {
    fill=$((avail * $1 / 10))
    o0=$(vmstat_val pswpout)
    in_cgroup "$cg" "$TOOL" swapfill $fill "$SEED" "$2" >>"$log" 2>&1 &
    tpid=$!
    quarter_out $tpid
}

# hold_start SEED (for check_sleep and check_hibernate): the light program, vmtool swaphold of
# $hold MiB in cgroup $cg, its output in $log.hold; sets hpid. Returns once it holds (its pages
# pushed out) or is gone, at most 300 s: a signal before it holds would kill it (exit 138 in one
# run, after two refused suspends left memory starved).
hold_start() {
    in_cgroup "$cg" "$TOOL" swaphold $hold "$1" >"$log.hold" 2>&1 &
    hpid=$!
    held_or_gone "$log.hold" $hpid 300
}

# held_or_gone OUT PID SECS: waits up to SECS for vmtool swaphold (PID, its output in OUT) to
# say it holds its pages (pushed out), or to be gone; whether it holds.
held_or_gone() {
    local _i
    for _i in $(seq 1 $(($3 * 5))); do
        grep -q held "$1" && return 0
        kill -0 "$2" 2>/dev/null || break
        sleep 0.2
    done
    grep -q held "$1"
}

# since_mark TEXT: the lines of stdin (dmesg) after the last one that holds TEXT.
since_mark() {
    awk -v m="$1" 'index($0, m) { n = 0; delete l; next } { l[++n] = $0 } END { for (i = 1; i <= n; i++) print l[i] }'
}

# check_rtcwake DEV PREFIX: a real suspend with swap on DEV under pressure (issue 17): a program
# (in a cgroup of its own) uses 1.5x MemAvailable through swap and verifies it all along; once a
# quarter of it is out, `rtcwake -m mem -s 3` suspends the guest to RAM and the RTC's alarm wakes
# it (under QEMU the alarm does not wake a suspended-to-idle guest, so `-m mem`, where the guest
# offers it), with uzram's sleep hook around it; the program must finish with every page
# verified, and no task may hang (the hung-task panic would end the run). Guest only, after the
# other checks: devices are suspended, and the host's root is gone after (see hib_tools).
check_rtcwake() {
    local dev=$1 name=${2}rtcwake log=$UZ_TMP/${2}rtcwake.log hook=0 cg avail fill tpid o0
    local out rc prc n0 t0 res= bad=
    case $dev in /dev/ublkb*) hook=1 ;; esac
    if [ "$UZRAM_VM_MODE" != guest ] || [ ! -e /dev/rtc0 ] || ! grep -qw deep /sys/power/mem_sleep 2>/dev/null; then
        skip "$name" "needs the guest, /dev/rtc0 and suspend to RAM (mem_sleep: $(cat /sys/power/mem_sleep 2>/dev/null))"
        return
    fi
    cg=$(workload_cgroup)
    note "$name: rtcwake -m mem -s 3 with swap on $dev under pressure (sleep hook: $hook)"
    : >"$log"
    swap_begin "$dev" || return
    fill_start 15 4
    if [ $hook = 1 ]; then
        sleep_hook pre suspend
        [ $rc = 0 ] || { bad="$bad refused"; res="$res the hook refused ($out);"; }
    fi
    if [ -z "$bad" ]; then
        echo deep >/sys/power/mem_sleep
        n0="uzram-vm: $name suspending at $(uptime_s)"
        echo "$n0" >/dev/kmsg
        t0=$(uptime_s)
        out=$(rtcwake -m mem -s 3 2>&1)
        rc=$?
        res="$res rtcwake -m mem -s 3: exit $rc in $(elapsed "$t0") s;"
        dmesg | since_mark "$n0" >>"$log"
        # the kernel's word that it slept: the suspend's entry, and the firmware's resume
        res="$res $(dmesg | since_mark "$n0" | grep -E 'suspend entry|resume complete|Waking up from|suspend exit' | sed 's/^\[[^]]*\] //' | tr '\n' ';')"
        dmesg | since_mark "$n0" | grep -q 'suspend entry (deep)' || bad="$bad no-suspend"
        if [ $rc != 0 ]; then
            bad="$bad suspend"
            res="$res ($(echo "$out" | tail -n 1)) $(dmesg | since_mark "$n0" | grep -E 'refusing to freeze|^\[ *[0-9.]*\] task:|rror' | sed 's/^\[[^]]*\] //' | head -n 3 | tr '\n' ' ');"
        fi
    fi
    if [ $hook = 1 ]; then
        sleep_hook post suspend
    fi
    wait $tpid
    prc=$?
    grep '^vmtool' "$log" | sed 's/^/VM: /'
    [ $prc = 0 ] || { bad="$bad verify"; res="$res vmtool swapfill $fill MiB exited $prc (1: data mismatch, >128: killed);"; }
    swapoff "$dev" >>"$log" 2>&1
    SWAP_DEV=
    bad_or_pass "$fill MiB (1.5x MemAvailable) through swap, suspended to RAM midway:$res every page verified after"
}

# check_hibernate DEV PREFIX: a real hibernation with swap on DEV (issue 17): a program (in a
# cgroup of its own) holds a quarter of MemAvailable pushed out to DEV; disk swap on the scratch
# disk (/dev/vda, lower priority) is the resume device; on uzram the sleep hook runs around it, as
# its unit does around systemd's (pre swaps uzram off: the pages come back to RAM or disk swap).
# The image is written, the guest powers off, tests/vm/run boots it again with uzram.resume=1 and
# the kernel resumes the image; then the hook's post, and the program verifies every page. Guest
# only, and after every other check: the host's root is gone after the resume (see hib_tools).
check_hibernate() {
    local dev=$1 name=${2}hibernate log=$UZ_TMP/${2}hibernate.log hook=0 cg avail hold hpid
    local out rc hrc n0 t0 res= bad= swapped
    case $dev in /dev/ublkb*) hook=1 ;; esac
    if [ "$UZRAM_VM_MODE" != guest ] || [ ! -b /dev/vda ] || grep -q '^/dev/vda ' /proc/mounts ||
        ! grep -qw disk /sys/power/state; then
        skip "$name" "needs the guest, its scratch disk unmounted, and hibernation in /sys/power/state"
        return
    fi
    cg=$(workload_cgroup)
    note "$name: a real hibernation with swap on $dev (sleep hook: $hook)"
    : >"$log"
    swap_begin "$dev" || return
    if ! mkswap /dev/vda >>"$log" 2>&1 || ! swapon -p 0 /dev/vda >>"$log" 2>&1; then
        swapoff "$dev" 2>/dev/null
        fail_log "$name" "$log" "no disk swap on /dev/vda for the image"
        return
    fi
    hold=$((avail / 4))
    hold_start $((SEED + 9))
    swapped=$(awk '/^VmSwap/ { print int($2 / 1024) }' /proc/$hpid/status 2>/dev/null)
    res="$hold MiB held, ${swapped:-?} MiB of it in swap;"
    if ! grep -q 'held' "$log.hold"; then
        bad="$bad no-hold"
    elif [ $hook = 1 ]; then
        sleep_hook pre hibernate
        [ $rc = 0 ] || bad="$bad refused"
        res="$res hook pre: exit $rc;"
    fi
    if [ -z "$bad" ]; then
        cat /sys/block/vda/dev >/sys/power/resume
        echo shutdown >/sys/power/disk
        echo 1 >/sys/power/pm_debug_messages 2>/dev/null
        # the kernel's messages from here on: after a marker (a count of lines fails once the
        # ring buffer is full, as it is late in a full run)
        n0="uzram-vm: $name hibernating at $(uptime_s)"
        echo "$n0" >/dev/kmsg
        t0=$(uptime_s)
        sync
        # tests/vm/run's cue: the guest powers off once the image is written; boot it again
        echo "UZRAM-VM-HIBERNATING $name"
        out=$( (echo disk >/sys/power/state) 2>&1)
        rc=$?
        echo 0 >/sys/power/pm_debug_messages 2>/dev/null
        dmesg | since_mark "$n0" >>"$log"
        if [ $rc != 0 ]; then
            bad="$bad hibernation"
            res="$res hibernation: exit $rc (${out#sh: }) $(dmesg | since_mark "$n0" | grep -iE 'error|fail|short' | head -n 2 | tr '\n' ' ')"
            # the freezer names the tasks that refused (and shows their stacks): which, and where
            res="$res tasks that did not freeze: $(dmesg | since_mark "$n0" | grep -oE 'task:[^ ]+ +state:[A-Z]+|pid:[0-9]+ +tgid:[0-9]+ +ppid:[0-9]+' | paste -d ' ' - - | tr '\n' ';')"
            ps -o pid,ppid,stat,args >>"$log" 2>&1
            res="$res;"
        elif dmesg | since_mark "$n0" | grep -q 'image restored successfully'; then
            res="$res image written to /dev/vda, guest powered off and resumed ($(elapsed "$t0") s of guest time);"
        else
            bad="$bad not-resumed"
            res="$res hibernation returned 0 but the kernel did not say it resumed an image;"
        fi
        if [ $hook = 1 ]; then
            sleep_hook post hibernate
            grep -q "^$dev " /proc/swaps || { bad="$bad swap-not-back"; res="$res $dev not swap again after the hook's post;"; }
        fi
    fi
    kill -USR1 $hpid 2>/dev/null
    wait $hpid
    hrc=$?
    cat "$log.hold" >>"$log"
    [ $hrc = 0 ] || { bad="$bad verify"; res="$res the program exited $hrc (1: data mismatch, >128: killed);"; }
    swapoff /dev/vda >>"$log" 2>&1
    swapoff "$dev" >>"$log" 2>&1
    SWAP_DEV=
    bad_or_pass "$res every page verified after the resume"
}

# bad_or_pass TEXT (for the checks that gather $bad and $res): fails $name with what $bad and
# $res say, or passes it with TEXT.
bad_or_pass() {
    if [ -n "$bad" ]; then
        fail_log "$name" "$log" "${bad# }: $res"
    else
        pass "$name" "$1"
    fi
}

# in_cgroup CG COMMAND... &: runs COMMAND as a process of cgroup CG, in the background only: the
# function's subshell becomes COMMAND (exec), so that $! is COMMAND's PID (a signal sent to $!
# before, as the light program's SIGUSR1, killed the subshell and left the program waiting).
in_cgroup() {
    exec sh -c 'echo $$ >"$1/cgroup.procs"; shift; exec "$@"' sh "$@"
}

# sleep_test STATE ACTION (for check_sleep): the hook's pre (with $hook), the freezer test of
# STATE, the hook's post; adds to $res and $bad, the kernel's words on a failure to $log.
sleep_test() {
    local st=$1 action=$2 n0 t0 out rc refusing
    if ! grep -qw "$st" /sys/power/state; then
        res="$res $st: not offered by this kernel;"
        return
    fi
    if [ $hook = 1 ]; then
        sleep_hook pre "$action"
        if [ $rc != 0 ]; then
            # as systemd: a failed pre means no sleep (a hibernation would hang)
            bad="$bad $st-refused"
            res="$res $st: refused by the hook ($(echo "$out" | tr '\n' ' '));"
            sleep_hook post "$action"
            return
        fi
    fi
    n0=$(dmesg | wc -l)
    note "$name: $st (pm_test freezer)"
    echo freezer >/sys/power/pm_test
    t0=$(uptime_s)
    out=$( (echo "$st" >/sys/power/state) 2>&1)
    rc=$?
    echo none >/sys/power/pm_test
    res="$res $st: exit $rc in $(elapsed "$t0") s"
    if [ $rc != 0 ]; then
        bad="$bad $st"
        dmesg | tail -n +$((n0 + 1)) >>"$log"
        refusing=$(dmesg | tail -n +$((n0 + 1)) | grep -E 'refusing to freeze|^\[ *[0-9.]*\] task:|short' | sed 's/^\[[^]]*\] //' | head -n 3 | tr '\n' ' ')
        res="$res (${out#sh: }) $refusing"
    fi
    res="$res;"
    if [ $hook = 1 ]; then
        sleep_hook post "$action"
    fi
}

# sd_start: a systemd user manager (the host's systemd, in a chroot of the host's root with the
# guest's /proc, /sys, /dev and fresh /run and /tmp), in a cgroup of its own; sets SD_PID.
# Returns 1 (with why in $log) if it does not come up.
SD_ROOT=/host
SD_PID=
sd_start() {
    local i
    [ -x $SD_ROOT/lib/systemd/systemd ] || { echo "no systemd on the host" >>"$log"; return 1; }
    [ -f /sys/fs/cgroup/cgroup.controllers ] || mount -t cgroup2 none /sys/fs/cgroup 2>/dev/null
    mkdir -p /sys/fs/cgroup/uzram-systemd
    # (not /tmp: the checkout may be under the host's /tmp, as CI's is)
    mount -t tmpfs sdrun $SD_ROOT/run &&
        mount -o rbind /proc $SD_ROOT/proc && mount -o rbind /sys $SD_ROOT/sys &&
        mount -o rbind /dev $SD_ROOT/dev || { echo "mounts for the chroot failed" >>"$log"; return 1; }
    mkdir -p $SD_ROOT/run/user/0/systemd/user && chmod 700 $SD_ROOT/run/user/0
    # what a user manager takes for "booted with systemd"
    mkdir -p $SD_ROOT/run/systemd/system
    sh -c 'echo $$ >/sys/fs/cgroup/uzram-systemd/cgroup.procs; exec chroot '$SD_ROOT' env -i SYSTEMD_IGNORE_CHROOT=1 PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root XDG_RUNTIME_DIR=/run/user/0 /lib/systemd/systemd --user --log-target=kmsg --log-level=info' >>"$log.manager" 2>&1 &
    SD_PID=$!
    for i in $(seq 1 300); do
        case $(sd_ctl is-system-running 2>&1) in running|degraded|starting) return 0 ;; esac
        kill -0 $SD_PID 2>/dev/null || break
        sleep 0.2
    done
    echo "the user manager did not come up: $(sd_ctl is-system-running 2>&1)" >>"$log"
    cat "$log.manager" >>"$log"
    sd_messages
    return 1
}

# sd_ctl ARGS: systemctl --user of sd_start's manager
sd_ctl() {
    chroot $SD_ROOT env -i SYSTEMD_IGNORE_CHROOT=1 PATH=/usr/sbin:/usr/bin:/sbin:/bin XDG_RUNTIME_DIR=/run/user/0 systemctl --user "$@"
}

# sd_messages: the user manager's messages (it logs to the kernel's ring) into $log
sd_messages() {
    dmesg | grep -E 'systemd\[|uzram' | tail -n 40 >>"$log"
}

# sd_uzram ARGS: uzram in the chroot
sd_uzram() {
    chroot $SD_ROOT env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "${UZRAM_VM_DIR#/host}/cache/uzram" "$@"
}

sd_stop() {
    local m
    [ -n "$SD_PID" ] && { kill -TERM $SD_PID; wait $SD_PID; }
    SD_PID=
    for m in dev sys proc run; do umount -l $SD_ROOT/$m 2>/dev/null; done
}

# check_systemd: contrib/systemd/uzram@.service's way, under a real systemd (the host's, as a
# user manager in the guest): a device served by a Type=notify service with a descriptor store;
# 32 MiB written; the *supervisor* killed (SIGKILL) while a reader waits on the device; systemd
# restarts the service with the region from its store, a successor takes the device over:
# every byte reads the same, the reader gets no error; then `systemctl restart` (a reader
# across it): the device handed over the same way, not deleted; `systemctl stop` deletes it.
check_systemd() {
    local name=systemd log=$UZ_TMP/systemd.log unit dev sup sup1 w rpid rrc t0 i MB=1048576
    local bin=${UZRAM_VM_DIR#/host}/cache/uzram
    if [ "$UZRAM_VM_MODE" != guest ]; then
        skip "$name" "needs the guest (it runs the host's systemd as a user manager in a chroot of the host's root)"
        return
    fi
    note "$name: a supervisor under systemd killed; systemd restarts it with the region from its descriptor store"
    : >"$log"
    uzram_reset
    if ! sd_start; then
        fail_log "$name" "$log" "no systemd user manager in the guest"
        sd_stop
        return
    fi
    unit=$SD_ROOT/run/user/0/systemd/user/uzram-vm.service
    # the unit's [Service] as contrib/systemd/uzram@.service has it, the device's options here
    sed -n '/^\[Service\]/,/^\[Install\]/p' "$UZRAM_VM_DIR/../../contrib/systemd/uzram@.service" |
        grep -v '^\[Install\]' | grep -v '^EnvironmentFile=' | grep -v '^ExecStart=' | grep -v '^MemorySwapMax=' >"$unit.tmp"
    # the daemons log to stderr (`serve --log` is `uzram --find`'s)
    echo "ExecStart=$bin serve --size 64M --algorithm lz4" >>"$unit.tmp"
    echo "StandardError=append:/run/user/0/uzram-vm-sd.log" >>"$unit.tmp"
    mv "$unit.tmp" "$unit"
    cat "$unit" >>"$log"
    sd_ctl daemon-reload >>"$log" 2>&1
    if ! sd_ctl start uzram-vm.service >>"$log" 2>&1; then
        sd_ctl status uzram-vm.service >>"$log" 2>&1
        cat $SD_ROOT/run/user/0/uzram-vm-sd.log >>"$log" 2>&1
        sd_messages
        fail_log "$name" "$log" "systemctl start of the service failed"
        sd_stop
        return
    fi
    dev=$(sd_ctl show -p StatusText --value uzram-vm.service | awk '{ print $2 }')
    sup=$(sd_ctl show -p MainPID --value uzram-vm.service)
    UZRAM_DEV=$dev
    echo "status: $(sd_ctl show -p StatusText --value uzram-vm.service); main pid $sup" >>"$log"
    if [ ! -b "$dev" ] || ! "$TOOL" write "$dev" 0 $((32 * MB)) "$SEED" >>"$log" 2>&1; then
        sd_ctl status uzram-vm.service >>"$log" 2>&1
        fail_log "$name" "$log" "the service's device ($dev) did not take 32 MiB"
        sd_ctl stop uzram-vm.service
        sd_stop
        return
    fi
    # the listing and the attributes in the chroot: libublk's description of the device is in
    # its /run
    w=$(sd_uzram --raw --noheadings -o PID "$dev" 2>>"$log")
    echo "worker $w; $(ls -la $SD_ROOT/tmp | tr '\n' ' ')" >>"$log"
    # a reader that waits on the device across the restart
    "$TOOL" verify "$dev" 0 $((32 * MB)) "$SEED" >"$log.reader" 2>&1 &
    rpid=$!
    t0=$(uptime_s)
    kill -KILL "$sup"
    sup1=
    for i in $(seq 1 600); do
        sup1=$(sd_ctl show -p MainPID --value uzram-vm.service 2>/dev/null)
        [ -n "$sup1" ] && [ "$sup1" != 0 ] && [ "$sup1" != "$sup" ] &&
            [ "$(sd_ctl is-active uzram-vm.service 2>/dev/null)" = active ] && break
        sleep 0.1
    done
    wait $rpid
    rrc=$?
    cat "$log.reader" >>"$log"
    cat $SD_ROOT/run/user/0/uzram-vm-sd.log >>"$log" 2>&1
    sd_ctl status uzram-vm.service >>"$log" 2>&1
    if [ "$(sd_ctl is-active uzram-vm.service 2>/dev/null)" != active ] || [ "$sup1" = "$sup" ]; then
        sd_messages
        fail_log "$name" "$log" "systemd did not restart the service after its supervisor $sup was killed (main pid now ${sup1:-none})"
        sd_ctl stop uzram-vm.service
        sd_stop
        return
    fi
    if [ -z "$w" ] || kill -0 "$w" 2>/dev/null; then
        fail_log "$name" "$log" "the old worker $w outlived its supervisor"
    elif [ $rrc != 0 ] || ! "$TOOL" verify "$dev" 0 $((32 * MB)) "$SEED" >>"$log" 2>&1; then
        fail_log "$name" "$log" "the 32 MiB did not read back the same across the restart (reader exit $rrc)"
    elif ! grep -q 'descriptor store' $SD_ROOT/run/user/0/uzram-vm-sd.log; then
        fail_log "$name" "$log" "the restarted supervisor did not say it took the region from the store"
    else
        res="supervisor $sup killed, systemd restarted the service (supervisor $sup1) in $(elapsed "$t0") s; $(grep -o 'a successor (pid [0-9]*) serves it again, [0-9]* ms after this supervisor started' $SD_ROOT/run/user/0/uzram-vm-sd.log | tail -n 1); a reader across the restart and a second read: 32 MiB verified; last_restart $(sd_uzram attr "$dev" uzram_stat 2>&1 | awk '$1 == "last_restart" { print $2 }')"
        # systemctl restart: the device handed over, not deleted
        "$TOOL" verify "$dev" 0 $((32 * MB)) "$SEED" >"$log.reader" 2>&1 &
        rpid=$!
        t0=$(uptime_s)
        sd_ctl restart uzram-vm.service >>"$log" 2>&1
        wait $rpid
        rrc=$?
        cat "$log.reader" >>"$log"
        sup=$sup1
        sup1=$(sd_ctl show -p MainPID --value uzram-vm.service 2>/dev/null)
        if [ $rrc != 0 ] || [ ! -b "$dev" ] || [ "$sup1" = "$sup" ] ||
            ! "$TOOL" verify "$dev" 0 $((32 * MB)) "$SEED" >>"$log" 2>&1 ||
            ! grep -q 'systemd restarts the service: handing the device over' $SD_ROOT/run/user/0/uzram-vm-sd.log; then
            cat $SD_ROOT/run/user/0/uzram-vm-sd.log >>"$log" 2>&1
            sd_ctl status uzram-vm.service >>"$log" 2>&1
            sd_messages
            fail_log "$name" "$log" "systemctl restart did not hand $dev over with its pages (reader exit $rrc, supervisor $sup -> ${sup1:-none})"
            sd_ctl stop uzram-vm.service
            UZRAM_DEV=
            sd_stop
            return
        fi
        res="$res; systemctl restart handed $dev over (supervisor $sup -> $sup1) in $(elapsed "$t0") s with a reader across it, 32 MiB verified"
        sd_ctl stop uzram-vm.service >>"$log" 2>&1
        for i in $(seq 1 100); do [ -b "$dev" ] || break; sleep 0.1; done
        if [ -b "$dev" ]; then
            fail_log "$name" "$log" "systemctl stop left $dev"
        else
            pass "$name" "$res; systemctl stop deleted $dev"
        fi
    fi
    sd_ctl stop uzram-vm.service >/dev/null 2>&1
    UZRAM_DEV=
    sd_stop
}
