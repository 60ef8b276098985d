# shellcheck shell=bash
# `tests/vm/run boot` (sourced by tests/vm/run): the Debian package in a real Debian userspace
# booted with systemd as PID 1. The root file system is made by mmdebstrap from this machine's
# own apt source (bookworm, minbase, systemd), with the package installed by dpkg -i, the guest
# kernel's ublk_drv (loaded by the package's modules-load.d), a stock zram-generator.conf
# ([zram0], ram / 2, zstd) and guest/sysboot/'s checks, which run at each of four boots (and a
# resume from hibernation) and print their PASS/FAIL lines on the console (see
# guest/sysboot/vmboot.sh).

SYSBOOT_PACKAGES=systemd-sysv,udev,kmod,util-linux,procps,bash-completion,man-db,e2fsprogs

# apt_uri: the URI of this machine's apt source for bookworm (deb822 stanzas, or one-line
# entries whose [options] are skipped)
apt_uri() {
    local u
    u=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '
        /^[ \t]*$/ { uri = ""; suites = ""; next }
        $1 == "URIs:" { uri = $2 }
        $1 == "Suites:" { suites = " " $0 " " }
        uri != "" && suites ~ / bookworm / { print uri; exit }' || true)
    [ -n "$u" ] || u=$(awk '$1 == "deb" { i = 2; if ($2 ~ /^\[/) while ($i !~ /\]$/) i++; if ($2 ~ /^\[/) i++
        if ($(i + 1) == "bookworm") { print $i; exit } }' /etc/apt/sources.list 2>/dev/null || true)
    [ -n "$u" ] || die "no apt source for bookworm on this machine for mmdebstrap"
    echo "$u"
}

# build_sysroot DEB: $CACHE/sysroot.img, an ext4 image of the root described above
build_sysroot() {
    local deb=$1 dir t
    t=$(now)
    dir=$(mktemp -d)
    # shellcheck disable=SC2064 # the directory as it is now
    trap "rm -rf '$dir'" EXIT
    mmdebstrap --variant=minbase --include="$SYSBOOT_PACKAGES" \
        --customize-hook="copy-in $deb /tmp" \
        --customize-hook="chroot \"\$1\" dpkg -i /tmp/${deb##*/}" \
        --customize-hook="rm \"\$1\"/tmp/${deb##*/}" \
        bookworm "$dir" "deb $(apt_uri) bookworm main" >"$CACHE/mmdebstrap.log" 2>&1 ||
        { tail -n 20 "$CACHE/mmdebstrap.log"; die "mmdebstrap failed (log: $CACHE/mmdebstrap.log)"; }
    add_modules "$dir" ublk_drv
    install -m 755 "$CACHE/vmtool" "$dir/usr/local/bin/vmtool"
    install -m 755 "$VM/guest/sysboot/vmboot.sh" "$dir/usr/local/bin/uzram-vmboot"
    install -m 644 "$VM/guest/sysboot/uzram-vmboot.service" "$dir/etc/systemd/system/"
    mkdir -p "$dir/etc/systemd/system/multi-user.target.wants"
    ln -s ../uzram-vmboot.service "$dir/etc/systemd/system/multi-user.target.wants/uzram-vmboot.service"
    # the console is the checks': no login prompt on it
    ln -s /dev/null "$dir/etc/systemd/system/serial-getty@ttyS0.service"
    printf '[zram0]\nzram-size = ram / 2\ncompression-algorithm = zstd\n' >"$dir/etc/systemd/zram-generator.conf"
    echo uzram-vm >"$dir/etc/hostname"
    echo '/dev/vda / ext4 rw 0 1' >"$dir/etc/fstab"
    rm -f "$CACHE/sysroot.img"
    mke2fs -q -t ext4 -d "$dir" -L uzram-root "$CACHE/sysroot.img" 3G
    rm -rf "$dir"
    trap - EXIT
    say "root file system: Debian bookworm, systemd, ${deb##*/}; made in $(since "$t") s"
}

run_sysboot() {
    local log=$CACHE/console-boot.log root deb
    # mmdebstrap as another user makes the root's files theirs
    [ "$(id -u)" = 0 ] || die "run boot needs root"
    root=$(cd "$VM/../.." && pwd)
    deb=${UZRAM_VM_DEB:-}
    if [ -z "$deb" ]; then
        command -v cargo-deb >/dev/null || cargo install --quiet --locked cargo-deb@3.8.0
        (cd "$root" && packaging/deb >"$CACHE/deb.log" 2>&1) || { tail -n 20 "$CACHE/deb.log"; die "packaging/deb failed"; }
        deb=$(cat "$root/target/debian/last")
        case $deb in /*) ;; *) deb=$root/$deb ;; esac
    fi
    case $deb in /*) ;; *) deb=$PWD/$deb ;; esac
    build_sysroot "$deb"
    # /dev/vdb: the disk swap a laptop hibernates to (empty; boot 1 makes it swap), resumed
    # from by the initramfs (uzram.resume=vdb) before it mounts the root, as a distribution's does
    rm -f "$CACHE/sysswap.img"
    truncate -s 2G "$CACHE/sysswap.img"
    QARGS=(-machine "q35,accel=$ACCEL" -cpu max -smp "$CPUS" -m "${MEM_BOOT:-1G}"
        -kernel "$KDIR/boot/vmlinuz-$KVER" -initrd "$CACHE/initramfs.cpio.gz"
        -append "console=ttyS0 loglevel=4 edd=off rdinit=/init panic=-1 uzram.mode=sysboot uzram.resume=vdb systemd.show_status=error"
        -nographic -nodefaults
        -drive "file=$CACHE/sysroot.img,format=raw,if=virtio,cache=unsafe"
        -drive "file=$CACHE/sysswap.img,format=raw,if=virtio,cache=unsafe")
    say "booting $KVER into the Debian root four times, with a resume (accel=$ACCEL, $CPUS cpus, ${MEM_BOOT:-1G}, timeout ${TIMEOUT_USER:-1500}s); console log: $log"
    check_boot "$log" "${TIMEOUT_USER:-1500}"
    # boot 1 hibernates: QEMU ends once the image is written; the same disks boot again and
    # the guest goes on from the image (at most twice). What is left must fit in that run: the
    # rest of boot 1 and boots 2 to 4 (about 2.5 minutes under TCG), at most 15 minutes.
    local resumes=0
    while [ "$qrc" = 0 ] && [ "$resumes" -lt 2 ] && ! grep -q '^UZRAM-VM-RESULT: ' "$log" &&
        [ "$(grep -c '^UZRAM-VM-HIBERNATING' "$log")" -gt "$resumes" ]; do
        resumes=$((resumes + 1))
        say "booting again to resume the hibernated guest ($resumes)"
        check_boot "$log" "$((${TIMEOUT_USER:-1500} < 900 ? ${TIMEOUT_USER:-1500} : 900))" -a
    done
    # what the guest's own checks cannot see: a panic (the guest reboots and goes on), and a
    # shutdown that waited for uzram's processes. A panic before a boot's /init ran nothing of
    # uzram (TCG can crash a guest's kernel in sched_clock_cpu at 2 s): the reset that follows
    # boots again and the checks must still all pass. (One whose report hangs is ended by
    # panic_watch, and the run fails: the four boots share one QEMU and are not tried again.)
    # A boot starts at SeaBIOS's banner (after a reset, a reboot and a hibernation's power-off).
    local early boots='/VM: init reached/ { up = 1 } /SeaBIOS \(version|reboot: (Restarting system|Power down)/ { up = 0 }'
    early=$(awk "$boots"' /Kernel panic/ { if (!up) n++; up = 0 } END { print n + 0 }' "$log")
    [ "$early" = 0 ] || say "the guest's kernel died before /init $early time(s)"
    if awk "$boots"' /Kernel panic/ { if (up) { print; bad = 1 } up = 0 }
        /systemd-shutdown.*Waiting for process/ { print; bad = 1 } END { exit !bad }' "$log"; then
        echo "vm: FAIL: the guest panicked, or its shutdown waited for processes (above; log: $log)"
        exit 1
    fi
    verdict "$log"
}
