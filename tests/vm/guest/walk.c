/*
 * vmtool's walks (tests/vm/guest/vmtool.c has the pages and the other commands): the starved
 * family's programs (walk) and programs that start, swap and exit (phases).
 */
#define _GNU_SOURCE
#include "vmtool.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

/*
 * The tail a rewrite pass changes: page i's last REWRITE bytes after pass p (0-based) rewrote
 * them, for even pages; the rest of the page is gen_page's.
 */
#define REWRITE 512
static void rewrite_tail(unsigned char *p, uint64_t seed, uint64_t index, int pass)
{
	uint64_t r = splitmix(seed ^ splitmix(index) ^ ((uint64_t)pass << 48)) | 1;
	uint64_t *w = (uint64_t *)(p + PAGE - REWRITE);
	for (int i = 0; i < REWRITE / 8; i++) {
		/* half zeros, half words: a tail that compresses as a heap's does */
		r ^= r << 13, r ^= r >> 7, r ^= r << 17;
		w[i] = (i & 1) ? 0 : (r & 0xffff);
	}
}

/* Page i as it must read before pass p of a rewrite walk. */
static void rewrite_want(unsigned char *want, uint64_t seed, uint64_t index, int pass)
{
	gen_page(want, seed, index);
	if (pass > 0 && (index & 1) == 0)
		rewrite_tail(want, seed, index, pass - 1);
}

static size_t check_against(const unsigned char *got, const unsigned char *want, uint64_t index)
{
	if (memcmp(got, want, PAGE) == 0)
		return 0;
	if (reports++ < 10)
		fprintf(stderr, "vmtool: MISMATCH walk page %" PRIu64 "\n", index);
	return 1;
}

/* Where a walk tells its parent of each step done (its fill, then each pass): one byte. */
static int progress_fd = -1;

static void step_done(void)
{
	if (progress_fd >= 0 && write(progress_fd, "s", 1) != 1) {
		close(progress_fd);
		progress_fd = -1;
	}
}

/*
 * One program of the starved family (starved.sh): fill MIB, then PASSES passes of SHAPE:
 * "cyclic" every page in order, each pass forward (the least recently used page is the next
 * one read: a build's dependency graph); "hotcold" as many reads as pages, 80 % of them in a
 * hot fifth of the pages, the rest over the cold four fifths, at random; "rewrite" every page
 * in order, and the last 512 bytes of every other page rewritten (a build's heap that
 * changes). Every page read is verified.
 */
int cmd_walk(uint64_t mib, uint64_t seed, int passes, const char *shape)
{
	static unsigned char want[PAGE] __attribute__((aligned(PAGE)));
	size_t len = mib << 20, pages = len / PAGE, bad = 0;
	int cyclic = !strcmp(shape, "cyclic"), hot = !strcmp(shape, "hotcold");
	int rewrite = !strcmp(shape, "rewrite");
	if (!cyclic && !hot && !rewrite) {
		fprintf(stderr, "vmtool: walk: unknown shape %s (cyclic, hotcold, rewrite)\n", shape);
		return 2;
	}
	unsigned char *m = fill(len, seed);
	step_done();
	uint64_t r = splitmix(seed) | 1;
	for (int p = 0; p < passes; p++) {
		double t = now();
		for (size_t j = 0; j < pages; j++) {
			size_t i = j;
			if (hot) {
				r ^= r << 13, r ^= r >> 7, r ^= r << 17;
				size_t h = pages / 5 ? pages / 5 : 1;
				i = (r % 10 < 8) ? (r >> 8) % h : h + (r >> 8) % (pages - h);
			}
			if (rewrite)
				rewrite_want(want, seed, i, p);
			else
				gen_page(want, seed, i);
			bad += check_against(m + i * PAGE, want, i);
			if (rewrite && (i & 1) == 0)
				rewrite_tail(m + i * PAGE, seed, i, p);
		}
		printf("vmtool: walk %s pass %d: %zu bad pages so far in %.1f s, VmRSS %ld kB VmSwap %ld kB\n",
		       shape, p + 1, bad, now() - t, status_kb("VmRSS"), status_kb("VmSwap"));
		fflush(stdout);
		step_done();
	}
	munmap(m, len);
	printf("vmtool: walk %s %s: %zu MiB, %d passes, %zu bad pages\n", shape,
	       bad ? "FAILED" : "ok", len >> 20, passes, bad);
	return bad ? 1 : 0;
}

/* Waits until the program writing to `fd` has done `steps` steps (or ended); closes fd. */
static void wait_steps(int fd, int steps)
{
	char c;
	while (steps > 0) {
		ssize_t n = read(fd, &c, 1);
		if (n == 1)
			steps--;
		else if (!(n < 0 && errno == EINTR))
			break;
	}
	close(fd);
}

/*
 * Programs that start, swap and exit: N programs of MIB/N each, each a cyclic walk of PASSES
 * passes (seed + k for the k-th). STAGGER: seconds between starts, or "pK": each starts once
 * the one before has filled its memory and walked K passes and the one before that has ended
 * (two run together at most), so that how many run together does not depend on how fast the
 * swap is (with seconds, a faster swap lets each program end before the next needs its
 * memory). Fails if any does.
 */
int cmd_phases(uint64_t mib, uint64_t seed, int passes, int n, const char *stagger)
{
	pid_t pids[64];
	int sts[64] = { 0 }, reaped[64] = { 0 };
	int failed = 0, by_pass = stagger[0] == 'p', prev = -1;
	uint64_t gap = num(by_pass ? stagger + 1 : stagger);
	if (n < 1 || n > 64) {
		fprintf(stderr, "vmtool: phases: 1 to 64 programs\n");
		return 2;
	}
	if (by_pass && gap > (uint64_t)passes) {
		fprintf(stderr, "vmtool: phases: stagger p%" PRIu64 " is past the %d passes\n", gap, passes);
		return 2;
	}
	for (int k = 0; k < n; k++) {
		int fds[2] = { -1, -1 };
		if (k && by_pass) {
			wait_steps(prev, (int)gap + 1);
			/* two at a time at most, however fast each one's steps are */
			if (k >= 2) {
				if (waitpid(pids[k - 2], &sts[k - 2], 0) < 0)
					sts[k - 2] = -1;
				reaped[k - 2] = 1;
			}
		} else if (k)
			sleep((unsigned)gap);
		if (by_pass && pipe(fds) < 0) {
			perror("vmtool: pipe");
			return 2;
		}
		fflush(stdout);
		pids[k] = fork();
		if (pids[k] < 0) {
			perror("vmtool: fork");
			return 2;
		}
		if (pids[k] == 0) {
			if (by_pass) {
				/* the parent stops listening once this one has done its steps */
				signal(SIGPIPE, SIG_IGN);
				close(fds[0]);
				progress_fd = fds[1];
			}
			int rc = cmd_walk(mib / n, seed + k, passes, "cyclic");
			fflush(stdout);
			_exit(rc);
		}
		if (by_pass) {
			close(fds[1]);
			prev = fds[0];
		}
	}
	if (prev >= 0)
		close(prev);
	int bad = 0, sig = 0;
	for (int k = 0; k < n; k++) {
		int st = sts[k];
		if (!reaped[k] && waitpid(pids[k], &st, 0) < 0)
			st = -1;
		if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st))
			failed++;
		if (st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 1)
			bad++;
		else if (st != -1 && WIFSIGNALED(st))
			sig = WTERMSIG(st);
	}
	printf("vmtool: phases %s: %d programs of %" PRIu64 " MiB, %d failed (%d with bad pages)\n",
	       failed ? "FAILED" : "ok", n, mib / n, failed, bad);
	/* as a shell reports it: bad pages first, then a program the kernel killed */
	return bad ? 1 : sig ? 128 + sig : failed ? 1 : 0;
}
