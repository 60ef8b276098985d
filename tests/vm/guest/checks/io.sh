# shellcheck shell=sh
# Checks (sourced by checks.sh): fio, ext4 and discard: the device as a disk.

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
