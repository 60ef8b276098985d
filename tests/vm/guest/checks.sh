# The device checks: each takes the block device and a name prefix, and prints its PASS/FAIL/SKIP
# lines through lib.sh. They know nothing of which driver serves the device, except through
# dev_mm_stat/dev_compact (lib.sh), so the same functions check kernel zram ("zram-" names) and
# uzram's ublk device ("" prefix):
#   check_fio DEV PREFIX      fio random writes + crc32c verify (io_uring, libaio; beside discards)
#   check_ext4 DEV PREFIX     a filesystem of real files survives drop_caches, remount, fsck
#   check_swap DEV PREFIX     swap under real pressure: every page comes back; swapoff frees memory
#   check_discard DEV PREFIX  discarded ranges read zeros, neighbours stay, memory is given back
#   check_churn DEV PREFIX    programs swap and exit in turn: the device holds what swap holds
# Device sizes they need: fio 160 MiB, ext4 256 MiB, discard 64 MiB, swap: see check_swap.

SEED=${UZRAM_VM_SEED:-20250520}

# The checks themselves, one file per family (their helpers are in lib.sh or beside them).
for _f in "${D:-$UZRAM_VM_DIR/guest}"/checks/*.sh; do
    . "$_f"
done
