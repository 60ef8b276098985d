// SPDX-License-Identifier: MIT OR Apache-2.0
//
// uzram's slot-free probe: the kernel's swap code tells kernel zram the moment it frees a swap
// slot (`swap_slot_free_notify`, a private hook a ublk disk does not get). These programs, one
// for each form of the kernel's free path, each on a function that path calls beside that hook,
// mark the freed pages of one uzram device in a bitmap the daemon maps and frees them from
// (src/daemon/slotfree.rs; the engine's `FreedPages`).
//
// Built by build.rs with clang (-target bpf, with BTF for CO-RE); loaded by aya. They allocate
// nothing and never wait: they run in the freeing task's context, which may be reclaim.

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

// What the programs read of the kernel's structures, by name: the loader relocates each field
// to where the running kernel's BTF puts it (CO-RE).
struct inode {
	__u32 i_rdev;
} __attribute__((preserve_access_index));

struct file {
	struct inode *f_inode;
} __attribute__((preserve_access_index));

struct swap_info_struct {
	struct file *swap_file;
} __attribute__((preserve_access_index));

// Set by the loader (src/daemon/slotfree.rs), fixed once loaded.
// &swap_info[0], the kernel's array of swap areas by type, from /proc/kallsyms.
const volatile __u64 swap_info_addr = 0;
// The device's pages: offsets at or past it are not the device's.
const volatile __u64 device_pages = 0;
// Summary words (one bit per word of page bits) between the header and the page bits.
const volatile __u64 summary_words = 0;

// The map's words (the layout slotfree.rs and the engine's FreedPages share):
//   [0, HEADER_WORDS)   the header: the device's dev_t (the kernel's encoding; 0: mark nothing)
//                       and counters;
//   then summary_words  bit w of the summary: word w of the page bits may have bits set;
//   then the page bits  bit p: page p was freed by swap and not yet taken by the daemon.
#define HEADER_WORDS 8
#define H_TARGET 0
#define H_CALLS 1
#define H_PAGES 2 // pages newly marked
#define H_DROPPED 3

// A free never spans more than one swap cluster (512 pages: 9 words of bits).
#define MAX_RANGE_WORDS 16

// Sized by the loader.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 1);
} marks SEC(".maps");

static __always_inline __u64 *word(__u64 i)
{
	__u32 key = (__u32)i;
	return bpf_map_lookup_elem(&marks, &key);
}

static __always_inline void count(__u32 which, __u64 n)
{
	__u64 *c = word(which);
	if (c)
		__sync_fetch_and_add(c, n);
}

// Marks the pages [begin, end] freed, if swap area `type` is the device itself.
static __always_inline void mark_freed(long type, __u64 begin, __u64 end)
{
	__u64 *target = word(H_TARGET);
	if (!target || !*target || !swap_info_addr)
		return;
	// MAX_SWAPFILES is below 32 (1 << MAX_SWAPFILES_SHIFT, less the special entry types).
	if (type < 0 || type >= 32)
		return;

	struct swap_info_struct *si = 0;
	if (bpf_probe_read_kernel(&si, sizeof(si), (void *)(swap_info_addr + (__u64)type * 8)) || !si)
		return;
	// The device itself is the swap area: its swap_file is the block device's node. A swap
	// file on a filesystem on the device has a regular file there (i_rdev 0), and its
	// offsets are not the device's pages.
	__u32 rdev = BPF_CORE_READ(si, swap_file, f_inode, i_rdev);
	if ((__u64)rdev != *target)
		return;

	count(H_CALLS, 1);
	if (end < begin) {
		count(H_DROPPED, 1);
		return;
	}
	if (end >= device_pages || (end >> 6) - (begin >> 6) >= MAX_RANGE_WORDS) {
		count(H_DROPPED, end - begin + 1);
		return;
	}
	__u64 first = begin >> 6, last = end >> 6, marked = 0;
	for (int i = 0; i < MAX_RANGE_WORDS; i++) {
		__u64 w = first + i;
		if (w > last)
			break;
		__u64 lo = w == first ? (begin & 63) : 0;
		__u64 hi = w == last ? (end & 63) : 63;
		__u64 mask = (~0ULL >> (63 - hi)) & (~0ULL << lo);
		__u64 *bits = word(HEADER_WORDS + summary_words + w);
		__u64 *summary = word(HEADER_WORDS + (w >> 6));
		if (!bits || !summary)
			return;
		// The page bits before the summary bit, both fetching (so fully ordered on every
		// architecture): a daemon that clears the summary bit and then reads the word sees
		// these marks.
		__u64 old = __sync_fetch_and_or(bits, mask);
		marked += __builtin_popcountll(mask & ~old);
		__sync_fetch_and_or(summary, 1ULL << (w & 63));
	}
	count(H_PAGES, marked);
}

// Each program is an fentry program, checked against its function's BTF when it is loaded, so
// a kernel whose function takes other arguments refuses it (and the daemon falls back to
// discards) rather than have it read registers that are not these. The loader attaches one of
// them, the one src/daemon/slotfree.rs names for the running kernel, whose free and allocation
// paths were read for the one ordering rule: a freed slot is marked before any write can reuse
// it. Swap offsets are kernel pages: the daemon uses the probe only where those are 4 KiB, the
// device's pages.

// Linux 6.0-6.12: void clear_shadow_from_swap_cache(int type, unsigned long begin, unsigned
// long end), called by swap_range_free() for the slots [begin, end] it has just freed, right
// beside the loop that calls swap_slot_free_notify(). Every caller holds the swap area's lock
// (si->lock), which every path that hands a slot out again takes too.
SEC("fentry/clear_shadow_from_swap_cache")
int BPF_PROG(uzram_slot_free, int type, unsigned long begin, unsigned long end)
{
	mark_freed(type, begin, end);
	return 0;
}

// Linux 6.18 and later (7.x): void zswap_invalidate(swp_entry_t entry), called by
// swap_range_free() for each slot it frees, ahead of swap_slot_free_notify(), and by nothing
// else: zswap drops its copy of a slot only once the slot is dead. swap_range_free() runs under
// the slot's cluster lock (swap_entries_free() in 6.18, __swap_cluster_free_entries() in 7.x),
// which every allocation of a slot in that cluster takes too. A kernel built without zswap
// (CONFIG_ZSWAP off) has no such function: discards there.
// swp_entry_t is one unsigned long: the area's type in the top MAX_SWAPFILES_SHIFT (5) of
// BITS_PER_XA_VALUE (63) bits, the offset below (include/linux/swapops.h).
#define SWP_TYPE_SHIFT (63 - 5)
SEC("fentry/zswap_invalidate")
int BPF_PROG(uzram_slot_free_entry, unsigned long entry)
{
	__u64 offset = entry & ((1ULL << SWP_TYPE_SHIFT) - 1);
	mark_freed((long)(entry >> SWP_TYPE_SHIFT), offset, offset);
	return 0;
}

// GPL-compatible, for bpf_probe_read_kernel; the source is MIT OR Apache-2.0 like the rest.
char LICENSE[] SEC("license") = "Dual MIT/GPL";
