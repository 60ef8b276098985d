# shellcheck shell=sh
# Checks (sourced by checks.sh): a stopped or killed daemon, recovery, upgrade, a corrupted region.

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

# check_recover NAME KILLS MODE: swap on uzram under pressure (vmtool swapfill of 2x MemAvailable,
# every page verified on the way back); while the program's pages are out in swap, SIGKILL to the
# worker (the listing's PID) KILLS times, 2 s of the program running between two. Each time the
# supervisor hands the device to a successor that adopts its pages and takes it over (its I/O
# held meanwhile): the program must finish with every page verified, no process may be killed,
# no task may hang (the hung-task watchdog at 30 s, panic on), each takeover must end within
# 2 s of the supervisor seeing the death (each time is printed: under TCG they take 0.2-0.7 s; a kernel holding the
# dead worker's requests for its default request timeout, or a successor waiting for reclaim
# before it serves, takes tens of seconds), the device must count KILLS restarts, and the
# worker's memory cgroup (or one above it) must forbid swap.
# MODE: `storm` kills in the middle of the program's swapping, the daemon in a cgroup that is
# never swapped (as the systemd unit puts it); `shell` the same, the daemon started from a shell
# as the README does (it must move itself into such a cgroup); `gentle` stops the program
# (SIGSTOP) for each kill and continues it once a successor serves.
# swap_forbidden_in CGROUP: whether CGROUP (a path in /sys/fs/cgroup) or one above it has
# memory.swap.max 0, as the daemon judges it
swap_forbidden_in() {
    local d=${1%/}
    while [ -n "$d" ]; do
        [ "$(cat "/sys/fs/cgroup$d/memory.swap.max" 2>/dev/null)" = 0 ] && return 0
        d=${d%/*}
    done
    return 1
}

# standby_state WORKER: the standby beside WORKER (its supervisor's other child started with
# --standby) as PID:ready (waiting in read(2) on its stdin for the word to take over) or
# PID:starting; "none" when there is none.
standby_state() {
    standby_of "$(awk '$1 == "PPid:" { print $2 }' /proc/"$1"/status 2>/dev/null)" "$1"
}

# standby_of SUP [SKIP]: supervisor SUP's standby (--standby, not a reserve: see sd_cover)
# other than process SKIP, as standby_state says it.
standby_of() { child_waiting "$1" --standby --reserve-for "${2:-}"; }

# child_waiting SUP WITH WITHOUT [SKIP]: SUP's child (not SKIP) whose arguments hold WITH and
# not WITHOUT (unless empty), as PID:ready (in read(2) on its stdin: x86_64's syscall 0 on fd 0) or
# PID:starting; "none".
child_waiting() {
    local c
    for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do
        [ "$c" = "${4:-}" ] && continue
        tr '\0' ' ' <"/proc/$c/cmdline" 2>/dev/null | grep -q -- "$2" || continue
        [ -n "$3" ] && tr '\0' ' ' <"/proc/$c/cmdline" 2>/dev/null | grep -q -- "$3" && continue
        case $(cat "/proc/$c/syscall" 2>/dev/null) in
        "0 0x0 "*) echo "$c:ready" ;;
        *) echo "$c:starting" ;;
        esac
        return
    done
    echo none
}

# storm_begin: the recover checks' storm, once swap_begin has set avail: the hung-task watchdog
# at 30 s (its old value in hung0), vmtool filling 2x MemAvailable (fill) and verifying it
# twice in the background (tpid; ten kills 2 s apart end within the first pass), the kernel's
# kill count before (oom0) and pswpout (o0); returns once a quarter of the fill is out in
# swap. Sets the caller's variables.
storm_begin() {
    hung0=$(cat /proc/sys/kernel/hung_task_timeout_secs)
    echo 30 >/proc/sys/kernel/hung_task_timeout_secs
    fill=$((avail * 2))
    oom0=$(dmesg | grep -c -e 'Killed process' -e 'SIGBUS')
    o0=$(vmstat_val pswpout)
    "$TOOL" swapfill $fill "$SEED" 2 >>"$log" 2>&1 &
    tpid=$!
    quarter_out $tpid
}

check_recover() {
    local name=$1 kills=$2 mode=$3 log=$UZ_TMP/$1.log dev swapsize avail fill tpid o0 i k pid
    local rc oom0 oom1 times worst wfail cg probe freed hung0 moved= l0 wcg sb w
    note "$name: SIGKILL to the worker $kills time(s) while swap holds 2x RAM ($mode)"
    swapsize=$((($(meminfo_kb MemTotal) / 1024 * 2 + 1023) / 1024 * 1024))M
    l0=$(wc -l 2>/dev/null <"$UZRAM_LOG" || echo 0)
    if [ "$mode" = shell ]; then
        uzram_setup lz4 $swapsize || return
        moved=$(tail -n +$((l0 + 1)) "$UZRAM_LOG" | grep -o 'moved into .*' | tail -n 1)
        if [ -z "$moved" ]; then
            fail "$name" "started from a shell, the supervisor did not move itself out of swap's reach: $(grep -e warning -e 'swapped' "$UZRAM_LOG" | tail -n 1)"
            return
        fi
    else
        # The daemon in a cgroup that is never swapped (as the systemd unit puts it): while no
        # worker maps the device's region its pages are not locked, and swapped out to the
        # device itself they would wait for the successor that reads them.
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
    fi
    dev=$UZRAM_DEV
    pid=$("$UZRAM_BIN" --raw --noheadings -o PID "$dev" 2>/dev/null)
    if [ -z "$pid" ]; then
        fail "$name" "the listing names no worker for $dev"
        uzram_reset
        return
    fi
    wcg=$(awk '/^0::/ { sub(/^0::/, ""); print }' "/proc/$pid/cgroup" 2>/dev/null)
    if ! swap_forbidden_in "$wcg"; then
        fail "$name" "worker $pid runs in the cgroup '$wcg': neither it nor one above it has memory.swap.max 0"
        uzram_reset
        return
    fi
    : >"$log"
    swap_begin "$dev" --discard=pages || return
    storm_begin
    k=0
    while [ $k -lt "$kills" ] && kill -0 $tpid 2>/dev/null; do
        pid=$("$UZRAM_BIN" --raw --noheadings -o PID "$dev" 2>>"$log")
        if [ "$mode" = gentle ]; then
            kill -STOP $tpid
            sleep 1
        fi
        # A takeover within 2 s needs the standby ready (pinned, waiting for its word): the
        # supervisor starts it once a successor serves, and in a storm under emulation that
        # takes seconds; a death before it is ready waits for the standby's whole start-up
        # (UZRAM_VM_KILL_UNREADY=1 kills without waiting: the device may be given up).
        w=0
        sb=$(standby_state "$pid")
        while [ "${UZRAM_VM_KILL_UNREADY:-0}" != 1 ] && [ $w -lt 600 ]; do
            case $sb in *:ready) break ;; esac
            sleep 0.1
            w=$((w + 1))
            sb=$(standby_state "$pid")
        done
        sb="$sb after $((w / 10)).$((w % 10)) s"
        kill -KILL "$pid"
        k=$((k + 1))
        for i in $(seq 1 600); do
            [ "$(uzram_stat_field "$dev" restarts)" = "$k" ] && break
            sleep 0.1
        done
        kill -CONT $tpid
        if [ "$(uzram_stat_field "$dev" restarts)" != "$k" ]; then
            kill -KILL $tpid
            echo "$hung0" >/proc/sys/kernel/hung_task_timeout_secs
            swapoff "$dev" 2>/dev/null
            fail_log "$name" "$log" "no successor served $dev 60 s after SIGKILL $k to worker $pid: $(tail -n 3 "$UZRAM_LOG" | tr '\n' ' ')"
            return
        fi
        echo "kill $k: worker $pid (standby $sb); now $("$UZRAM_BIN" attr "$dev" uzram_stat | grep restart | tr '\n' ' ')" >>"$log"
        sleep "${UZRAM_VM_KILL_GAP:-2}"
    done
    wait $tpid
    rc=$?
    echo "$hung0" >/proc/sys/kernel/hung_task_timeout_secs
    grep -e '^vmtool' -e '^kill' "$log" | sed 's/^/VM: /'
    oom1=$(dmesg | grep -c -e 'Killed process' -e 'SIGBUS')
    wfail=$(dev_failed_writes "$dev")
    times=$(grep -o '[0-9]* ms after the last one ended' "$UZRAM_LOG" | tail -n "$k" | awk '{ print $1 }' | tr '\n' ' ')
    worst=$(echo "$times" | tr ' ' '\n' | sort -n | tail -n 1)
    echo "restart times (ms): $times; failed writes $wfail" >>"$log"
    # where each successor's time went, as it logged once serving
    tail -n +$((l0 + 1)) "$UZRAM_LOG" | grep -o 'served after .*' | tail -n "$k" | sed 's/^/VM: successor /'
    tail -n +$((l0 + 1)) "$UZRAM_LOG" | grep -o 'the standby was still starting' | sort | uniq -c | sed 's/^/VM: /'
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
    if [ "${worst:-0}" -gt 2000 ]; then
        fail_log "$name" "$log" "a takeover took $worst ms (times: $times ms)"
        return
    fi
    if [ $k -lt "$kills" ]; then
        fail_log "$name" "$log" "the program finished after $k of $kills kills: too little to prove anything"
        return
    fi
    uzram_reset
    pass "$name" "$fill MiB (2x MemAvailable) through swap, worker killed $k time(s) while it ran ($mode${moved:+; the supervisor $moved}): every page verified, no process killed, restarts $k, time from the death to serving again: $times ms (worst $worst), failed writes $wfail; the successor's slot-free probe ${probe:-?} ($freed pages freed by it)"
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
    local took=$(elapsed "$t0") served pid2 t1
    served=$(grep -o 'serves it again, [0-9]* ms after the last one ended' "$UZRAM_LOG" | tail -n 1)
    # A binary that cannot take the device over: refused, said at once, the worker goes on.
    printf '#!/bin/sh\nexit 3\n' >"$bin.new" && chmod +x "$bin.new" && mv "$bin.new" "$bin"
    t1=$(uptime_s)
    out=$(timeout 60 "$UZRAM_BIN" upgrade "$dev" 2>&1)
    rc=$?
    echo "uzram upgrade to a binary that exits 3: exit $rc in $(elapsed "$t1") s: $out" >>"$log"
    pid2=$("$UZRAM_BIN" --raw --noheadings -o PID "$dev" 2>>"$log")
    if [ $rc != 1 ] || ! printf '%s' "$out" | grep -q 'refused the upgrade.*exit status 3' || [ "$pid2" != "$pid1" ]; then
        fail_log "$name" "$log" "an upgrade to a broken binary: exit $rc in $(elapsed "$t1") s, worker $pid1 then $pid2: $out"
        return
    fi
    pass "$name" "worker $pid0 handed $dev to $pid1 (the new file) in $took s while fio wrote and verified (2 jobs, qd32): fio exit 0, no I/O error, no mismatch; $served; an upgrade to a broken binary refused in $(elapsed "$t1") s, worker $pid1 serving on"
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
