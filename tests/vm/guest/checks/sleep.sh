# shellcheck shell=sh
# Checks (sourced by checks.sh): sleep: suspend, hibernation and the hook around them.

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
