#!/bin/sh
# The checks of `tests/vm/run boot` in the guest's real Debian root, run by uzram-vmboot.service
# at each boot; /var/lib/uzram-vmboot counts the boots and keeps the verdicts across them.
#   boot 1: zram-generator.conf's [zram0] is swap on /dev/ublkb0 (ram / 2, priority 100) through
#           the package's generator, its units active; man uzram and bash's completion work; a
#           program's pages (MemAvailable and a tenth) pushed through that swap verify after a
#           `systemctl restart uzram@zram0` and a `kill -9` of its supervisor, with no swap write
#           failed; `systemctl hibernate` with pages on uzram (the image on the disk swap
#           /dev/vdb, the guest powered off and resumed by tests/vm/run), every page verified;
#           then a reboot
#   boot 2: the same swap is back; ublk_drv blocked for the next boot; a reboot
#   boot 3: without ublk_drv, uzram@zram0 failed saying why and the system booted on without
#           that swap; ublk_drv loaded, `systemctl start dev-ublkb0.swap` brings it on;
#           `dpkg --purge uzram` with that swap on; a reboot
#   boot 4: no uzram unit, device or file of the package is left; the verdict; power off
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
    for b in 1 2 3; do grep -qx "boot$b" $state/done || fail "boot $b did not finish its checks"; done
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
    hibernate
    echo boot1 >>$state/done
    systemctl reboot
}

# since_mark TEXT: the lines of stdin (dmesg) after the last one that holds TEXT (the same as
# guest/checks/sleep.sh's: this script runs in the guest's own root, without the host's tree)
since_mark() {
    awk -v m="$1" 'index($0, m) { n = 0; delete l; next } { l[++n] = $0 } END { for (i = 1; i <= n; i++) print l[i] }'
}

# hibernate: `systemctl hibernate` with a program's pages on uzram, as a laptop with swap on
# uzram and a disk swap partition for the image does it. Nothing of uzram is enabled by hand:
# the generator pulled uzram-hibernate.service in (it swaps uzram off first, the pages back into
# RAM, and on again after the resume). The guest powers off once the image is on /dev/vdb;
# tests/vm/run boots it again, and the initramfs resumes the image before the root is mounted.
hibernate() {
    local_bad=
    if ! grep -qw disk /sys/power/state; then
        fail "hibernate: no 'disk' in /sys/power/state"
        return
    fi
    [ "$(systemctl is-enabled uzram-hibernate.service 2>/dev/null)" = enabled ] &&
        local_bad="$local_bad; uzram-hibernate.service enabled by hand, so the generator's link proves nothing"
    req=/run/systemd/generator/systemd-hibernate.service.requires/uzram-hibernate.service
    [ -L $req ] || local_bad="$local_bad; the generator did not pull uzram-hibernate.service in ($req)"
    # (without the hook the image's preallocation would write swap to a frozen daemon)
    if [ -n "$local_bad" ]; then
        fail "hibernate: not tried: ${local_bad#; }"
        return
    fi
    if ! mkswap /dev/vdb >/tmp/hib-mkswap.log 2>&1 || ! swapon -p 0 /dev/vdb 2>>/tmp/hib-mkswap.log; then
        cat /tmp/hib-mkswap.log
        fail "hibernate: no disk swap on /dev/vdb for the image"
        return
    fi
    avail=$(($(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo) / 1024))
    hold=$((avail / 4))
    vmtool swaphold $hold 78 >/tmp/hib-hold.log 2>&1 &
    hpid=$!
    i=0
    while [ $i -lt 1500 ] && ! grep -q held /tmp/hib-hold.log && kill -0 $hpid 2>/dev/null; do
        sleep 0.2
        i=$((i + 1))
    done
    on_uzram=$(awk '$1 == "/dev/ublkb0" { print int($4 / 1024) }' /proc/swaps)
    # with no page on uzram the hook would swap off an empty device: nothing proved
    if ! grep -q held /tmp/hib-hold.log || [ "${on_uzram:-0}" -lt $((hold / 2)) ]; then
        cat /tmp/hib-hold.log
        kill $hpid 2>/dev/null
        swapoff /dev/vdb
        fail "hibernate: not tried: the program's pages are not on /dev/ublkb0 (${on_uzram:-0} MiB there, $hold MiB held)"
        return
    fi
    mark="uzram-vmboot: hibernating at $(uptime_s)"
    echo "$mark" >/dev/kmsg
    echo 1 >/sys/power/pm_debug_messages 2>/dev/null
    t0=$(uptime_s)
    sync
    # tests/vm/run's cue: the guest powers off once the image is written; boot it again
    echo "UZRAM-VM-HIBERNATING boot1"
    systemctl hibernate >/tmp/hib-systemctl.log 2>&1 || local_bad="$local_bad; systemctl hibernate: $(cat /tmp/hib-systemctl.log)"
    # back from the image (the kernel says so), and uzram's post hook done (its unit stopped);
    # a hook or a hibernation that failed ends the wait at once
    i=0
    hook= sleeping=
    while [ -z "$local_bad" ] && [ $i -lt 3000 ]; do
        hook=$(systemctl is-active uzram-hibernate.service)
        sleeping=$(systemctl is-active systemd-hibernate.service)
        [ "$hook" = failed ] || [ "$sleeping" = failed ] && break
        if dmesg | since_mark "$mark" | grep -qiE 'image restored successfully|hibernation exit'; then
            [ "$hook" = inactive ] && [ "$sleeping" != activating ] && break
        fi
        sleep 0.2
        i=$((i + 1))
    done
    [ "$hook" = failed ] && local_bad="$local_bad; uzram-hibernate.service failed"
    [ "$sleeping" = failed ] && local_bad="$local_bad; systemd-hibernate.service failed"
    t1=$(uptime_s)
    echo 0 >/sys/power/pm_debug_messages 2>/dev/null
    restored=$(dmesg | since_mark "$mark" | grep -ci 'image restored successfully')
    [ "$restored" -gt 0 ] || local_bad="$local_bad; the kernel did not say it restored an image (hibernation failed, or was not a real one)"
    grep -q '^/dev/ublkb0 ' /proc/swaps || local_bad="$local_bad; /dev/ublkb0 is not swap again after the resume"
    kill -USR1 $hpid 2>/dev/null
    wait $hpid
    rc=$?
    cat /tmp/hib-hold.log
    [ $rc = 0 ] || local_bad="$local_bad; vmtool swaphold exited $rc (1: a page read back wrong)"
    swapoff /dev/vdb
    if [ -z "$local_bad" ]; then
        pass "hibernate: systemctl hibernate with $hold MiB held ($on_uzram MiB on /dev/ublkb0), the generator's uzram-hibernate.service around it: image on /dev/vdb, powered off, resumed, /dev/ublkb0 swap again; every page verified ($(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') s of guest time)"
    else
        journalctl -b --no-pager -u uzram-hibernate.service -u systemd-hibernate.service | tail -n 30
        dmesg | since_mark "$mark" | grep -iE 'PM:|error|fail' | tail -n 20
        fail "hibernate: ${local_bad#; }"
    fi
}

boot2() {
    if grep -q '^/dev/ublkb0 ' /proc/swaps && [ "$(systemctl is-active dev-ublkb0.swap)" = active ]; then
        pass "reboot: /dev/ublkb0 is swap again"
    else
        fail "reboot: no swap on /dev/ublkb0 after the reboot"
    fi
    # the next boot without ublk_drv (a kernel without it, or a module that fails to load)
    echo 'install ublk_drv /bin/false' >/etc/modprobe.d/uzram-vmboot-no-ublk.conf
    echo boot2 >>$state/done
    systemctl reboot
}

# boot3: booted without ublk_drv: uzram's service fails saying why, its swap is not on, and
# the system boots on (these checks run after multi-user.target); then the swap by hand once the
# driver is back, and the purge with it on
boot3() {
    local_bad=
    # Restart=on-failure starts it again a few times before systemd gives up on it: failed once
    # it has (the state read once, so that the message names the state that failed the check)
    i=0
    st=$(systemctl is-active uzram@zram0.service)
    while [ "$st" != failed ] && [ $i -lt 150 ]; do
        sleep 0.2
        i=$((i + 1))
        st=$(systemctl is-active uzram@zram0.service)
    done
    [ "$st" = failed ] || local_bad="$local_bad; uzram@zram0.service is $st 30 s on, not failed"
    journalctl -b --no-pager -u uzram@zram0.service | grep -q 'no ublk driver' ||
        local_bad="$local_bad; its journal does not say the ublk driver is missing"
    [ "$(systemctl is-active dev-ublkb0.swap)" != active ] && ! grep -q '^/dev/ublkb' /proc/swaps ||
        local_bad="$local_bad; a uzram swap is on"
    [ -e /dev/ublkb0 ] && local_bad="$local_bad; /dev/ublkb0 exists"
    if [ -z "$local_bad" ]; then
        pass "no ublk_drv at boot: uzram@zram0 failed saying so ($(journalctl -b --no-pager -o cat -u uzram@zram0.service | grep -m 1 -o 'no ublk driver[^:]*')), no swap on uzram, multi-user reached at $(uptime_s) s"
    else
        systemctl status --no-pager uzram@zram0.service dev-ublkb0.swap 2>&1 | tail -n 20
        fail "no ublk_drv at boot: ${local_bad#; }"
    fi
    # the driver back, then the swap started by hand: the units recover without a reboot
    rm -f /etc/modprobe.d/uzram-vmboot-no-ublk.conf
    systemctl reset-failed
    if modprobe ublk_drv && systemctl start dev-ublkb0.swap && grep -q '^/dev/ublkb0 ' /proc/swaps; then
        pass "ublk_drv loaded again: systemctl start dev-ublkb0.swap brings the swap on"
    else
        systemctl status --no-pager uzram@zram0.service uzram-prepare@zram0.service dev-ublkb0.swap 2>&1 | tail -n 30
        fail "ublk_drv loaded again: systemctl start dev-ublkb0.swap did not bring the swap on"
    fi
    dpkg -L uzram >$state/files
    if dpkg --purge uzram >$state/purge.log 2>&1; then
        pass "dpkg --purge uzram (with its swap on: it stays until the reboot)"
    else
        cat $state/purge.log
        fail "dpkg --purge uzram failed"
    fi
    echo boot3 >>$state/done
    systemctl reboot
}

boot4() {
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
4) boot4 ;;
*)
    fail "boot $boot: the checks ended after boot 4"
    finish
    ;;
esac
