#!/bin/sh
# Runs the device checks and prints one PASS/FAIL/SKIP line each, then the verdict line
# "UZRAM-VM-RESULT: PASS|FAIL n=<checks run> fail=<failed> skip=<skipped>".
# In the guest (started by guest/init) or on a host (tests/vm/run --host check): see lib.sh for
# the environment. UZRAM_VM_CHECKS="fio ext4 swap discard" picks a subset.
D=$(dirname "$0")
. "$D/lib.sh"
. "$D/checks.sh"

CHECKS=${UZRAM_VM_CHECKS:-fio ext4 swap churn discard attrs recompress writeback tier setup badinput swapoffmkfs sigterm kill recover1 recover10 upgrade corrupt systemd generator sleep hibernate}
# In the guest, a check still running after CHECK_LIMIT seconds is taken for a hang (the
# kernel's hung-task watchdog sees only tasks in D state, not a spinning one or an
# interruptible wait): the guest's state goes to the console, the check FAILs and the guest
# powers off, minutes after the hang instead of at the host's timeout. Each `want` that says
# yes re-arms it for the next check (a loop of runs re-arms it each pass). Never on a host:
# it powers off.
CHECK_LIMIT=${UZRAM_VM_CHECK_LIMIT:-600}
WATCH_PID=
# Each check's time, printed at the end (what CI's time is spent on): kernel zram's reference
# checks are named zram-NAME.
TIMED= TIMED_T0= TIMES= TIME_PREFIX=
timed_end() {
    [ -n "$TIMED" ] && TIMES="$TIMES $TIMED $(elapsed "$TIMED_T0");"
    TIMED=
}
want() {
    case " $CHECKS " in *" $1 "*) ;; *) return 1 ;; esac
    disarm
    # (a check asked for again, as a loop of runs does, goes on with its time)
    if [ "$TIMED" != "$TIME_PREFIX$1" ]; then
        timed_end
        TIMED=$TIME_PREFIX$1 TIMED_T0=$(uptime_s)
    fi
    if [ "$UZRAM_VM_MODE" = guest ]; then
        watch_check "$1" &
        WATCH_PID=$!
    fi
    return 0
}

# UZRAM_VM_REFERENCE="swap": which of kernel zram's reference checks run beside uzram's (by
# default all of them): the kernel matrix in CI keeps swap's, whose figure after the program
# exits uzram's is held to (swap-exit).
REFERENCE=$(echo "${UZRAM_VM_REFERENCE:-fio ext4 swap churn discard sleep hibernate rtcwake}" | tr + ' ')
want_ref() {
    case " $REFERENCE " in *" $1 "*) want "$1" ;; *) return 1 ;; esac
}

disarm() { [ -n "$WATCH_PID" ] && kill "$WATCH_PID" 2>/dev/null; WATCH_PID=; }

watch_check() { # CHECK
    # its own sleep, killed with it: a lingering sleep would hold the console's pipe
    sleep "$CHECK_LIMIT" &
    _s=$!
    trap 'kill $_s 2>/dev/null; exit 0' TERM
    wait $_s
    note "WATCHDOG: $1 still running after ${CHECK_LIMIT} s; processes, threads running or in D state, the daemons' log, the kernel's view"
    { ps -o pid,ppid,time,args 2>/dev/null || ps; } | grep -v ' \[.*\]$'
    for _t in /proc/[0-9]*/task/[0-9]*; do
        _st=$(sed 's/.*) //' "$_t/stat" 2>/dev/null | cut -d' ' -f1)
        case $_st in D | R)
            echo "---- $_t $(cat "$_t/comm" 2>/dev/null) $_st wchan $(cat "$_t/wchan" 2>/dev/null)"
            cat "$_t/stack" 2>/dev/null ;;
        esac
    done
    echo "---- the daemons' log"
    tail -n 40 "$UZRAM_LOG" 2>/dev/null
    echo 8 >/proc/sys/kernel/printk
    echo l >/proc/sysrq-trigger
    echo w >/proc/sysrq-trigger
    sleep 5
    echo "FAIL: $1 ran past ${CHECK_LIMIT} s (a hang: the state above)"
    echo "UZRAM-VM-RESULT: FAIL n=$UZ_N fail=$((UZ_FAIL + 1)) skip=$UZ_SKIP"
    poweroff -f
}

trap 'disarm; check_cleanup; zram_reset; uzram_reset' EXIT
trap 'echo "VM: interrupted"; exit 130' INT TERM

vm_setup
note "checks: $CHECKS (mode $UZRAM_VM_MODE, $(uname -r), $(nproc) cpus, MemTotal $(($(meminfo_kb MemTotal) / 1024)) MiB)"
T0=$(uptime_s)
# One MemAvailable for every swap workload, taken before any device exists: kernel zram and
# uzram (whose daemon holds memory of its own) get the same workload.
if [ "$UZRAM_VM_MODE" = guest ]; then
    sync
    echo 3 >/proc/sys/vm/drop_caches
    SWAP_AVAIL_MIB=$(($(meminfo_kb MemAvailable) / 1024))
    note "MemAvailable before any device: $SWAP_AVAIL_MIB MiB"
fi

# UZRAM_VM_BREAK=hang (guest only): a writer blocked on a frozen ext4 sits in D state; the
# kernel's hung-task detector must panic the guest, and run must fail within about 4 minutes.
if [ "$UZRAM_VM_BREAK" = hang ] && [ "$UZRAM_VM_MODE" = guest ] && zram_begin && zram_setup lz4 64M; then
    note "UZRAM_VM_BREAK=hang: blocking a writer on a frozen ext4 (expect a hung-task panic)"
    mkdir -p /mnt/frozen && mke2fs -q -t ext4 /dev/zram0 && mount /dev/zram0 /mnt/frozen &&
        fsfreeze --freeze /mnt/frozen && echo x >/mnt/frozen/f
fi

# (Not on a run that breaks uzram on purpose: only uzram's failure is wanted there.)
case ${UZRAM_VM_BREAK:-0} in 0 | "" | hang) reference=1 ;; *) reference= ;; esac

# ---- kernel zram: the reference the uzram device is held to ----
# After uzram's checks, in the same guest: a uzram swap storm started right after kernel
# zram's own swap checks has seen more failed writes than the check allows (ENOMEM: the
# memory thread's arenas took 2-3 s to map while the guest was squeezed), so uzram's checks
# run first and hold their figures to zram's here (UZRAM_VM_REFERENCE_FIRST=1 runs zram's
# first, to see that case).
zram_reference() {
    [ -n "$reference" ] && zram_begin || return 0
    TIME_PREFIX=zram-
    if want_ref fio; then
        zram_setup lz4 256M && check_fio /dev/zram0 zram-
        if zram_has_algo zstd; then
            zram_setup zstd 256M && fio_verify /dev/zram0 zram-fio-verify-zstd libaio
        else
            skip zram-fio-verify-zstd "this kernel's zram has no zstd ($(cat $ZRAM/comp_algorithm))"
        fi
    fi
    if want_ref ext4; then
        zram_setup lz4 256M && check_ext4 /dev/zram0 zram-
    fi
    if want_ref swap; then
        # in the guest twice its RAM: all that the check pushes out fits, compressed or not
        swapsize=1024M
        [ "$UZRAM_VM_MODE" = guest ] && swapsize=$((($(meminfo_kb MemTotal) / 1024 * 2 + 1023) / 1024 * 1024))M
        zram_setup lz4 $swapsize && check_swap /dev/zram0 zram-
    fi
    if want_ref churn; then
        zram_setup lz4 1024M && check_churn /dev/zram0 zram-
    fi
    if want_ref discard; then
        zram_setup lz4 256M && check_discard /dev/zram0 zram-
    fi
    if want_ref sleep; then
        zram_setup lz4 1024M && check_sleep /dev/zram0 zram-
    fi
    zram_reset
    timed_end
    TIME_PREFIX=
}

[ "${UZRAM_VM_REFERENCE_FIRST:-0}" = 1 ] && zram_reference

# ---- uzram's ublk device: the same check functions, prefix "" ----
if [ "$UZRAM_VM_MODE" = guest ] && uzram_begin; then
    if want fio; then
        uzram_setup lz4 256M && check_fio "$UZRAM_DEV" ""
    fi
    if want ext4; then
        uzram_setup lz4 256M && check_ext4 "$UZRAM_DEV" ""
    fi
    if want swap; then
        swapsize=1024M
        [ "$UZRAM_VM_MODE" = guest ] && swapsize=$((($(meminfo_kb MemTotal) / 1024 * 2 + 1023) / 1024 * 1024))M
        # UZRAM_VM_SWAP_RUNS=N: uzram's swap check N times (a flake hunt)
        for _ in $(seq "${UZRAM_VM_SWAP_RUNS:-1}"); do
            want swap
            uzram_setup lz4 $swapsize && check_swap "$UZRAM_DEV" ""
        done
    fi
    want stormstart && check_stormstart
    want soak && check_soak
    if want churn; then
        uzram_setup lz4 1024M && check_churn "$UZRAM_DEV" ""
    fi
    if want discard; then
        uzram_setup lz4 256M && check_discard "$UZRAM_DEV" ""
    fi
    if want attrs; then
        zram_setup lz4 64M
        uzram_setup lz4 256M && check_attrs "$UZRAM_DEV"
        zram_reset
    fi
    want recompress && check_recompress
    if want writeback; then
        # the backing file's filesystem: the scratch disk when there is one (as on a real
        # system), else kernel zram
        if [ -b /dev/vda ]; then
            # UZRAM_VM_WRITEBACK_RUNS=N: the check N times (a flake hunt)
            for _ in $(seq "${UZRAM_VM_WRITEBACK_RUNS:-1}"); do
                want writeback
                check_writeback /dev/vda
            done
        else
            zram_setup lz4 256M && check_writeback /dev/zram0
            zram_reset
        fi
    fi
    want tier && check_tier
    want setup && check_setup
    want badinput && check_badinput
    want swapoffmkfs && check_swapoffmkfs
    want sigterm && check_sigterm
    want kill && check_kill
    want recover1 && check_recover recover1 1 storm
    want recover10 && check_recover recover10 10 shell
    want recovergentle && check_recover recovergentle 3 gentle
    want upgrade && check_upgrade
    want corrupt && check_corrupt
    want systemd && check_systemd
    want generator && check_generator
    want recoversd && check_recoversd recoversd 3 gentle
    want recoversdstorm && check_recoversd recoversdstorm 10 storm
    if want sleep; then
        # UZRAM_VM_SLEEP_RUNS=N: the check N times (a flake hunt)
        for _ in $(seq "${UZRAM_VM_SLEEP_RUNS:-1}"); do
            want sleep
            uzram_setup lz4 1024M && check_sleep "$UZRAM_DEV" ""
        done
    fi
    uzram_reset
fi

[ "${UZRAM_VM_REFERENCE_FIRST:-0}" = 1 ] || zram_reference

# ---- a real hibernation and suspend, kernel zram then uzram: last, as the host's root does not
# come back after either. rtcwake is not in the default list: after a suspend to RAM under QEMU
# the guest cannot power off (ACPI: "Could not disable RealTimeClock events"; a hibernation's
# power-off after it halted instead), so a run with it ends at its TIMEOUT ----
if { want hibernate || want rtcwake; } && [ "$UZRAM_VM_MODE" = guest ]; then
    if ! hib_tools; then
        fail hibernate "could not copy the hibernation's tools into the guest's RAM"
    else
        # hibernations first: after a suspend to RAM the guest cannot power off
        for _c in hibernate rtcwake; do
            case " $CHECKS " in *" $_c "*) ;; *) continue ;; esac
            TIME_PREFIX=zram-
            if want_ref $_c && zram_begin; then
                zram_setup lz4 1024M && check_$_c /dev/zram0 zram-
                zram_reset
            fi
            TIME_PREFIX=
            want $_c
            # the daemon from the copy in RAM
            if uzram_begin; then
                uzram_setup lz4 1024M && check_$_c "$UZRAM_DEV" ""
                uzram_reset
            fi
        done
    fi
fi

disarm
timed_end
note "checks done in $(elapsed "$T0") s; each check's seconds:$TIMES"
vm_result
