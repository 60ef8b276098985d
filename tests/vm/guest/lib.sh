# Helpers for the device checks (POSIX sh: busybox ash in the guest, dash on a host).
# Sourced by check.sh (and by the guest shell's profile). Environment, set by guest/init or run:
#   UZRAM_VM_MODE  guest|host    UZRAM_VM_ROOT  where the host's root is (/host in the guest, "" on a host)
#   UZRAM_VM_DIR   tests/vm      UZRAM_VM_TOOL  the static vmtool binary
#   UZRAM_VM_BREAK 1: corrupt data on purpose (the fio checks must then fail)

UZ_N=0
UZ_FAIL=0
UZ_SKIP=0
UZ_TMP=${UZ_TMP:-/tmp/uzram-vm}
TOOL=${UZRAM_VM_TOOL:-vmtool}

# ---- results: one line per check, exactly "PASS: name detail" / "FAIL: ..." / "SKIP: ..." ----
pass() { _n=$1; shift; echo "PASS: $_n $*"; UZ_N=$((UZ_N + 1)); }
fail() { _n=$1; shift; echo "FAIL: $_n $*"; UZ_N=$((UZ_N + 1)); UZ_FAIL=$((UZ_FAIL + 1)); }
skip() { _n=$1; shift; echo "SKIP: $_n $*"; UZ_SKIP=$((UZ_SKIP + 1)); }

# fail NAME with a reason, and show the end of the check's log for the console record
fail_log() { # NAME LOG REASON...
    _n=$1 _l=$2; shift 2
    echo "---- $_l: lines that look like errors, then its last lines"
    grep -iE 'fail|error|err=|mismatch|bad |expected|received|killed|oom|invalid|not zero' "$_l" |
        grep -v 'multiple writers may overwrite' | head -n 12 | sed 's/^/  ! /'
    tail -n 15 "$_l" | sed 's/^/  > /'
    # what uzram's daemons said of failed requests and bugs (they log the page and the cause)
    if [ -s "$UZRAM_LOG" ]; then
        echo "---- $UZRAM_LOG: failures and bugs the daemons logged"
        grep -E 'BUG|panicked|requests failed|cannot refill|gave up' "$UZRAM_LOG" | tail -n 12 | sed 's/^/  d /'
    fi
    # a daemon that crashed: where (the kernel's line names the faulting address and the
    # binary's mapping)
    dmesg 2>/dev/null | grep -E 'segfault|traps:|general protection' | tail -n 4 | sed 's/^/  k /'
    fail "$_n" "$*"
}

vm_result() {
    _v=PASS
    [ "$UZ_FAIL" = 0 ] && [ "$UZ_N" -gt 0 ] || _v=FAIL
    echo "UZRAM-VM-RESULT: $_v n=$UZ_N fail=$UZ_FAIL skip=$UZ_SKIP"
    [ "$_v" = PASS ]
}

# progress for the console log (not a result line)
note() { echo "VM: $*"; }

# ---- time ----------------------------------------------------------------------------------------
uptime_s() { cut -d' ' -f1 /proc/uptime; }
elapsed() { awk -v a="$1" -v b="$(uptime_s)" 'BEGIN { printf "%.1f", b - a }'; }

# ---- sizes ---------------------------------------------------------------------------------------
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
meminfo_kb() { awk -v k="$1:" '$1 == k { print $2 }' /proc/meminfo; }
vmstat_val() { awk -v k="$1" '$1 == k { print $2 }' /proc/vmstat; }

# ---- the host's programs in the guest ------------------------------------------------------------
# Busybox lacks what the checks need (fio, util-linux swapon -p/--discard, e2fsprogs): run the
# host's dynamic binaries from the read-only 9p share through the host's own loader.
hostbin_setup() {
    _r=$UZRAM_VM_ROOT _d=/tmp/hostbin
    mkdir -p "$_d"
    _ld=$_r/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
    _lp=$_r/lib/x86_64-linux-gnu:$_r/usr/lib/x86_64-linux-gnu:$_r/usr/lib/x86_64-linux-gnu/ceph
    for _t in fio mke2fs e2fsck mkswap swapon swapoff blkdiscard setpriv rtcwake; do
        _p=
        for _c in "$_r/usr/sbin/$_t" "$_r/usr/bin/$_t" "$_r/sbin/$_t" "$_r/bin/$_t"; do
            [ -f "$_c" ] && { _p=$_c; break; }
        done
        if [ -z "$_p" ]; then
            note "the host has no $_t"
            continue
        fi
        printf '#!/bin/sh\nexport MKE2FS_CONFIG=%s/etc/mke2fs.conf\nexec %s --library-path %s %s "$@"\n' \
            "$_r" "$_ld" "$_lp" "$_p" >"$_d/$_t"
        chmod +x "$_d/$_t"
        # a function: Debian's busybox sh runs its own applets (mke2fs, swapon, ...) before $PATH
        eval "$_t() { $_d/$_t \"\$@\"; }"
    done
    case :$PATH: in *:$_d:*) ;; *) PATH=$_d:$PATH ;; esac
    export PATH
}

# hib_tools: what the checks need after a hibernation, copied into the guest's RAM (/tmp/hib):
# the host's root over virtio-9p does not come back after a resume (Linux's p9_virtio_drv has no
# freeze/restore, so its queues are gone after the device's reset), and anything that touched it
# would wait there. uzram and its slot-free probe's loader (without debug info), vmtool
# (static), and swapon, swapoff, mkswap and rtcwake with the libraries the host's loader resolves
# for them. Sets PATH, UZRAM_BIN and TOOL.
hib_tools() {
    _h=/tmp/hib _r=$UZRAM_VM_ROOT
    _ld=$_r/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
    _lp=$_r/lib/x86_64-linux-gnu:$_r/usr/lib/x86_64-linux-gnu
    mkdir -p $_h/bin $_h/lib
    cp "$UZRAM_VM_DIR/cache/uzram-nodebug" $_h/bin/uzram &&
        cp "$UZRAM_VM_DIR/cache/uzram-probe-nodebug" $_h/bin/uzram-probe && cp "$TOOL" $_h/bin/vmtool &&
        cp "$_ld" $_h/lib/ || return 1
    for _t in swapon swapoff mkswap rtcwake; do
        _p=
        for _c in "$_r/sbin/$_t" "$_r/usr/sbin/$_t" "$_r/bin/$_t" "$_r/usr/bin/$_t"; do
            [ -f "$_c" ] && { _p=$_c; break; }
        done
        [ -n "$_p" ] || return 1
        cp "$_p" "$_h/lib/$_t.bin" || return 1
        for _l in $("$_ld" --library-path "$_lp" --list "$_p" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }'); do
            cp "$_l" $_h/lib/ || return 1
        done
        printf '#!/bin/sh\nexec %s --library-path %s %s "$@"\n' \
            "$_h/lib/ld-linux-x86-64.so.2" "$_h/lib" "$_h/lib/$_t.bin" >"$_h/bin/$_t"
        chmod +x "$_h/bin/$_t"
        eval "$_t() { $_h/bin/$_t \"\$@\"; }"
    done
    PATH=$_h/bin:$PATH
    export PATH
    UZRAM_BIN=$_h/bin/uzram TOOL=$_h/bin/vmtool
    note "hibernation tools in RAM: $(du -sk $_h | cut -f1) KiB"
}

vm_setup() {
    mkdir -p "$UZ_TMP"
    [ "$UZRAM_VM_MODE" = guest ] && hostbin_setup
    for _t in fio mke2fs e2fsck mkswap swapon swapoff blkdiscard "$TOOL"; do
        command -v "$_t" >/dev/null 2>&1 || note "missing program: $_t"
    done
    # The memory cgroups the checks use, made now, while the guest is idle: the first memory
    # cgroup turns on the kernel's memcg static keys, and under TCG a key patched while another
    # vCPU runs that code can leave it a stale int3 (a CI run's guest died of "Oops: int3" in
    # kmem_cache_free as recover1 made its cgroup under the kill check's ring teardown).
    if [ "$UZRAM_VM_MODE" = guest ]; then
        noswap_cgroup >/dev/null
        workload_cgroup >/dev/null
    fi
    return 0
}

# ---- devices: what a check needs to know beyond the block device itself ------------------------
# dev_mm_stat DEV: zram's nine mm_stat fields (orig_data_size compr_data_size mem_used_total
# mem_limit mem_used_max same_pages pages_compacted huge_pages huge_pages_since).
# uzram prints the same fields byte for byte (`uzram attr DEV mm_stat`, through its daemon).
dev_mm_stat() {
    case $1 in
    /dev/zram*) cat "/sys/block/${1#/dev/}/mm_stat" ;;
    /dev/ublkb*) "$UZRAM_BIN" attr "$1" mm_stat ;;
    *) echo "0 0 0 0 0 0 0 0 0"; return 1 ;;
    esac
}
dev_stat_field() { dev_mm_stat "$1" | awk -v f="$2" '{ print $f }'; } # DEV FIELD(1-based)
# dev_failed_writes DEV: io_stat's failed_writes (its second field), zram's and uzram's alike
dev_failed_writes() {
    case $1 in
    /dev/zram*) awk '{ print $2 }' "/sys/block/${1#/dev/}/io_stat" ;;
    /dev/ublkb*) "$UZRAM_BIN" attr "$1" io_stat | awk '{ print $2 }' ;;
    *) echo 0 ;;
    esac
}
# writes uzram put off while its pool's reserve was dry (kept in flight, stored once memory came)
dev_writes_put_off() {
    case $1 in
    /dev/ublkb*) "$UZRAM_BIN" attr "$1" uzram_stat | awk '$1 == "writes_put_off" { print $2 }' ;;
    *) echo 0 ;;
    esac
}
dev_mem_used() { dev_stat_field "$1" 3; }
dev_compact() {
    case $1 in
    /dev/zram*) echo 1 >"/sys/block/${1#/dev/}/compact" ;;
    /dev/ublkb*) "$UZRAM_BIN" attr "$1" compact 1 ;;
    *) return 1 ;;
    esac
}
dev_summary() { # one line: stored, compressed, memory used
    dev_mm_stat "$1" | awk '{ printf "orig %.1f MiB compr %.1f MiB mem_used %.1f MiB same %d huge %d",
        $1 / 1048576, $2 / 1048576, $3 / 1048576, $6, $8 }'
}

# ---- kernel zram ---------------------------------------------------------------------------------
ZRAM=/sys/block/zram0
ZRAM_OURS=0

# zram_begin: make /dev/zram0 available. On a host, only a free zram0 (initstate 0) is used.
zram_begin() {
    if [ ! -d $ZRAM ]; then
        modprobe zram num_devices=1 2>/dev/null || true
        [ -d $ZRAM ] || { fail zram-setup "no /dev/zram0 (zram module missing)"; return 1; }
    fi
    if [ "$(cat $ZRAM/initstate)" != 0 ]; then
        fail zram-setup "/dev/zram0 is in use (initstate 1, disksize $(cat $ZRAM/disksize)): not touching it"
        return 1
    fi
    ZRAM_OURS=1
    return 0
}

zram_has_algo() { grep -qw "$1" $ZRAM/comp_algorithm; }

zram_setup() { # ALGO SIZE
    [ "$ZRAM_OURS" = 1 ] || return 1
    zram_reset
    if ! echo "$1" >$ZRAM/comp_algorithm 2>/dev/null; then
        fail zram-setup "comp_algorithm $1 refused (have: $(cat $ZRAM/comp_algorithm))"
        return 1
    fi
    if ! echo "$2" >$ZRAM/disksize; then
        fail zram-setup "disksize $2 refused"
        return 1
    fi
    note "zram0: $(cat $ZRAM/comp_algorithm), disksize $2"
}

zram_reset() {
    [ "$ZRAM_OURS" = 1 ] || return 0
    type check_cleanup >/dev/null 2>&1 && check_cleanup
    [ "$(cat $ZRAM/initstate)" = 0 ] && return 0
    grep -q '^/dev/zram0 ' /proc/swaps && swapoff /dev/zram0
    echo 1 >$ZRAM/reset || note "zram0 reset failed"
}

# ---- uzram's ublk device ---------------------------------------------------------------------------
# The static binary built by tests/vm/run into cache/uzram; devices are made as a user makes them:
# `uzram --find --size ...` leaves a detached daemon serving, `uzram --reset` deletes.
UZRAM_BIN=${UZRAM_VM_DIR}/cache/uzram
UZRAM_DEV=
UZRAM_LOG=${UZ_TMP:-/tmp/uzram-vm}/uzram-daemon.log

# uzram_begin: the ublk driver and the binary are there.
uzram_begin() {
    [ -e /dev/ublk-control ] || { skip uzram "no /dev/ublk-control: this kernel has no ublk_drv"; return 1; }
    [ -x "$UZRAM_BIN" ] || { fail uzram-setup "no uzram binary at $UZRAM_BIN"; return 1; }
}

uzram_setup() { # ALGO SIZE: a fresh device; sets UZRAM_DEV
    uzram_reset
    # UZRAM_VM_BREAK=reads: a device that flips a bit in some reads (the checks must fail)
    _break=
    [ "$UZRAM_VM_BREAK" = reads ] && _break=1
    # UZRAM_VM_SLOT_FREE=discard: devices without the slot-free probe
    _sf=probe
    [ "${UZRAM_VM_SLOT_FREE:-probe}" = discard ] && _sf=discard
    if [ -z "$UZRAM_VM_RESERVE" ]; then
        # UZRAM_SETUP_EXTRA: more options for this device, word-split (--recomp-algorithm zstd);
        # UZRAM_VM_DEVICE_OPTS (tests/vm/run's knob, "+" for blanks): for every device
        _extra=${UZRAM_SETUP_EXTRA:-$(echo "${UZRAM_VM_DEVICE_OPTS:-}" | tr + ' ')}
        # shellcheck disable=SC2086
        UZRAM_DEV=$(UZRAM_TEST_BREAK_READS=$_break UZRAM_PROGRESS_SECS=5 UZRAM_STALL_SYSRQ=1 "$UZRAM_BIN" --find --size "$2" --algorithm "$1" \
            --slot-free $_sf --log "$UZRAM_LOG" $_extra 2>/tmp/uzram-find.err)
        _rc=$?
    else
        # UZRAM_VM_RESERVE=SIZE: the daemon's --reserve, a `serve` option (not one of --find's);
        # `serve` prints the device once it serves and keeps running, its output in a file
        : >/tmp/uzram-serve.out
        (UZRAM_TEST_BREAK_READS=$_break UZRAM_PROGRESS_SECS=5 UZRAM_STALL_SYSRQ=1 setsid "$UZRAM_BIN" serve --detached \
            --reserve "$UZRAM_VM_RESERVE" --size "$2" --algorithm "$1" --slot-free $_sf --log "$UZRAM_LOG" \
            </dev/null >/tmp/uzram-serve.out 2>/tmp/uzram-find.err &)
        UZRAM_DEV= _rc=1
        for _ in $(seq 1 150); do
            UZRAM_DEV=$(head -n 1 /tmp/uzram-serve.out)
            [ -n "$UZRAM_DEV" ] && _rc=0 && break
            sleep 0.2
        done
    fi
    if [ $_rc != 0 ] || [ ! -b "$UZRAM_DEV" ]; then
        fail uzram-setup "uzram --size $2 --algorithm $1 exited $_rc, printed '$UZRAM_DEV': $(cat /tmp/uzram-find.err; tail -3 "$UZRAM_LOG" 2>/dev/null)"
        UZRAM_DEV=
        return 1
    fi
}

# noswap_cgroup: a memory cgroup whose pages are never swapped out (memory.swap.max 0), as
# contrib/systemd/uzram-setup.service's MemorySwapMax=0 puts uzram's daemons in; prints its path,
# or nothing if the kernel has none (cgroup v2 mounted here if it is not).
noswap_cgroup() {
    _cg=/sys/fs/cgroup/uzram-noswap
    [ -f /sys/fs/cgroup/cgroup.controllers ] || mount -t cgroup2 none /sys/fs/cgroup 2>/dev/null
    grep -qw memory /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null ||
        echo +memory >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null
    [ -d $_cg ] || mkdir $_cg 2>/dev/null
    echo 0 >$_cg/memory.swap.max 2>/dev/null && echo $_cg
}

# workload_cgroup: a memory cgroup for a test's program, as systemd puts every process in a
# cgroup of its own (uzram's sleep hook freezes the cgroups of processes that hold swap); prints
# its path, or nothing if the kernel has no cgroup v2.
workload_cgroup() {
    _cg=/sys/fs/cgroup/uzram-workload
    [ -f /sys/fs/cgroup/cgroup.controllers ] || mount -t cgroup2 none /sys/fs/cgroup 2>/dev/null
    [ -f /sys/fs/cgroup/cgroup.controllers ] || return 0
    [ -d $_cg ] || mkdir $_cg 2>/dev/null
    [ -d $_cg ] && echo $_cg
}

uzram_reset() { # uzram --reset: the daemon deletes its device and exits
    [ -n "$UZRAM_DEV" ] || return 0
    # a check that failed half way may have left the device mounted or as swap
    type check_cleanup >/dev/null 2>&1 && check_cleanup
    # with extra device options (cold groups made within seconds, say): what the groups did
    [ -n "${UZRAM_VM_DEVICE_OPTS:-}" ] &&
        note "uzram $UZRAM_DEV before its reset: $("$UZRAM_BIN" attr "$UZRAM_DEV" policy_stat 2>/dev/null | grep group | tr '\n' ' ')"
    "$UZRAM_BIN" --reset "$UZRAM_DEV" >/tmp/uzram-reset.err 2>&1 ||
        fail uzram-reset "uzram --reset $UZRAM_DEV failed: $(cat /tmp/uzram-reset.err)"
    [ -b "$UZRAM_DEV" ] && fail uzram-reset "$UZRAM_DEV still there after uzram --reset"
    UZRAM_DEV=
}
