#!/bin/sh
# The checks of `tests/vm/run boot` in the guest's real Debian root, run by uzram-vmboot.service
# at each boot; /var/lib/uzram-vmboot counts the boots and keeps the verdicts across them.
#   boot 1: zram-generator.conf's [zram0] is swap on /dev/ublkb0 (ram / 2, priority 100) through
#           the package's generator, its units active; man uzram and bash's completion work; a
#           program's pages (MemAvailable and a tenth) pushed through that swap verify after a
#           `systemctl restart uzram@zram0` and a `kill -9` of its supervisor, with no swap write
#           failed; then a reboot
#   boot 2: the same swap is back; `dpkg --purge uzram`; a reboot
#   boot 3: no uzram unit, device or file of the package is left; the verdict; power off
set -u
state=/var/lib/uzram-vmboot
mkdir -p $state
boot=$(($(cat $state/boots 2>/dev/null || echo 0) + 1))
echo $boot >$state/boots
uptime_s() { cut -d' ' -f1 /proc/uptime; }
pass() { echo "PASS: $*"; echo pass >>$state/results; }
fail() { echo "FAIL: $*"; echo fail >>$state/results; }
finish() {
    # a boot that ended early (a panic, a reboot) left its checks unrun
    for b in 1 2; do grep -qx "boot$b" $state/done || fail "boot $b did not finish its checks"; done
    n=$(grep -c . $state/results)
    f=$(grep -c fail $state/results)
    if [ "$f" = 0 ]; then echo "UZRAM-VM-RESULT: PASS n=$n fail=0"; else echo "UZRAM-VM-RESULT: FAIL n=$n fail=$f"; fi
    systemctl poweroff
    exit 0
}
echo "VM: boot $boot of the real root ready at $(uptime_s) s"

# wait_active UNIT SECS OLDPID: the unit active with a main pid other than OLDPID
wait_active() {
    i=0
    while [ $i -lt $(($2 * 5)) ]; do
        p=$(systemctl show -p MainPID --value "$1")
        [ "$(systemctl is-active "$1")" = active ] && [ "$p" != 0 ] && [ "$p" != "$3" ] && return 0
        sleep 0.2
        i=$((i + 1))
    done
    return 1
}

boot1() {
    local_bad=
    ram=$(($(awk '/^MemTotal:/ { print $2 }' /proc/meminfo) / 1024))
    line=$(swapon --show=NAME,SIZE,PRIO --bytes --noheadings | awk '$1 == "/dev/ublkb0"')
    size=$(echo "$line" | awk '{ print $2 }')
    prio=$(echo "$line" | awk '{ print $3 }')
    # swapon's SIZE is the swap area: the device less its header page
    want=$((ram * 1048576 / 2))
    [ -n "$size" ] && [ $((want - size)) -le 1048576 ] && [ $((size - want)) -le 1048576 ] ||
        local_bad="$local_bad; swapon --show says '$line', not about $want bytes"
    [ "$prio" = 100 ] || local_bad="$local_bad; priority '$prio', not 100"
    for u in uzram@zram0.service uzram-prepare@zram0.service dev-ublkb0.swap systemd-modules-load.service; do
        [ "$(systemctl is-active $u)" = active ] || local_bad="$local_bad; $u is $(systemctl is-active $u)"
    done
    on=$(systemctl show -p ActiveEnterTimestampMonotonic --value dev-ublkb0.swap)
    errors0=$(dmesg | grep -c 'Write-error on swap-device')
    if [ -z "$local_bad" ]; then
        pass "boot: /dev/ublkb0 is swap ($size bytes, priority $prio) from zram-generator.conf through uzram-generator's units, on $(awk -v u="$on" 'BEGIN { printf "%.1f", u / 1e6 }') s after the kernel started"
    else
        systemctl status --no-pager uzram@zram0.service uzram-prepare@zram0.service dev-ublkb0.swap 2>&1 | tail -n 30
        journalctl -b --no-pager | grep -i -E 'uzram|ublk' | tail -n 30
        fail "boot: ${local_bad#; }"
    fi
    if MANPAGER=cat man uzram 2>/dev/null | grep -q uzram-setup &&
        bash -c '. /usr/share/bash-completion/completions/uzram; COMP_WORDS=(uzram se); COMP_CWORD=1; _uzram uzram se uzram; printf "%s\n" "${COMPREPLY[@]}"' 2>/dev/null | grep -qx setup; then
        pass "man uzram shows the manual; bash completes 'uzram se' to setup"
    else
        fail "man uzram or bash completion"
    fi
    local_bad=
    avail=$(($(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo) / 1024))
    hold=$((avail * 11 / 10))
    vmtool swaphold $hold 77 >/tmp/hold.log 2>&1 &
    hpid=$!
    i=0
    while [ $i -lt 3000 ] && ! grep -q held /tmp/hold.log && kill -0 $hpid 2>/dev/null; do
        sleep 0.2
        i=$((i + 1))
    done
    swapped=$(awk '$1 == "/dev/ublkb0" { print int($4 / 1024) }' /proc/swaps)
    sup=$(systemctl show -p MainPID --value uzram@zram0.service)
    t0=$(uptime_s)
    systemctl restart uzram@zram0.service
    wait_active uzram@zram0.service 60 "$sup" || local_bad="$local_bad; not active again after systemctl restart"
    sup1=$(systemctl show -p MainPID --value uzram@zram0.service)
    t1=$(uptime_s)
    kill -KILL "$sup1"
    wait_active uzram@zram0.service 60 "$sup1" || local_bad="$local_bad; not restarted after kill -9 of $sup1"
    sup2=$(systemctl show -p MainPID --value uzram@zram0.service)
    t2=$(uptime_s)
    grep -q '^/dev/ublkb0 ' /proc/swaps || local_bad="$local_bad; /dev/ublkb0 is no longer swap"
    kill -USR1 $hpid 2>/dev/null
    wait $hpid
    rc=$?
    cat /tmp/hold.log
    [ $rc = 0 ] || local_bad="$local_bad; vmtool swaphold exited $rc (1: a page read back wrong)"
    if [ -z "$local_bad" ]; then
        pass "pages: $hold MiB (MemAvailable $avail MiB and a tenth; $swapped MiB of it on /dev/ublkb0) verified after systemctl restart uzram@zram0 (supervisor $sup -> $sup1, active again in $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') s) and kill -9 of the supervisor ($sup1 -> $sup2, in $(awk -v a="$t1" -v b="$t2" 'BEGIN { printf "%.1f", b - a }') s)"
    else
        journalctl -b --no-pager -u uzram@zram0.service | tail -n 40
        fail "pages: ${local_bad#; }"
    fi
    # swap writes the device refused (the kernel keeps those pages in RAM: no loss, but a
    # device that cannot take a fill at once is what the storm-start check is about)
    errors=$(($(dmesg | grep -c 'Write-error on swap-device') - errors0))
    if [ "$errors" = 0 ]; then
        pass "swap writes: none failed during the fill"
    else
        dmesg | grep -E 'kernel resource error|Write-error on swap-device' | tail -n 5
        fail "swap writes: $errors failed (Write-error on swap-device) during the fill"
    fi
    echo "SKIP: hibernate: not in this check yet"
    echo boot1 >>$state/done
    systemctl reboot
}

boot2() {
    if grep -q '^/dev/ublkb0 ' /proc/swaps && [ "$(systemctl is-active dev-ublkb0.swap)" = active ]; then
        pass "reboot: /dev/ublkb0 is swap again"
    else
        fail "reboot: no swap on /dev/ublkb0 after the reboot"
    fi
    dpkg -L uzram >$state/files
    if dpkg --purge uzram >$state/purge.log 2>&1; then
        pass "dpkg --purge uzram (with its swap on: it stays until the reboot)"
    else
        cat $state/purge.log
        fail "dpkg --purge uzram failed"
    fi
    echo boot2 >>$state/done
    systemctl reboot
}

boot3() {
    left=
    [ -e /dev/ublkb0 ] && left="$left /dev/ublkb0"
    # (uzram-vmboot.service is these checks')
    units=$(systemctl list-units --all --no-legend --plain 'uzram*' 'dev-ublkb*' |
        awk '$1 != "uzram-vmboot.service" { print $1 }' | tr '\n' ' ')
    [ -n "$units" ] && left="$left units: $units"
    while read -r f; do
        [ -f "$f" ] || [ -L "$f" ] && left="$left $f"
    done <$state/files
    if [ -z "$left" ]; then
        pass "after the purge and a reboot: no uzram unit, device or file of the package"
    else
        fail "after the purge and a reboot, left:$left"
    fi
    finish
}

case $boot in
1) boot1 ;;
2) boot2 ;;
3) boot3 ;;
*)
    fail "boot $boot: the checks ended after boot 3"
    finish
    ;;
esac
