# shellcheck shell=bash
# The guest's kernel, for tests/vm/run (sourced): fetched as a Debian package, cached under
# $CACHE/debs, extracted (the kernel and the modules a guest can need) under $CACHE/kernel.
#
# KERNEL=6.12 (default): Debian 12's (bookworm-security), from this machine's own apt sources.
# KERNEL=newest, a line (KERNEL=6.18, KERNEL=7.3: its newest release in the cache, else the
# archive's newest) or a release
# (KERNEL=7.3.4): a newer Debian kernel, from the
# trixie, trixie-backports and sid suites of the same archive. Their lists live in a private
# apt directory ($CACHE/apt-newer) made from the URI of this machine's own Debian sources, so
# neither the system's apt state nor any file of the project names an archive. Packaging
# differs by release: 6.12 has linux-image-*-amd64-unsigned with /lib/modules; 6.18 the signed
# linux-image-*+debNN-amd64 with /usr/lib/modules; from 7.0 the image is a stub depending on
# linux-binary-* (the kernel, at usr/lib/modules/VERSION/vmlinuz) and linux-modules-*.
# Sets KDIR (the extracted tree, with boot/vmlinuz-$KVER and lib/modules/$KVER), KVER and KMODS.

KERNEL=${KERNEL:-6.12}

fetch_kernel() {
    mkdir -p "$CACHE/debs"
    if [ "$KERNEL" = 6.12 ]; then
        fetch_kernel_612
    elif [ "$KERNEL" = newest ] || [[ $KERNEL =~ ^[0-9]+\.[0-9]+(\.[0-9]+)?$ ]]; then
        fetch_kernel_newer
    else
        die "KERNEL=$KERNEL: 6.12, newest, a line such as 6.18 or 7.3, or a release such as 7.3.4"
    fi
    KVER=$(ls "$KDIR/lib/modules")
    KMODS=$KDIR/lib/modules/$KVER
    say "kernel: $KVER ($(basename "$KDIR"))"
}

# Debian 12's 6.12 (bookworm-security) has ublk_drv and zram.
KPATTERN='^linux-image-6\.12\.[0-9]+\+deb12-amd64-unsigned$'
fetch_kernel_612() {
    local deb pkg t
    if [ -n "${KPKG:-}" ]; then
        deb=$(ls "$CACHE/debs/${KPKG}"_*.deb 2>/dev/null | sort -V | tail -1 || true)
    else
        deb=$(ls "$CACHE"/debs/linux-image-6.12.*+deb12-amd64-unsigned_*.deb 2>/dev/null | sort -V | tail -1 || true)
    fi
    if [ -z "$deb" ]; then
        pkg=${KPKG:-}
        if [ -z "$pkg" ]; then
            apt_update_once
            pkg=$(apt-cache search --names-only "$KPATTERN" | awk '{print $1}' | sort -V | tail -1)
            [ -n "$pkg" ] || die "no package matches $KPATTERN: is bookworm-security in the apt sources?"
        fi
        t=$(now)
        say "downloading $pkg"
        (cd "$CACHE/debs" && apt-get download -qq "$pkg" 2>&1 | grep -v 'unsandboxed' || true)
        deb=$(ls "$CACHE/debs/${pkg}"_*.deb 2>/dev/null | tail -1 || true)
        [ -n "$deb" ] || die "apt-get download $pkg failed"
        say "downloaded $(basename "$deb") ($(du -m "$deb" | cut -f1) MiB) in $(since "$t") s"
    fi
    extract_kernel "$CACHE/kernel/$(basename "$deb" .deb)" "$deb"
}

# apt-get and apt-cache with the private lists of the newer suites (see the top).
NEWER_APT=()
newer_apt() {
    [ ${#NEWER_APT[@]} -gt 0 ] && return 0
    local d=$CACHE/apt-newer uri codename keyring=/usr/share/keyrings/debian-archive-keyring.gpg s
    # The stanza (or line) of this system's own release, not a third party's or security's.
    codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
    [ -n "$codename" ] || die "KERNEL=$KERNEL: no VERSION_CODENAME in /etc/os-release"
    uri=$(awk -v c="$codename" '
        FNR == 1 || /^[[:space:]]*$/ { if (u != "" && s) { print u; exit } u = ""; s = 0 }
        $1 == "URIs:" { u = $2 }
        $1 == "Suites:" { for (i = 2; i <= NF; i++) if ($i == c) s = 1 }
        END { if (u != "" && s) print u }' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1 || true)
    if [ -z "$uri" ]; then
        uri=$(awk -v c="$codename" '$1 == "deb" { for (i = 2; i < NF; i++) if ($i ~ /^[a-z]+:\/\// && $(i + 1) == c) { print $i; exit } }' /etc/apt/sources.list 2>/dev/null || true)
    fi
    [ -n "$uri" ] || die "KERNEL=$KERNEL: no Debian archive in this machine's apt sources to take the newer suites from"
    mkdir -p "$d/lists/partial" "$d/cache/archives/partial"
    for s in trixie trixie-backports sid; do
        echo "deb [signed-by=$keyring] $uri $s main"
    done >"$d/sources.list"
    NEWER_APT=(-o "Dir::Etc::SourceList=$d/sources.list" -o Dir::Etc::SourceParts=/dev/null
        -o "Dir::State::Lists=$d/lists" -o "Dir::Cache=$d/cache" -o Debug::NoLocking=1)
    # Refreshed once a day: "newest" means what the archive serves when the run starts.
    if [ -z "$(find "$d" -maxdepth 1 -name updated -mmin -1440 2>/dev/null)" ]; then
        say "apt-get update (trixie, trixie-backports, sid; private lists)"
        apt-get "${NEWER_APT[@]}" update -qq || die "apt-get update of the newer suites failed"
        touch "$d/updated"
    fi
}

fetch_kernel_newer() {
    local pattern img ver debs=() p deb t
    case $KERNEL in
        newest) pattern='^linux-image-[0-9]+\.[0-9]+\.[0-9]+\+deb1[3-9]-amd64$' ;;
        # a release (7.3.4)
        [0-9]*.[0-9]*.[0-9]*) pattern="^linux-image-${KERNEL//./\\.}\\+deb1[3-9]-amd64\$" ;;
        # a line (6.18, 7.3): its newest release in the cache, else the archive's
        *) pattern="^linux-image-${KERNEL//./\\.}\\.[0-9]+\\+deb1[3-9]-amd64\$" ;;
    esac
    # A cached image of that line: the newest one (no apt at all).
    img=$(ls "$CACHE"/debs/linux-image-*+deb1[3-9]-amd64_*.deb 2>/dev/null | xargs -r -n1 basename \
        | sed 's/_.*//' | grep -E "$pattern" | sort -V | tail -1 || true)
    if [ -z "$img" ] || [ "$KERNEL" = newest ]; then
        newer_apt
        img=$(apt-cache "${NEWER_APT[@]}" search --names-only "$pattern" | awk '{print $1}' | sort -V | tail -1)
        [ -n "$img" ] || die "KERNEL=$KERNEL: no package matches $pattern in trixie, trixie-backports or sid"
    fi
    ver=${img#linux-image-}
    KDIR=$CACHE/kernel/$img
    [ -f "$KDIR/.done" ] && return 0
    # From 7.0 the image package is a stub depending on the kernel's and the modules' packages.
    local parts=("$img")
    newer_apt
    if apt-cache "${NEWER_APT[@]}" depends "$img" 2>/dev/null | grep -q "linux-binary-$ver"; then
        parts+=("linux-binary-$ver" "linux-modules-$ver")
    fi
    for p in "${parts[@]}"; do
        deb=$(ls "$CACHE/debs/${p}"_*.deb 2>/dev/null | sort -V | tail -1 || true)
        if [ -z "$deb" ]; then
            t=$(now)
            say "downloading $p"
            (cd "$CACHE/debs" && apt-get "${NEWER_APT[@]}" download -qq "$p" 2>&1 | grep -v 'unsandboxed' || true)
            deb=$(ls "$CACHE/debs/${p}"_*.deb 2>/dev/null | sort -V | tail -1 || true)
            [ -n "$deb" ] || die "apt-get download $p failed"
            say "downloaded $(basename "$deb") ($(du -m "$deb" | cut -f1) MiB) in $(since "$t") s"
        fi
        debs+=("$deb")
    done
    extract_kernel "$CACHE/kernel/$img" "${debs[@]}"
}

# kernel_has_btf MODDIR: whether the kernel of that module tree has BTF: its config says so
# (where the package carries one: boot/config-* beside it), else its zram module (or, built in,
# any module) has a .BTF section, which the build adds only to a kernel with BTF (and
# CONFIG_DEBUG_INFO_BTF_MODULES, which Debian's kernels have wherever they have BTF).
kernel_has_btf() {
    local m=$1 cfg rel tmp sections
    cfg=$(ls "$m/../../../boot/config-"* 2>/dev/null | head -1 || true)
    if [ -n "$cfg" ]; then
        grep -q '^CONFIG_DEBUG_INFO_BTF=y' "$cfg"
        return
    fi
    command -v readelf >/dev/null && command -v xz >/dev/null \
        || die "readelf and xz are needed to read $KVER's modules for BTF"
    rel=$(grep -E '/zram\.ko(\.xz)?:' "$m/modules.dep" | cut -d: -f1 || true)
    [ -n "$rel" ] || rel=$(head -1 "$m/modules.dep" | cut -d: -f1)
    [ -n "$rel" ] || return 1
    tmp=$(mktemp)
    case $rel in *.xz) xz -dc "$m/$rel" >"$tmp" ;; *) cp "$m/$rel" "$tmp" ;; esac
    sections=$(readelf -S --wide "$tmp" 2>/dev/null || true)
    rm -f "$tmp"
    [[ $sections == *" .BTF "* ]]
}

# extract_kernel DIR DEB...: the kernel and the module directories the guest can need (not
# drivers/* beyond block), from either layout, into DIR as DIR/boot/vmlinuz-VERSION and
# DIR/lib/modules/VERSION, then depmod. Done once per DIR.
extract_kernel() {
    local dir=$1 deb t m mod
    shift
    KDIR=$dir
    [ -f "$KDIR/.done" ] && return 0
    t=$(now)
    rm -rf "$KDIR"
    mkdir -p "$KDIR"
    for deb in "$@"; do
        # tar fails on a pattern that matches nothing (a package holds one of the layouts):
        # that is expected; any other complaint, or dpkg-deb's failure, is not.
        local err=$KDIR.tar-errors st
        set +e +o pipefail
        dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$KDIR" --wildcards --no-anchored \
            'boot/vmlinuz-*' 'boot/config-*' 'modules/*/vmlinuz' 'modules/*/modules.*' \
            'modules/*/kernel/fs/*' 'modules/*/kernel/net/9p/*' 'modules/*/kernel/lib/*' \
            'modules/*/kernel/crypto/*' 'modules/*/kernel/mm/*' 'modules/*/kernel/arch/*' \
            'modules/*/kernel/drivers/block/*' 2>"$err"
        st=("${PIPESTATUS[@]}")
        set -e -o pipefail
        if [ "${st[0]}" != 0 ] || grep -vqE 'Not found in archive|Exiting with failure status' "$err"; then
            cat "$err" >&2
            rm -f "$err"
            die "extracting $deb failed (dpkg-deb exit ${st[0]}, tar exit ${st[1]})"
        fi
        rm -f "$err"
    done
    if [ -d "$KDIR/usr/lib/modules" ]; then
        mkdir -p "$KDIR/lib"
        cp -a "$KDIR/usr/lib/modules" "$KDIR/lib/"
        rm -rf "$KDIR/usr"
    fi
    [ -d "$KDIR/lib/modules" ] || die "no modules in $*"
    KVER=$(ls "$KDIR/lib/modules")
    m=$KDIR/lib/modules/$KVER
    mkdir -p "$KDIR/boot"
    if [ ! -f "$KDIR/boot/vmlinuz-$KVER" ] && [ -f "$m/vmlinuz" ]; then
        mv "$m/vmlinuz" "$KDIR/boot/vmlinuz-$KVER"
    fi
    [ -f "$KDIR/boot/vmlinuz-$KVER" ] || die "no kernel image in $*"
    # Built-in modules are looked up here (a package may not carry the list).
    [ -f "$m/modules.builtin" ] || : >"$m/modules.builtin"
    /usr/sbin/depmod -b "$KDIR" "$KVER"
    # A tree without the guest's drivers (a modules package missing) is not kept.
    for mod in zram ublk_drv; do
        grep -qE "/$mod\.ko(\.xz)?:" "$m/modules.dep" || grep -qE "/$mod\.ko\$" "$m/modules.builtin" \
            || die "$KVER has no $mod module in $*"
    done
    # The slot-free probe is relocated against the kernel's BTF (CONFIG_DEBUG_INFO_BTF): the
    # config says so where the package has one, else a module's .BTF section (made only then).
    if [ "$SLOT_FREE" = probe ] && ! kernel_has_btf "$m"; then
        rm -rf "$KDIR"
        die "$KVER has no BTF (CONFIG_DEBUG_INFO_BTF) in $*: the slot-free probe cannot load on it (UZRAM_VM_SLOT_FREE=discard runs without)"
    fi
    touch "$KDIR/.done"
    say "extracted $KVER in $(since "$t") s"
}
