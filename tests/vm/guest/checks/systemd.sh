# shellcheck shell=sh
# Checks (sourced by checks.sh): systemd: the units under a user manager.

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

# sd_begin WHAT: the start of a check under the user manager (its $name and $log): skipped
# outside the guest, WHAT said, the log emptied, devices reset, the manager started; returns 1
# (the check said as skipped or failed) when it must not go on.
sd_begin() {
    if [ "$UZRAM_VM_MODE" != guest ]; then
        skip "$name" "needs the guest (it runs the host's systemd as a user manager in a chroot of the host's root)"
        return 1
    fi
    note "$name: $1"
    : >"$log"
    uzram_reset
    if ! sd_start; then
        fail_log "$name" "$log" "no systemd user manager in the guest"
        sd_stop
        return 1
    fi
}

# sd_unit SIZE [KEEP]: the service uzram-vm.service, whose [Service] is contrib/systemd/uzram@.service's
# with a device of SIZE (lz4); its daemons log to the manager's /run/user/0/uzram-vm-sd.log.
# MemorySwapMax=0 is kept only with KEEP (a check that needs it checks that it took).
sd_unit() {
    local unit=$SD_ROOT/run/user/0/systemd/user/uzram-vm.service drop='^MemorySwapMax='
    [ -n "${2:-}" ] && drop='^$'
    sed -n '/^\[Service\]/,/^\[Install\]/p' "$UZRAM_VM_DIR/../../contrib/systemd/uzram@.service" |
        grep -v '^\[Install\]' | grep -v '^EnvironmentFile=' | grep -v '^ExecStart=' | grep -v "$drop" >"$unit.tmp"
    # the daemons log to stderr (`serve --log` is `uzram --find`'s)
    echo "ExecStart=${UZRAM_VM_DIR#/host}/cache/uzram serve --size $1 --algorithm lz4" >>"$unit.tmp"
    echo "StandardError=append:/run/user/0/uzram-vm-sd.log" >>"$unit.tmp"
    # the reserve, opt-in in the unit as shipped
    echo "Environment=UZRAM_RESERVE=1" >>"$unit.tmp"
    mv "$unit.tmp" "$unit"
    cat "$unit" >>"$log"
    sd_ctl daemon-reload >>"$log" 2>&1
}

# check_systemd: contrib/systemd/uzram@.service's way, under a real systemd (the host's, as a
# user manager in the guest): a device served by a Type=notify service with a descriptor store;
# 32 MiB written; the *supervisor* killed (SIGKILL) while a reader waits on the device; systemd
# restarts the service with the region from its store, a successor takes the device over:
# every byte reads the same, the reader gets no error; then `systemctl restart` (a reader
# across it): the device handed over the same way, not deleted; `systemctl stop` deletes it.
check_systemd() {
    local name=systemd log=$UZ_TMP/systemd.log dev sup sup1 w rpid rrc t0 i MB=1048576
    sd_begin "a supervisor under systemd killed; systemd restarts it with the region from its descriptor store" || return
    sd_unit 64M
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
        res="supervisor $sup killed, systemd restarted the service (supervisor $sup1) in $(elapsed "$t0") s; $(grep -o -e 'a successor (pid [0-9]*) serves it again, [0-9]* ms after this supervisor started' -e 'its reserve (pid [0-9]*) took the device over' -e 'the reserve serves on as its worker, [0-9]* ms after this supervisor started' $SD_ROOT/run/user/0/uzram-vm-sd.log | tail -n 2 | tr '\n' ' '); a reader across the restart and a second read: 32 MiB verified; last_restart $(sd_uzram attr "$dev" uzram_stat 2>&1 | awk '$1 == "last_restart" { print $2 }')"
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

# sd_cover SUP DEV: what takes DEV over should the service of supervisor SUP end: "PID:ready",
# the reserve SUP started (--reserve-for, outside the service's cgroup) waiting in read(2) on
# its stdin (the lifeline), or "PID:serving", a worker outside the service's cgroup (a
# reserve that took over, kept by the supervisor systemd started next: it outlives the
# service); else "PID:starting" or "none".
sd_cover() {
    local w
    [ -n "$1" ] && [ "$1" != 0 ] && [ -r "/proc/$1/cgroup" ] || { echo none; return; }
    w=$(sd_uzram --raw --noheadings -o PID "$2" 2>/dev/null | tr -d ' ')
    if [ -n "$w" ] && [ -r "/proc/$w/cgroup" ] && [ "$(cat "/proc/$w/cgroup")" != "$(cat "/proc/$1/cgroup")" ]; then
        echo "$w:serving"
        return
    fi
    child_waiting "$1" --reserve-for ""
}

# sd_read_wait BLOCK: a direct read of block BLOCK of check_recoversd's $dev, waited for up to
# 30 s; its pid in rpid (still running: not served).
sd_read_wait() {
    dd if="$dev" of=/dev/null bs=4096 count=1 iflag=direct skip="$1" 2>>"$log" &
    rpid=$!
    for _ in $(seq 1 600); do
        kill -0 $rpid 2>/dev/null || break
        sleep 0.05
    done
}

# sd_storm_fail MSG: check_recoversd's end on a failure in its loop (its variables): the
# program killed, the watchdog's timeout back, swap off, the daemons' log kept, the service
# and the manager stopped.
sd_storm_fail() {
    kill -CONT $tpid
    kill -KILL $tpid
    kill $TAIL_PID 2>/dev/null
    echo "$hung0" >/proc/sys/kernel/hung_task_timeout_secs
    swapoff "$dev" 2>/dev/null
    cat $SD_ROOT/run/user/0/uzram-vm-sd.log >>"$log" 2>&1
    fail_log "$name" "$log" "$1"
    sd_ctl stop uzram-vm.service
    UZRAM_DEV=
    sd_stop
}

# check_recoversd NAME KILLS MODE: check_recover's program with the device served as uzram@.service
# serves it (its [Service] whole, MemorySwapMax=0 included, under the user manager standing in
# for PID 1): swap on it holds 2x MemAvailable while vmtool verifies every page, and `systemctl
# kill -s KILL` takes the whole service (supervisor, worker and standby) down KILLS times, 2 s
# of the program running between two, each once the service's reserve is ready. The reserve
# (outside the service's cgroup) takes the device over; systemd restarts the service with the
# region from its descriptor store, and the new supervisor keeps the reserve as its worker.
# In the storm, that worker is killed before the next systemctl kill (the supervisor's standby
# takes over and the supervisor starts a new reserve), so that every systemctl kill is a
# reserve's takeover. Each time from a kill to the device serving again (a direct read of one
# block, started at once, returns) is printed; the device not served 30 s after a kill fails,
# with what the daemon's tasks wait on, and so does any time over 2 s.
# MODE: `gentle` stops the program (SIGSTOP) a second before each kill and continues it once the
# device serves; `storm` kills in the middle of its swapping.
check_recoversd() {
    local name=$1 kills=$2 mode=$3 log=$UZ_TMP/$1.log dev sup sup1 w wcg tpid o0 rc k
    local t0 ms times= worst=0 hung0 oom0 oom1 swapsize fill blocks rpid p t avail res back wf
    local wtimes= wworst=0 t1 cms ctimes= wnote=
    # the memory controller for the manager's units, as PID 1 has it (in the guest only)
    if [ "$UZRAM_VM_MODE" = guest ]; then
        [ -f /sys/fs/cgroup/cgroup.controllers ] || mount -t cgroup2 none /sys/fs/cgroup 2>/dev/null
        echo +memory >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null
    fi
    sd_begin "systemctl kill -s KILL on the service $kills time(s) while swap holds 2x RAM ($mode)" || return
    swapsize=$((($(meminfo_kb MemTotal) / 1024 * 2 + 1023) / 1024 * 1024))M
    sd_unit "$swapsize" keep
    if ! sd_ctl start uzram-vm.service >>"$log" 2>&1; then
        sd_ctl status uzram-vm.service >>"$log" 2>&1
        cat $SD_ROOT/run/user/0/uzram-vm-sd.log >>"$log" 2>&1
        fail_log "$name" "$log" "systemctl start of the service failed"
        sd_stop
        return
    fi
    dev=$(sd_ctl show -p StatusText --value uzram-vm.service | awk '{ print $2 }')
    UZRAM_DEV=$dev
    w=$(sd_uzram --raw --noheadings -o PID "$dev" 2>>"$log")
    wcg=$(awk '/^0::/ { sub(/^0::/, ""); print }' "/proc/$w/cgroup" 2>/dev/null)
    if [ ! -b "$dev" ] || [ -z "$w" ] || ! swap_forbidden_in "$wcg"; then
        cat $SD_ROOT/run/user/0/uzram-vm-sd.log >>"$log" 2>&1
        fail_log "$name" "$log" "the service's device '$dev' (worker '$w' in the cgroup '$wcg'): no device, no worker, or swap allowed there (MemorySwapMax=0 did not take)"
        sd_ctl stop uzram-vm.service
        UZRAM_DEV=
        sd_stop
        return
    fi
    blocks=$(($(blockdev --getsize64 "$dev") / 4096))
    swap_begin "$dev" --discard=pages || { sd_ctl stop uzram-vm.service; UZRAM_DEV=; sd_stop; return; }
    # the daemons' log on the console as it is written (a hang leaves no other trace of it)
    tail -n 0 -f $SD_ROOT/run/user/0/uzram-vm-sd.log | sed 's/^/VM: daemon: /' &
    TAIL_PID=$!
    storm_begin
    k=0
    while [ $k -lt "$kills" ] && kill -0 $tpid 2>/dev/null; do
        # the service's supervisor, serving, with its reserve ready or its worker outside the
        # service (a kill before is a restart by systemd with the device held, which the
        # reserve is there to avoid)
        for _ in $(seq 1 600); do
            sup=$(sd_ctl show -p MainPID --value uzram-vm.service)
            res=$(sd_cover "$sup" "$dev")
            case $res in *:ready | *:serving) break ;; esac
            sleep 0.2
        done
        case $res in
        *:ready | *:serving) ;;
        *)
            sd_storm_fail "neither a ready reserve nor a worker outside the service beside supervisor $sup 120 s after kill $k ($res)"
            return
            ;;
        esac
        if [ "$mode" = storm ] && [ "${res#*:}" = serving ]; then
            # a reserve that took over serves on, outside the service, and would outlive the
            # next kill: killed first, so that each systemctl kill is a reserve's takeover (the
            # supervisor's standby takes this one over, and the supervisor starts a reserve),
            # once the supervisor keeps it as its worker and its standby is ready
            w=${res%:*}
            for _ in $(seq 1 600); do
                sup=$(sd_ctl show -p MainPID --value uzram-vm.service)
                p=$(standby_of "$sup")
                case $p in *:ready) break ;; esac
                sleep 0.2
            done
            note "$name: supervisor $sup keeps worker $w, its standby $p"
            t0=$(uptime_s)
            kill -KILL "$w"
            sd_read_wait $((16 + (k * 7919 + 3) % (blocks - 32)))
            ms=$(awk -v a="$t0" -v b="$(uptime_s)" 'BEGIN { printf "%d", (b - a) * 1000 }')
            wtimes="$wtimes${wtimes:+ }$ms"
            [ "$ms" -gt "$wworst" ] && wworst=$ms
            note "$name: the worker outside the service ($w) killed: served again after $ms ms; the standby $(grep -o 'served after .*' $SD_ROOT/run/user/0/uzram-vm-sd.log | tail -n 1)"
            for _ in $(seq 1 600); do
                res=$(sd_cover "$sup" "$dev")
                case $res in *:ready) break ;; esac
                sleep 0.2
            done
            case $res in
            *:ready) ;;
            *)
                sd_storm_fail "no ready reserve beside supervisor $sup 120 s after its worker $w was killed ($res)"
                return
                ;;
            esac
        fi
        if [ "$mode" = gentle ]; then
            kill -STOP $tpid
            sleep 1
        fi
        note "$name: kill $((k + 1)): supervisor $sup, cover $res"
        t0=$(uptime_s)
        sd_ctl kill -s KILL uzram-vm.service >>"$log" 2>&1
        # systemctl returns once the manager has sent the signals: the deaths (the command
        # itself, a new program started in the storm, can take seconds before)
        t1=$(uptime_s)
        k=$((k + 1))
        # served again: a direct read issued after the kill returns (a block away from where
        # swap starts, somewhere else each time)
        sd_read_wait $((16 + (k * 7919) % (blocks - 32)))
        ms=$(awk -v a="$t1" -v b="$(uptime_s)" 'BEGIN { printf "%d", (b - a) * 1000 }')
        cms=$(awk -v a="$t0" -v b="$(uptime_s)" 'BEGIN { printf "%d", (b - a) * 1000 }')
        ctimes="$ctimes${ctimes:+ }$cms"
        if kill -0 $rpid 2>/dev/null; then
            # not served 30 s on: what the new supervisor and worker do, and who waits
            cat $SD_ROOT/run/user/0/uzram-vm-sd.log >>"$log" 2>&1
            sd_ctl status uzram-vm.service >>"$log" 2>&1
            for p in $(pgrep uzram); do
                echo "--- $p $(tr '\0' ' ' </proc/$p/cmdline | cut -c1-120): $(awk '$1 == "State:" { print $2 }' /proc/$p/status)" >>"$log"
                for t in /proc/$p/task/*; do echo "  ${t##*/} $(cat $t/comm) $(cat $t/wchan 2>/dev/null)"; cat $t/stack 2>/dev/null | head -n 12; done >>"$log"
            done
            echo w >/proc/sysrq-trigger
            kill -CONT $tpid
            echo "$hung0" >/proc/sys/kernel/hung_task_timeout_secs
            fail_log "$name" "$log" "$dev not served again 30 s after systemctl kill $k (supervisor $sup -> $(sd_ctl show -p MainPID --value uzram-vm.service))"
            sd_stop
            return
        fi
        kill -CONT $tpid
        sup1=
        for _ in $(seq 1 100); do
            sup1=$(sd_ctl show -p MainPID --value uzram-vm.service)
            [ -n "$sup1" ] && [ "$sup1" != 0 ] && [ "$sup1" != "$sup" ] && break
            sleep 0.1
        done
        echo "kill $k: supervisor $sup (cover $res) -> ${sup1:-none}, served again after $ms ms" >>"$log"
        note "$name: kill $k: served again $ms ms after the deaths ($cms ms after systemctl kill began), supervisor now ${sup1:-none}; the reserve $(grep -o 'served after .*' $SD_ROOT/run/user/0/uzram-vm-sd.log | tail -n 1)"
        if [ -z "$sup1" ] || [ "$sup1" = 0 ] || [ "$sup1" = "$sup" ]; then
            kill -KILL $tpid
            echo "$hung0" >/proc/sys/kernel/hung_task_timeout_secs
            swapoff "$dev" 2>/dev/null
            cat $SD_ROOT/run/user/0/uzram-vm-sd.log >>"$log" 2>&1
            sd_ctl status uzram-vm.service >>"$log" 2>&1
            sd_messages
            fail_log "$name" "$log" "systemd did not restart the service after systemctl kill $k (supervisor $sup -> ${sup1:-none})"
            sd_ctl stop uzram-vm.service
            UZRAM_DEV=
            sd_stop
            return
        fi
        times="$times${times:+ }$ms"
        [ "$ms" -gt "$worst" ] && worst=$ms
        sleep 2
    done
    wait $tpid
    rc=$?
    kill $TAIL_PID 2>/dev/null
    echo "$hung0" >/proc/sys/kernel/hung_task_timeout_secs
    grep '^vmtool' "$log" | sed 's/^/VM: /'
    oom1=$(dmesg | grep -c -e 'Killed process' -e 'SIGBUS')
    # the restarted supervisors that kept a reserve serving as their worker
    back=$(grep -c 'the reserve serves on as its worker' $SD_ROOT/run/user/0/uzram-vm-sd.log)
    wf=$(sd_uzram attr "$dev" io_stat 2>/dev/null | awk '{ print $2 }')
    echo "restart times (ms): $times; reserves kept as the worker: $back; failed writes $wf" >>"$log"
    swapoff "$dev" >>"$log" 2>&1
    SWAP_DEV=
    cat $SD_ROOT/run/user/0/uzram-vm-sd.log >>"$log" 2>&1
    sd_ctl stop uzram-vm.service >>"$log" 2>&1
    UZRAM_DEV=
    sd_stop
    [ -n "$wtimes" ] && wnote=", and that worker was killed before the next systemctl kill (the standby of its supervisor took over in $wtimes ms, worst $wworst)"
    if [ $rc != 0 ]; then
        [ $rc -gt 128 ] && dmesg | tail -n 15 >>"$log"
        fail_log "$name" "$log" "vmtool swapfill $fill MiB exited $rc after $k kill(s) (1: data mismatch, >128: killed)"
    elif [ "$oom1" != "$oom0" ]; then
        dmesg | grep -e 'Killed process' -e 'SIGBUS' | tail -n 5 >>"$log"
        fail_log "$name" "$log" "a process was killed while the service restarted"
    elif [ "$worst" -gt 2000 ] || [ "$wworst" -gt 2000 ]; then
        fail_log "$name" "$log" "the device was served again $worst ms after a systemctl kill (times: $times ms), $wworst ms after a kill of the worker outside (times: ${wtimes:-none})"
    elif [ "$back" -lt "$k" ]; then
        fail_log "$name" "$log" "$back of $k restarted supervisors kept the reserve that served as their worker"
    elif [ $k -lt "$kills" ]; then
        fail_log "$name" "$log" "the program finished after $k of $kills kills: too little to prove anything"
    else
        pass "$name" "$fill MiB (2x MemAvailable) through swap on uzram@'s service, systemctl kill -s KILL $k time(s) while it ran ($mode): every page verified, no process killed, time from the deaths to the device serving again (the reserve's takeover): $times ms (worst $worst; from the start of the systemctl command: $ctimes ms); each restarted supervisor kept the reserve serving as its worker ($back)$wnote; failed writes $wf"
    fi
}

# check_generator: the generator's units under the user manager. `uzram generator` reads a
# zram-generator.conf ([zram0], ram / 2, priority 77) into a directory; its uzram@zram0 drop-in
# (with contrib's uzram@.service, as the package installs it) and its uzram-prepare@zram0.service
# are started there: /dev/ublkb0 must serve with swap made on it. A user manager has no swap
# units: swapon with the generated dev-ublkb0.swap's Priority= and Options= stands in for it
# (`systemd-analyze verify` reads that unit in the host tests: in the chroot it cannot run, the
# host's root being read-only). 32 MiB pushed out to that swap must verify after
# `systemctl restart uzram@zram0` (the device and its pages handed over) and the prepare unit
# started again (it must leave the swap alone).
check_generator() {
    local name=generator log=$UZ_TMP/generator.log gen=/run/user/0/gen groot=/run/user/0/groot
    local units=$SD_ROOT/run/user/0/systemd/user dev=/dev/ublkb0 slog=$SD_ROOT/run/user/0/uzram-gen.log
    local prio opts hpid rc sup sup1 lines size bad=
    sd_begin "the generator's units from a zram-generator.conf, started by systemd" || return
    mkdir -p $SD_ROOT$groot/etc/systemd $SD_ROOT$groot/proc
    cp /proc/meminfo $SD_ROOT$groot/proc/meminfo
    printf '[zram0]\nzram-size = ram / 2\ncompression-algorithm = lz4\nswap-priority = 77\n' >$SD_ROOT$groot/etc/systemd/zram-generator.conf
    chroot $SD_ROOT env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin ZRAM_GENERATOR_ROOT=$groot \
        "${UZRAM_VM_DIR#/host}/cache/uzram" generator $gen /run/user/0/early /run/user/0/late >>"$log" 2>&1
    (cd $SD_ROOT$gen && find . -type f -exec sh -c 'echo "== $1"; cat "$1"' _ {} \; && find . -type l) >>"$log" 2>&1
    sed -e "s|/usr/local/bin/uzram|${UZRAM_VM_DIR#/host}/cache/uzram|" \
        "$UZRAM_VM_DIR/../../contrib/systemd/uzram@.service" >$units/uzram@.service
    cp -r $SD_ROOT$gen/uzram@zram0.service.d $SD_ROOT$gen/uzram-prepare@zram0.service $units/ 2>>"$log"
    printf '[Service]\nStandardError=append:/run/user/0/uzram-gen.log\n' >$units/uzram@zram0.service.d/log.conf 2>>"$log"
    mkdir -p $units/uzram-prepare@zram0.service.d
    printf '[Service]\nStandardOutput=append:/run/user/0/uzram-prep.log\n' >$units/uzram-prepare@zram0.service.d/log.conf
    sd_ctl daemon-reload >>"$log" 2>&1
    if ! sd_ctl start uzram-prepare@zram0.service >>"$log" 2>&1 ||
        [ "$(dd if=$dev bs=1 skip=4086 count=10 2>/dev/null)" != SWAPSPACE2 ]; then
        sd_ctl status uzram@zram0.service uzram-prepare@zram0.service >>"$log" 2>&1
        cat "$slog" >>"$log" 2>&1
        sd_messages
        fail_log "$name" "$log" "uzram-prepare@zram0 did not bring up $dev with swap on it${bad}"
        sd_ctl stop uzram@zram0.service >/dev/null 2>&1
        sd_stop
        return
    fi
    UZRAM_DEV=$dev
    prio=$(sed -n 's/^Priority=//p' $SD_ROOT$gen/dev-ublkb0.swap)
    opts=$(sed -n 's/^Options=//p' $SD_ROOT$gen/dev-ublkb0.swap)
    [ "$prio" = 77 ] || bad="$bad; the swap unit's priority is '$prio', not 77"
    lines=$(grep -c . $SD_ROOT$gen/dev-ublkb0.swap)
    # ram / 2: MemTotal in whole MiB, halved (a size within a MiB of it)
    size=$(sd_uzram attr $dev disksize 2>>"$log")
    awk -v d="$size" -v r=$(($(meminfo_kb MemTotal) / 1024)) \
        'BEGIN { x = d - r / 2 * 1048576; exit !(d > 0 && x < 1048576 && x > -1048576) }' ||
        bad="$bad; disksize '$size' is not ram / 2"
    swapon -p "$prio" ${opts:+-o "$opts"} $dev >>"$log" 2>&1 || bad="$bad; swapon failed"
    "$TOOL" swaphold 32 $((SEED + 11)) >"$log.hold" 2>&1 &
    hpid=$!
    held_or_gone "$log.hold" $hpid 120 || bad="$bad; vmtool swaphold did not hold"
    cat "$log.hold" >>"$log"
    sup=$(sd_ctl show -p MainPID --value uzram@zram0.service)
    sd_ctl restart uzram@zram0.service >>"$log" 2>&1 || bad="$bad; systemctl restart failed"
    sup1=$(sd_ctl show -p MainPID --value uzram@zram0.service)
    [ "$sup1" != "$sup" ] || bad="$bad; the supervisor ($sup) was not replaced"
    grep -q 'systemd restarts the service: handing the device over' "$slog" ||
        bad="$bad; the restart did not hand the device over"
    sd_ctl restart uzram-prepare@zram0.service >>"$log" 2>&1 || bad="$bad; the prepare unit failed when started again"
    cat $SD_ROOT/run/user/0/uzram-prep.log >>"$log" 2>&1
    grep -q "^$dev: written before .*left as it is" $SD_ROOT/run/user/0/uzram-prep.log ||
        bad="$bad; the prepare unit started again did not say it left $dev as it is"
    grep -q "^$dev: swap made" $SD_ROOT/run/user/0/uzram-prep.log || bad="$bad; the first prepare did not say it made swap"
    grep -q "^$dev " /proc/swaps || bad="$bad; $dev is no longer swap"
    kill -USR1 $hpid 2>/dev/null
    wait $hpid
    rc=$?
    cat "$log.hold" >>"$log"
    [ $rc = 0 ] || bad="$bad; vmtool swaphold exited $rc (1: a page read back wrong)"
    swapoff $dev >>"$log" 2>&1 || bad="$bad; swapoff failed"
    cat "$slog" >>"$log" 2>&1
    sd_ctl stop uzram-prepare@zram0.service uzram@zram0.service >>"$log" 2>&1
    for _i in $(seq 1 100); do [ -b $dev ] || break; sleep 0.1; done
    [ -b $dev ] && bad="$bad; systemctl stop left $dev"
    UZRAM_DEV=
    sd_stop
    if [ -n "$bad" ]; then
        fail_log "$name" "$log" "${bad#; }"
        return
    fi
    pass "$name" "zram-generator.conf [zram0] -> uzram@zram0 + uzram-prepare@zram0 (swap made; swap on as the ${lines}-line dev-ublkb0.swap says, priority 77); 32 MiB swapped out verified across systemctl restart uzram@zram0 (supervisor $sup -> $sup1), the prepare unit again left the swap alone"
}
