# shellcheck shell=sh
# Checks (sourced by checks.sh): uzram's own: its attributes, bad input, swapoff then mkfs, zram-generator.conf setup.

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
    # the same device for scripts and monitoring: the JSON listing and `uzram metrics`
    local orig prom=$UZ_TMP/uzram.prom
    orig=$("$UZRAM_BIN" attr /dev/ublkb3 mm_stat | awk '{ print $1 }')
    "$UZRAM_BIN" --json --bytes -o NAME,DISKSIZE >"$log.json" 2>>"$log"
    grep -qF '{"name": "/dev/ublkb3", "disksize": 100663296}' "$log.json" || bad="$bad; uzram --json: $(cat "$log.json")"
    "$UZRAM_BIN" metrics --output "$prom" >>"$log" 2>&1 || bad="$bad; uzram metrics --output failed"
    grep -qx "uzram_mm_stat_orig_data_size{device=\"ublkb3\"} $orig" "$prom" ||
        bad="$bad; uzram metrics has no uzram_mm_stat_orig_data_size $orig for ublkb3"
    grep -qx 'uzram_up{device="ublkb3"} 1' "$prom" || bad="$bad; uzram metrics has no uzram_up 1"
    [ "$(stat -c %a "$prom")" = 644 ] || bad="$bad; the metrics file is mode $(stat -c %a "$prom"), not 644"
    "$UZRAM_BIN" metrics --format json | grep -q '"device": "ublkb3", "live": true' || bad="$bad; uzram metrics --format json"
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
    pass "$name" "zram-generator.conf [zram3] -> /dev/ublkb3: swap at priority 42, zstd with lz4 recompression, 96 MiB; its JSON listing and metrics (file mode 644) right; setup twice is idempotent; teardown removes it"
}
