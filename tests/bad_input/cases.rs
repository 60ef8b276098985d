//! The table of bad inputs of tests/bad_input.rs: what a user might mistype, by subcommand and
//! by configuration format.

use super::{case, conf, Case, Scratch};

/// zramctl's options: --size and what a new device is made of.
#[allow(clippy::too_many_lines)] // a table literal, one row a case
pub fn device_options() -> Vec<Case> {
    let mut v = Vec::new();
    // zramctl's --size (util-linux's strtosize).
    v.push(case("--find --size -1G", "\"-1G\": a size is not negative"));
    for size in [
        "lots",
        "-1",
        "1.5",
        "4X",
        "16E",
        "1Z",
        "1Y",
        "G",
        "0x",
        "4 G",
        "1.5.5G",
        "4GiBs",
        "99999999999999999999",
        "4iB",
        "1e9",
    ] {
        v.push(case(&format!("--find --size '{size}'"), size));
    }
    v.push(case(
        "--find --size 99999999999999999999",
        "99999999999999999999\": too large",
    ));
    v.push(case("--find --size 0", "size 0"));
    v.push(case("--find --size ''", "\"\""));
    // What a device is made of.
    for (args, names) in [
        ("--algorithm lzo", "lzo"),
        ("--algorithm ''", "algorithm"),
        ("--algorithm zstdx", "zstdx"),
        ("--algorithm-params level=banana", "banana"),
        ("--algorithm zstd --algorithm-params level=99999", "99999"),
        (
            "--algorithm zstd --algorithm-params level=99999999999999999999",
            "level=\"99999999999999999999\" is not a whole number from",
        ),
        ("--algorithm lz4 --algorithm-params algo=zstd", "algo=zstd"),
        ("--algorithm-params 'priority=9 level=1'", "priority"),
        ("--algorithm-params garbage", "garbage"),
        ("--algorithm-params algo=lzo", "lzo"),
        ("--algorithm-params dict=@nowhere", "nowhere"),
        ("--algorithm-params dict=@nowhere", "No such file"),
        ("--algorithm-params dict=/dev/zero", "/dev/zero"),
        ("--algorithm-params dict=@fifo", "fifo"),
        ("--algorithm-params dict=@a-dir", "a-dir"),
        ("--algorithm-params dict=@empty", "@empty"),
        ("--recomp-algorithm 'algo=zstd priority=4'", "priority"),
        ("--recomp-algorithm lzo", "lzo"),
        (
            "--recomp-algorithm ''",
            "--recomp-algorithm: \"\": names no algorithm",
        ),
        ("--recomp-algorithm ' '", "names no algorithm"),
        ("--recomp-algorithm priority=1", "priority=1"),
        ("--policy evict=maybe", "evict=maybe"),
        ("--policy high_watermark=50", "defaults are 80 and 90"),
        ("--policy pool_share=101", "pool_share=101"),
        ("--policy psi=200", "psi=200"),
        ("--policy colour=blue", "colour=blue"),
        ("--policy budget=lots", "budget=lots"),
        ("--policy writeback_after=soon", "writeback_after=soon"),
        ("--policy low_watermark=95", "low_watermark"),
        ("--policy spill=2", "spill=2"),
        ("--policy min_free=-1", "min_free=-1"),
        ("--policy recompress_after=99999999999d", "recompress_after"),
        (
            "--policy recompress_after=99999999999999999999",
            "too long a duration",
        ),
        ("--policy writeback_after=60000d", "too long a duration"),
        ("--policy writeback_after=m", "a duration: 600, 10m"),
        ("--policy budget=16E", "too large a budget"),
        ("--policy budget=99999999999999999999", "too large a budget"),
        ("--mem-limit much", "much"),
        ("--mem-limit -1", "--mem-limit: invalid size \"-1\""),
        (
            "--policy recompress_after=10m,writeback_after=1h",
            "separated by blanks, not commas",
        ),
        ("--mem-limit 1.5G", "1.5G"),
        ("--mem-limit 99999999999999999999", "99999999999999999999"),
        (
            "--mem-limit 16E",
            "--mem-limit: size \"16E\" is more than 16 EiB",
        ),
        ("--mem-limit lots", "--mem-limit: invalid size \"lots\""),
        ("--backing-dev /dev/null", "/dev/null"),
        ("--backing-dev @a-dir", "a-dir"),
        ("--backing-dev @fifo", "fifo"),
        ("--backing-dev @tiny", "@tiny"),
        ("--backing-dev @data", "@data"),
        ("--backing-dev @ext4.img", "@ext4.img"),
        ("--backing-dev @link-to-data", "@link-to-data"),
        ("--backing-dev @dangling", "@dangling"),
        (
            "--backing-dev /dev/uzram-no-such-disk",
            "/dev/uzram-no-such-disk",
        ),
        ("--backing-dev @nowhere/file", "@nowhere/file"),
        (
            "--backing-dev /proc/self/status",
            "kernel interface under /proc",
        ),
        ("--backing-dev @loop", "is a loop of symbolic links"),
        ("--backing-dev @tiny --force", "@tiny"),
        ("--streams 0", "streams"),
        ("--streams 70000", "70000"),
        ("--streams 5000", "5000 is not in 1..=4096"),
        ("--streams -1", "invalid value '-1'"),
    ] {
        v.push(case(&format!("--find --size 64M {args}"), names));
    }
    let mut stripes = String::from("--find --size 64M");
    for i in 0..17 {
        stripes.push_str(&format!(" --backing-dev @stripe{i}"));
    }
    v.push(case(&stripes, "17"));
    v
}

/// Devices, the listing, attr, bench, dump-pages, setup and teardown.
#[allow(clippy::too_many_lines)] // a table literal, one row a case
pub fn subcommands() -> Vec<Case> {
    let mut v = Vec::new();
    // Devices and listing.
    for (args, names) in [
        ("attr '' mm_stat", "an empty device name"),
        ("-o NOPE", "NOPE"),
        ("-o +NOPE", "NOPE"),
        ("-o NAME,,DISKSIZE", "\"\""),
        ("--output ''", "\"\""),
        ("--reset", "--reset"),
        ("--reset /dev/ublkb99999", "/dev/ublkb99999"),
        ("--reset /dev/zram0", "/dev/zram0"),
        ("/dev/ublkbX", "/dev/ublkbX"),
        ("/dev/ublkb-1", "/dev/ublkb-1"),
        ("/dev/ublkb01", "/dev/ublkb01"),
        ("/dev/ublkb+1", "/dev/ublkb+1"),
        ("/dev/ublkb1048576", "/dev/ublkb1048576"),
        ("/dev/ublkb99999999999", "/dev/ublkb99999999999"),
        ("/dev/ublkb", "/dev/ublkb"),
        ("atr", "atr"),
        ("sertup", "sertup"),
        ("--size 1G /dev/zram0", "/dev/zram0"),
        ("--size 1G /dev/ublkb1 /dev/ublkb2", "one device"),
        ("--find --size 1G /dev/ublkb1", "either --find"),
        ("--find --streams 0", "--streams"),
        ("--find --log @x", "--size"),
        ("--algorithm zstd", "--algorithm"),
        ("--force", "--force"),
        ("--bogus", "--bogus"),
        ("-z", "-z"),
        ("--size", "--size"),
        ("--log @a-dir --find --size 64M", "a-dir"),
    ] {
        v.push(case(args, names));
    }
    // attr.
    for (args, names) in [
        ("attr /dev/ublkb4000 mm_stat", "/dev/ublkb4000"),
        ("attr /dev/zram0 mm_stat", "/dev/zram0"),
        ("attr ublkbX mm_stat", "ublkbX"),
        ("attr /dev/ublkb01 mm_stat", "/dev/ublkb01"),
        ("attr", "DEVICE"),
        ("attr /dev/ublkb0", "NAME"),
        ("attr /dev/ublkb4000 disksize 1G", "/dev/ublkb4000"),
    ] {
        v.push(case(args, names));
    }
    // bench.
    for (args, names) in [
        ("bench --threads 0", "threads"),
        ("bench --threads 100000", "100000"),
        ("bench --threads -1", "-1"),
        ("bench --runs 0", "runs"),
        ("bench --runs 100000", "100000"),
        ("bench --corpus /dev/zero", "/dev/zero"),
        ("bench --corpus @fifo", "fifo"),
        ("bench --corpus @a-dir", "a-dir"),
        ("bench --corpus @nowhere", "nowhere"),
        ("bench --corpus @tiny", "@tiny"),
        ("bench --corpus @empty", "@empty"),
        ("bench --corpus @dangling", "dangling"),
        ("bench --algorithm lzo", "lzo"),
        ("bench --algorithm-params level=banana", "banana"),
        ("bench --policy colour=blue", "colour=blue"),
        ("bench --backing-dev @data", "@data"),
        // One file twice, under two names: refused before either is sized or labelled.
        (
            "bench --backing-dev @empty --backing-dev @empty",
            "named twice",
        ),
        (
            "bench --backing-dev @new-wb --backing-dev @a-dir/../new-wb",
            "named twice",
        ),
        (
            "bench --backing-dev @new-wb --backing-dev /dev/null",
            "/dev/null",
        ),
        ("bench --mem-limit 16E", "--mem-limit"),
        ("bench --pid 4294967295", "4294967295"),
        ("bench --pid abc", "abc"),
    ] {
        v.push(case(args, names));
    }
    // dump-pages: a process that is not there must leave the output as it was.
    for (args, names) in [
        ("dump-pages --pid 4194304 -o @data", "4194304"),
        ("dump-pages --pid 4194304 -o @link-to-data", "4194304"),
        ("dump-pages --pid 4194304 -o @new-file", "4194304"),
        ("dump-pages --pid 1 -o /dev/null", "/dev/null"),
        ("dump-pages --pid 1 -o @fifo", "fifo"),
        ("dump-pages --pid 1 -o @a-dir", "a-dir"),
        ("metrics -o /proc/uzram-metrics.prom", "kernel interface"),
        ("metrics -o @nowhere/m.prom", "nowhere to write it under a temporary name: no such directory"),
        ("dump-pages --pid 1 -o @nowhere/x", "nowhere to write it under a temporary name: no such directory"),
        ("dump-pages --pid abc -o @x", "abc"),
        (
            "dump-pages --pid 1 -o /proc/version",
            "/proc/version: it is a kernel interface (on procfs",
        ),
        ("dump-pages --pid 1 --max-mib abc -o @x", "abc"),
        ("dump-pages -o @x", "--pid"),
        ("dump-pages --pid 1 --max-mib 0 -o @data", "--max-mib 0"),
        ("--reset --size 4G /dev/ublkb0", "--reset"),
        ("--reset --algorithm zstd /dev/ublkb0", "--reset"),
        ("--log @x", "--log"),
        (
            "--find --size 64M --backing-dev @new-bd --backing-dev @new-bd",
            "named twice",
        ),
        (
            "--find --size 64M --backing-dev @tiny --backing-dev @link-to-tiny",
            "named twice",
        ),
        (
            "--find --size 64M --recomp-algorithm zstd --recomp-algorithm zstd",
            "priority 1",
        ),
        (
            "--find --size 64M --recomp-algorithm 'algo=zstd priority=2' --recomp-algorithm 'algo=lz4 priority=2'",
            "priority 2",
        ),
        (
            "--find --size 64M -a zstd --algorithm-params 'level=3 level=4'",
            "level= given twice",
        ),
        (
            "--find --size 64M --recomp-algorithm 'algo=zstd level=3 algo=lz4'",
            "algo= given twice",
        ),
        (
            "--find --size 64M --policy 'recompress_after=10m recompress_after=20m'",
            "recompress_after= given twice",
        ),
        ("attr /dev/ublkb0 ''", "not an attribute's name"),
        ("attr /dev/ublkb0 'mm stat'", "\"mm stat\": not an attribute"),
        ("attr /dev/ublkb0 ../../etc/passwd", "../../etc/passwd"),
        ("sleep post bogus", "bogus"),
        ("sleep post ''", "''"),
    ] {
        v.push(case(args, names));
    }
    // The daemon's options are named before the driver is looked for.
    if cfg!(feature = "ublk") {
        for (args, names) in [
            ("serve --size 0", "size 0"),
            ("serve --size 99E", "99E"),
            ("serve --size 4G --queues 0", "0 is not in 1..=4096"),
            ("serve --size 4G --queues 65536", "65536 is not in 1..=4096"),
            ("serve --size -1", "--size: invalid size \"-1\""),
            ("serve --size 4X", "--size: invalid size \"4X\""),
            ("serve --size 1.5G", "--size: invalid size \"1.5G\""),
            (
                "serve --size 4G --reserve lots",
                "--reserve: invalid size \"lots\"",
            ),
            (
                "serve --size 4G --reserve-min 1x",
                "--reserve-min: invalid size",
            ),
            (
                "serve --size 4G --reserve 1M --reserve-min 16M",
                "--reserve-min 16M",
            ),
        ] {
            v.push(case(args, names));
        }
    }
    // The daemon's subcommand on a build without it says so.
    if !cfg!(feature = "ublk") {
        v.push(case("serve --size 1G", "built without the ublk feature"));
    } else {
        v.push(case("serve --size 1G --depth 0", "'0'"));
        v.push(case("serve --size 1G --id 99999999", "99999999"));
        v.push(case("serve --size 1G --queues 0", "--queues"));
    }
    // A negative number is the option's bad value, not an unknown argument.
    for (args, names) in [
        (
            "dump-pages --pid -1 -o @x",
            "invalid value '-1' for '--pid <PID>'",
        ),
        (
            "dump-pages --pid 1 --max-mib -1 -o @x",
            "invalid value '-1' for '--max-mib <N>'",
        ),
        ("bench --runs -1", "invalid value '-1' for '--runs <RUNS>'"),
    ] {
        v.push(case(args, names));
    }
    // A kernel thread has no memory to dump (where pid 2 is one, as on a host).
    if std::fs::read_to_string("/proc/2/status").is_ok_and(|s| s.starts_with("Name:\tkthreadd")) {
        v.push(case("dump-pages --pid 2 -o @x", "kernel thread"));
    }
    // setup and teardown: the files themselves.
    for (args, names) in [
        ("setup --dry-run --config @nowhere", "nowhere"),
        ("setup --dry-run --config @fifo", "fifo"),
        ("setup --dry-run --config /dev/zero", "/dev/zero"),
        ("setup --dry-run --config @a-dir", "a-dir"),
        ("setup --dry-run --config @big.conf", "big.conf"),
        ("setup --dry-run --config @not-utf8.conf", "not-utf8.conf"),
        ("setup --dry-run --config @empty --ram-mib -1", "-1"),
        (
            "setup --dry-run --root /nonexistent-root --ram-mib 100",
            "--root /nonexistent-root: no such directory",
        ),
        (
            "setup --dry-run --config @empty --ram-mib -5",
            "MiB of RAM are not negative",
        ),
        (
            "setup --dry-run --config @empty --ram-mib 4G",
            "a whole number of MiB",
        ),
        (
            "setup --dry-run --config @empty --ram-mib 99999999999999999999",
            "too large: at most",
        ),
        ("setup --dry-run --config @empty --ram-mib nan", "nan"),
        ("setup --dry-run --config @empty --ram-mib 1.5", "1.5"),
        ("setup --dry-run --config @empty --ram-mib inf", "inf"),
        ("setup --dry-run --config @empty --ram-mib 0", "0"),
        ("setup --dry-run --config @empty --ram-mib abc", "abc"),
        (
            "setup --dry-run --config @empty --ram-mib -5",
            "invalid value '-5'",
        ),
        ("teardown --config @nowhere", "nowhere"),
        ("teardown --config @fifo", "fifo"),
        ("setup --config @fifo", "fifo"),
        // prepare: only a uzram device, only swap or a file system's name.
        ("prepare /dev/sda swap", "/dev/sda"),
        ("prepare /dev/ublkb0 'ext4;rm'", "ext4;rm"),
        ("prepare /dev/ublkb0 ''", "\"\""),
        ("prepare /dev/ublkb1048575 swap", "not served by uzram"),
        ("generator", "<DIRS>"),
        ("--list-columns --json", "--json"),
    ] {
        v.push(case(args, names));
    }
    v
}

/// zram-generator.conf and zramswap files with one bad value each.
#[allow(clippy::too_many_lines)] // a table literal, one row a case
pub fn configs(s: &Scratch) -> Vec<Case> {
    let gen = |body: &str| format!("[zram0]\n{body}\n");
    // A set! that runs uzram setup on a config with a set! of its own: the inner one refuses.
    s.write("set-inner.conf", b"set!y = echo 1\n[zram0]\n");
    let recurse = format!(
        "set!x = {} setup --dry-run --ram-mib 4096 --config {}\n[zram0]\n",
        env!("CARGO_BIN_EXE_uzram"),
        s.path("set-inner.conf").display()
    );
    let shared = format!(
        "[zram0]\nwriteback-device = {e}\n[zram1]\nwriteback-device = {e}\n",
        e = s.path("empty").display()
    );
    let table: &[(&str, &str, &str)] = &[
        // zram-generator.conf
        (
            "zram-generator.conf",
            "[zram0\n",
            "line 1 (\"[zram0\"): a section's name opened with [ is not closed",
        ),
        (
            "zram-generator.conf",
            &gen("mount-point = /proc"),
            "/proc would hide",
        ),
        (
            "zram-generator.conf",
            "[zram0]\nzram-size ram / 2\n",
            "neither [section] nor key = value",
        ),
        (
            "zram-generator.conf",
            &gen("compression-algorithm = zstd(level=3)(priority=1)"),
            "one (...) per algorithm, its parameters separated by commas: zstd(level=3,priority=1)",
        ),
        (
            "zram-generator.conf",
            "[zram0]\nfs-type = swap\nmount-point = /mnt/x\n",
            "fs-type swap with a mount-point",
        ),
        (
            "zram-generator.conf",
            "set! = echo 5\n[zram0]\n",
            "set! needs a variable's name",
        ),
        (
            "zram-generator.conf",
            "[zram0]\nmount-point = /mnt/a\n[zram1]\nmount-point = /mnt/a\n",
            "mount-point /mnt/a is [zram0]'s too",
        ),
        (
            "zram-generator.conf",
            &gen("options = a\u{1}b"),
            "control character",
        ),
        (
            "zram-generator.conf",
            &gen("zram-size = ram / 0"),
            "zram-size=ram / 0 is infinite (a division by 0",
        ),
        (
            "zram-generator.conf",
            &gen("zram-size = ram ^ 1000"),
            "zram-size=ram ^ 1000 is infinite (a division by 0, or a number past 1.8e308)",
        ),
        (
            "zram-generator.conf",
            &gen("zram-size = 0 / 0"),
            "zram-size=0 / 0 is not a number",
        ),
        (
            "zram-generator.conf",
            &gen("zram-size = 4G"),
            "slot table larger than",
        ),
        ("zram-generator.conf", &gen("zram-size = -ram"), "zram-size"),
        (
            "zram-generator.conf",
            &gen("zram-size = 16E"),
            "zram-size=16E: not a number where one was expected (sizes are MiB",
        ),
        ("zram-generator.conf", &gen("zram-size = -1"), "zram-size"),
        (
            "zram-generator.conf",
            &gen("zram-size = ram *"),
            "zram-size",
        ),
        ("zram-generator.conf", &gen("zram-size = banana"), "banana"),
        (
            "zram-generator.conf",
            "[zram0]\n; x\n  # an indented note\nzram-size = 64\n",
            "a comment, # or ;, starts its line",
        ),
        (
            "zram-generator.conf",
            &gen("fs-type ="),
            "fs-type is empty: name swap or a file system",
        ),
        // an expression's errors in words, not the evaluator's names for them
        (
            "zram-generator.conf",
            &gen("zram-size = ram /"),
            "ends too early",
        ),
        (
            "zram-generator.conf",
            &gen("zram-size = foo"),
            "\"foo\" is not known",
        ),
        (
            "zram-generator.conf",
            &gen("zram-size = ram/2 ; x"),
            "unexpected \"; x\"",
        ),
        (
            "zram-generator.conf",
            &gen("swap-priority = 1.5"),
            "whole number",
        ),
        (
            "zram-generator.conf",
            &gen("zram-size = 1e300"),
            "zram-size",
        ),
        (
            "zram-generator.conf",
            &gen("zram-size = ram ^ 99"),
            "zram-size",
        ),
        (
            "zram-generator.conf",
            &gen("zram-resident-limit = -1"),
            "zram-resident-limit",
        ),
        (
            "zram-generator.conf",
            &gen("zram-resident-limit = 1/0"),
            "zram-resident-limit",
        ),
        (
            "zram-generator.conf",
            &gen("zram-resident-limit = x"),
            "zram-resident-limit",
        ),
        ("zram-generator.conf", &gen("swap-priority = abc"), "abc"),
        (
            "zram-generator.conf",
            &gen("swap-priority = 40000"),
            "40000",
        ),
        ("zram-generator.conf", &gen("swap-priority = -2"), "-2"),
        (
            "zram-generator.conf",
            &gen("host-memory-limit = abc"),
            "abc",
        ),
        ("zram-generator.conf", &gen("zram-fraction = abc"), "abc"),
        ("zram-generator.conf", &gen("max-zram-size = abc"), "abc"),
        (
            "zram-generator.conf",
            &gen("compression-algorithm = lzo-rle(level=banana)"),
            "banana",
        ),
        (
            "zram-generator.conf",
            &gen("compression-algorithm = zstd(level)"),
            "level",
        ),
        (
            "zram-generator.conf",
            &gen("fs-type = nosuchfs"),
            "nosuchfs",
        ),
        (
            "zram-generator.conf",
            &gen("mount-point = relative/dir"),
            "relative/dir",
        ),
        (
            "zram-generator.conf",
            &gen("mount-point = /a/../b"),
            "/a/../b",
        ),
        (
            "zram-generator.conf",
            &gen("mount-point = /x\nfs-type = nosuchfs"),
            "nosuchfs",
        ),
        (
            "zram-generator.conf",
            &gen("writeback-device = /dev/null"),
            "/dev/null",
        ),
        (
            "zram-generator.conf",
            &gen("writeback-device = relative"),
            "relative",
        ),
        (
            "zram-generator.conf",
            &gen("uzram-policy = colour=blue"),
            "colour=blue",
        ),
        ("zram-generator.conf", "[zram1]\n[zram01]\n", "zram01"),
        (
            "zram-generator.conf",
            "[zram0\nzram-size = 1\n",
            "line 1 (\"[zram0\")",
        ),
        (
            "zram-generator.conf",
            "[zram99999999999]\n",
            "zram99999999999",
        ),
        (
            "zram-generator.conf",
            "set!x = echo 'ram /'\n[zram0]\n",
            "set!x",
        ),
        (
            "zram-generator.conf",
            "set!x = LC_ALL=C awk 'BEGIN{printf \"%c\", 255}'\n[zram0]\n",
            "UTF-8",
        ),
        (
            "zram-generator.conf",
            "[zram0]\nzram-size = 100 # MiB\n",
            "zram-size",
        ),
        (
            "zram-generator.conf",
            "[zram0]\nzram-fraction = -1\n",
            "zram-fraction",
        ),
        (
            "zram-generator.conf",
            "[zram0]\nzram-fraction = inf\n",
            "zram-fraction",
        ),
        (
            "zram-generator.conf",
            "[zram0]\nmax-zram-size = 1.5\n",
            "max-zram-size",
        ),
        (
            "zram-generator.conf",
            "[zram0]\nhost-memory-limit = 1.5\n",
            "host-memory-limit",
        ),
        (
            "zram-generator.conf",
            "[zram0]\ncompression-algorithm = zstd(level=99)\n",
            "99",
        ),
        (
            "zram-generator.conf",
            "[zram0]\nzram-size = 64\n[zram1]\nzram-size = 64\nuzram-policy = spill=7\n",
            "spill=7",
        ),
        // zramswap
        ("zramswap", "PERCENT=abc\n", "abc"),
        ("zramswap", "PERCENT=-5\n", "-5"),
        ("zramswap", "PERCENT=1.5\n", "1.5"),
        ("zramswap", "SIZE=abc\n", "abc"),
        ("zramswap", "SIZE=-1\n", "-1"),
        (
            "zramswap",
            "SIZE=99999999999999999999\n",
            "too large for the shell's arithmetic",
        ),
        ("zramswap", "SIZE=12x\n", "SIZE=12x: not a whole number"),
        ("zramswap", "SIZE=089\n", "SIZE=089: not a whole number"),
        ("zramswap", "PRIORITY=abc\n", "abc"),
        ("zramswap", "PRIORITY=40000\n", "40000"),
        ("zramswap", "PRIORITY=-2\n", "-2"),
        ("zramswap", "ALGO=nosuch\n", "nosuch"),
        ("zramswap", "\u{feff}ALGO=zstd\n", "byte-order mark"),
        (
            "zramswap",
            "PERCENT=99999999999\n",
            "PERCENT=99999999999: a device of",
        ),
        ("zramswap", "ALGO=\"zstd\nPERCENT=1\n", "ALGO"),
        ("zramswap", "PERCENT=$(rm -rf /)\n", "rm -rf"),
        ("zramswap", "PERCENT=`reboot`\n", "reboot"),
        // set! commands: bounded output, a time limit, no recursion.
        (
            "zram-generator.conf",
            "set!x = yes 12345\n[zram0]\n",
            "more than 4096 bytes",
        ),
        (
            "zram-generator.conf",
            "set!x = sleep 100\n[zram0]\n",
            "still running after 10 s",
        ),
        ("zram-generator.conf", &recurse, "started by a set! command"),
        // Read as zram-generator reads them.
        (
            "zram-generator.conf",
            "\u{feff}[zram0]\nzram-size = lots\n",
            "lots",
        ),
        (
            "zram-generator.conf",
            "[zram0]\nwriteback-device = /nonexistent/dev\n",
            "/nonexistent/dev: it does not exist",
        ),
        (
            "zram-generator.conf",
            "[zram0]\nmount-point = /\n",
            "over the root",
        ),
        ("zram-generator.conf", &shared, "[zram0]'s too"),
    ];
    table
        .iter()
        .enumerate()
        .map(|(n, &(file, text, names))| conf(s, n, file, text, names))
        .collect()
}
