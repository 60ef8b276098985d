/*
 * vmtool: self-identifying test data for the uzram VM checks (tests/vm/guest/).
 *
 * Every 4 KiB page is a pure function of (seed, page index), so any page can be
 * regenerated and compared, and a misplaced page names where it came from.
 * Page kinds, chosen per page from a hash of (seed, index), roughly as swap sees
 * them:
 *   zero    all zeros                                 (zram: same-filled, 0)
 *   same    one 8-byte word repeated                  (zram: same-filled)
 *   random  header + xorshift stream                  (incompressible: huge)
 *   text    header + log-like lines, index stamped    (compresses well)
 *   heap    header + pointer-like/small/zero words    (compresses like a heap)
 * Non-zero kinds but "same" start with a 32-byte header: "UZVMPAGE", seed, index, kind.
 *
 * Commands (sizes and offsets in bytes, multiples of 4096 where they address a device):
 *   vmtool swapfill MIB SEED [PASSES]  fill MIB of anonymous memory, then verify it
 *                                      PASSES times (forward, backward, ...); prints VmSwap
 *   vmtool walk MIB SEED PASSES SHAPE  fill MIB, then PASSES passes of SHAPE (cyclic, hotcold,
 *                                      rewrite: see cmd_walk), every page read verified
 *   vmtool phases MIB SEED PASSES N S  N cyclic walks of MIB/N, started S seconds apart, or
 *                                      with S "pK", each once the one before has filled and
 *                                      walked K passes and the one before that ended
 *                                      (two at once at most, on any swap)
 *   VMTOOL_MIX=mixed|text|heap|noisy   the page mix (see set_mix)
 *   vmtool swaphold MIB SEED           fill MIB, push it out with MADV_PAGEOUT, print "held",
 *                                      wait for SIGUSR1 (meanwhile: swapoff), then verify;
 *                                      SIGUSR2 meanwhile frees every other page (MADV_DONTNEED:
 *                                      their swap slots are freed in clusters still in use), prints
 *                                      "dropped" with the zero pages kept, and waits on; the verify
 *                                      then expects zeros there
 *   vmtool write DEV OFF LEN SEED      O_DIRECT write of pages OFF/4096.. to a block device
 *   vmtool verify DEV OFF LEN SEED     O_DIRECT read and compare
 *   vmtool zeros DEV OFF LEN           O_DIRECT read, expect zeros
 *   vmtool flip DEV OFF                invert one byte at OFF (O_DIRECT read-modify-write)
 *   vmtool gen SEED FIRSTPAGE LEN      pattern bytes to stdout (LEN may be any size)
 *   vmtool ratio SEED PAGES            print the kind mix of PAGES pages
 * Exit status: 0 ok, 1 data mismatch, 2 usage or system error.
 *
 * Built static on the host by tests/vm/run (gcc -static), runs in the busybox guest.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "vmtool.h"
#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT 21
#endif
#define HDR 32
#define CHUNK (1 << 20)

enum kind { K_ZERO, K_SAME, K_RANDOM, K_TEXT, K_HEAP, K_NKINDS };
static const char *kind_name[K_NKINDS] = {"zero", "same", "random", "text", "heap"};

uint64_t splitmix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

static uint64_t page_key(uint64_t seed, uint64_t index)
{
	return splitmix(seed ^ splitmix(index));
}

/*
 * The page mix, in sixteenths (VMTOOL_MIX): "mixed" (the default) 1 zero, 1 same, 1 random,
 * 7 text, 6 heap; "text" 1/1/1/11/2; "heap" 1/1/1/2/11, as a managed runtime's heap; "noisy"
 * 1/1/4/5/5, more incompressible pages (media, compressed caches).
 */
static unsigned mix_zero = 1, mix_same = 1, mix_random = 1, mix_text = 7;

static int set_mix(const char *m)
{
	if (!m || !strcmp(m, "mixed"))
		return 0;
	if (!strcmp(m, "text"))
		mix_text = 11;
	else if (!strcmp(m, "heap"))
		mix_text = 2;
	else if (!strcmp(m, "noisy"))
		mix_random = 4, mix_text = 5;
	else
		return -1;
	return 0;
}

static enum kind page_kind(uint64_t key)
{
	unsigned k = key & 15;
	if (k < mix_zero)
		return K_ZERO;
	if (k < mix_zero + mix_same)
		return K_SAME;
	if (k < mix_zero + mix_same + mix_random)
		return K_RANDOM;
	if (k < mix_zero + mix_same + mix_random + mix_text)
		return K_TEXT;
	return K_HEAP;
}

/* A 64 KiB log-like corpus, the same in every run; text pages are slices of it. */
#define CORPUS (64 * 1024)
static char corpus[CORPUS + PAGE];

static void build_corpus(void)
{
	static const char *lvl[] = {"INFO ", "DEBUG", "WARN ", "INFO ", "ERROR"};
	static const char *comp[] = {"http", "db.pool", "cache", "scheduler", "auth", "worker"};
	static const char *msg[] = {
		"request completed path=/api/v1/items status=200",
		"connection returned to pool idle=7 busy=3",
		"cache miss key=user:session:",
		"job finished queue=default attempts=1 duration_ms=",
		"token refreshed for client_id=web-frontend scope=read",
		"retrying after timeout upstream=10.0.0.12:5432 attempt=",
		"GET /static/app.js HTTP/1.1 200 bytes=",
		"transaction committed rows=",
	};
	uint64_t r = 12345, ms = 0;
	size_t n = 0;
	while (n < sizeof(corpus) - 256) {
		/* a log: timestamps ascend, a few templates, short varying numbers */
		r = splitmix(r);
		ms += (r >> 36) % 900;
		int w = snprintf(corpus + n, 256,
				 "2025-05-20 %02u:%02u:%02u.%03u %s [%s-%u] %s%u\n",
				 (unsigned)(ms / 3600000) % 24, (unsigned)(ms / 60000) % 60,
				 (unsigned)(ms / 1000) % 60, (unsigned)(ms % 1000), lvl[(r >> 40) % 5],
				 comp[(r >> 44) % 6], (unsigned)(r >> 48) % 4,
				 msg[(r >> 52) % 8], (unsigned)(r >> 58));
		n += (size_t)w;
	}
	memset(corpus + n, ' ', sizeof(corpus) - n);
}

static void put_header(unsigned char *p, uint64_t seed, uint64_t index, enum kind k)
{
	uint64_t kk = k;
	memcpy(p, "UZVMPAGE", 8);
	memcpy(p + 8, &seed, 8);
	memcpy(p + 16, &index, 8);
	memcpy(p + 24, &kk, 8);
}

void gen_page(unsigned char *p, uint64_t seed, uint64_t index)
{
	uint64_t key = page_key(seed, index);
	enum kind k = page_kind(key);
	uint64_t *w = (uint64_t *)p;
	uint64_t r = key | 1;
	switch (k) {
	case K_ZERO:
		memset(p, 0, PAGE);
		return;
	case K_SAME:
		for (int i = 0; i < PAGE / 8; i++)
			w[i] = key | 0x0101010101010101ULL;
		return;
	case K_RANDOM:
		for (int i = HDR / 8; i < PAGE / 8; i++) {
			r ^= r << 13, r ^= r >> 7, r ^= r << 17;
			w[i] = r * 0x2545f4914f6cdd1dULL;
		}
		break;
	case K_TEXT: {
		size_t off = (key >> 8) % (CORPUS - PAGE);
		memcpy(p + HDR, corpus + off, PAGE - HDR);
		/* stamp the index into the text every 1 KiB, so no two pages are equal */
		for (int at = 1024; at < PAGE; at += 1024) {
			char s[24];
			snprintf(s, sizeof(s), " #%016" PRIx64 "\n", index);
			memcpy(p + at, s, 19);
		}
		break;
	}
	case K_HEAP: {
		/* objects: a size/type word, pointers into one arena, small ints; zero gaps */
		uint64_t base = 0x000055d400000000ULL + ((key >> 20) & 0xffff000ULL);
		int i = HDR / 8;
		while (i < PAGE / 8) {
			r ^= r << 13, r ^= r >> 7, r ^= r << 17;
			int len = 2 + (int)(r & 7), gap = (int)((r >> 3) & 3) * (int)((r >> 5) & 3);
			w[i++] = 0x21 + ((r >> 8) & 0x30);
			for (int f = 1; f < len && i < PAGE / 8; f++, i++) {
				unsigned c = (r >> (10 + 3 * f)) & 7;
				if (c < 3)
					w[i] = base + ((r >> (16 + f)) & 0xff0);
				else if (c < 5)
					w[i] = (r >> (20 + 2 * f)) & 0x3f;
				else if (c < 7)
					w[i] = 0;
				else
					w[i] = splitmix(r + f);
			}
			for (; gap > 0 && i < PAGE / 8; gap--)
				w[i++] = 0;
		}
		break;
	}
	default:
		break;
	}
	put_header(p, seed, index, k);
}

int reports;

/* Compare a page with its expected content; report the first few mismatches. */
static int check_page(const unsigned char *got, unsigned char *want, uint64_t seed,
		      uint64_t index, const char *where)
{
	gen_page(want, seed, index);
	if (memcmp(got, want, PAGE) == 0)
		return 0;
	if (reports++ < 10) {
		int b = 0;
		while (got[b] == want[b])
			b++;
		int bad = 0;
		for (int i = 0; i < PAGE; i++)
			bad += got[i] != want[i];
		fprintf(stderr,
			"vmtool: MISMATCH %s page %" PRIu64 " (%s): first bad byte +%d got 0x%02x want 0x%02x, %d bytes differ",
			where, index, kind_name[page_kind(page_key(seed, index))], b, got[b], want[b], bad);
		if (memcmp(got, "UZVMPAGE", 8) == 0) {
			uint64_t s, i;
			memcpy(&s, got + 8, 8);
			memcpy(&i, got + 16, 8);
			fprintf(stderr, "; page holds seed %" PRIu64 " index %" PRIu64, s, i);
		}
		fputc('\n', stderr);
	}
	return 1;
}

double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

long status_kb(const char *field)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long v = -1;
	size_t n = strlen(field);
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (strncmp(line, field, n) == 0 && line[n] == ':')
			v = strtol(line + n + 1, NULL, 10);
	fclose(f);
	return v;
}

uint64_t num(const char *s)
{
	char *end;
	errno = 0;
	uint64_t v = strtoull(s, &end, 0);
	if (errno || *end) {
		fprintf(stderr, "vmtool: not a number: %s\n", s);
		exit(2);
	}
	return v;
}

unsigned char *fill(size_t len, uint64_t seed)
{
	size_t pages = len / PAGE;
	unsigned char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED) {
		perror("vmtool: mmap");
		exit(2);
	}
	uint64_t count[K_NKINDS] = {0};
	double t = now();
	for (size_t i = 0; i < pages; i++) {
		gen_page(m + i * PAGE, seed, i);
		count[page_kind(page_key(seed, i))]++;
	}
	printf("vmtool: filled %zu MiB (%zu pages: zero %" PRIu64 " same %" PRIu64 " random %" PRIu64
	       " text %" PRIu64 " heap %" PRIu64 ") in %.1f s, VmRSS %ld kB VmSwap %ld kB\n",
	       len >> 20, pages, count[K_ZERO], count[K_SAME], count[K_RANDOM], count[K_TEXT],
	       count[K_HEAP], now() - t, status_kb("VmRSS"), status_kb("VmSwap"));
	fflush(stdout);
	return m;
}

/* Verify every page of m; odd passes go backward. Returns the number of bad pages. */
static size_t verify_pass(const unsigned char *m, size_t len, uint64_t seed, int p)
{
	static unsigned char want[PAGE] __attribute__((aligned(PAGE)));
	size_t pages = len / PAGE, bad = 0;
	double t = now();
	for (size_t j = 0; j < pages; j++) {
		size_t i = (p & 1) ? pages - 1 - j : j;
		bad += check_page(m + i * PAGE, want, seed, i, "memory");
	}
	printf("vmtool: verify pass %d (%s): %zu bad pages in %.1f s, VmRSS %ld kB VmSwap %ld kB\n",
	       p + 1, (p & 1) ? "backward" : "forward", bad, now() - t, status_kb("VmRSS"),
	       status_kb("VmSwap"));
	fflush(stdout);
	return bad;
}

static int cmd_swapfill(uint64_t mib, uint64_t seed, int passes)
{
	size_t len = mib << 20, bad = 0;
	unsigned char *m = fill(len, seed);
	for (int p = 0; p < passes; p++)
		bad += verify_pass(m, len, seed, p);
	munmap(m, len);
	printf("vmtool: swapfill %s: %zu MiB, %d passes, %zu bad pages\n", bad ? "FAILED" : "ok",
	       len >> 20, passes, bad);
	return bad ? 1 : 0;
}

static int cmd_swaphold(uint64_t mib, uint64_t seed)
{
	size_t len = mib << 20, pages = len / PAGE;
	sigset_t set;
	int sig, dropped = 0;
	sigemptyset(&set);
	sigaddset(&set, SIGUSR1);
	sigaddset(&set, SIGUSR2);
	sigprocmask(SIG_BLOCK, &set, NULL);
	unsigned char *m = fill(len, seed);
	if (madvise(m, len, MADV_PAGEOUT))
		perror("vmtool: madvise(MADV_PAGEOUT)");
	printf("vmtool: held, after MADV_PAGEOUT VmRSS %ld kB VmSwap %ld kB\n", status_kb("VmRSS"),
	       status_kb("VmSwap"));
	fflush(stdout);
	while (sigwait(&set, &sig) == 0 && sig == SIGUSR2 && !dropped) {
		/* odd pages go: a free of swap slots inside clusters whose other slots stay in use */
		uint64_t zero = 0;
		for (size_t i = 0; i < pages; i++) {
			if (i & 1) {
				if (madvise(m + i * PAGE, PAGE, MADV_DONTNEED))
					perror("vmtool: madvise(MADV_DONTNEED)");
			} else if (page_kind(page_key(seed, i)) == K_ZERO) {
				zero++;
			}
		}
		dropped = 1;
		printf("vmtool: dropped %zu pages, kept %zu (zero %" PRIu64 "), VmRSS %ld kB VmSwap %ld kB\n",
		       pages / 2, pages - pages / 2, zero, status_kb("VmRSS"), status_kb("VmSwap"));
		fflush(stdout);
	}
	printf("vmtool: released, VmRSS %ld kB VmSwap %ld kB\n", status_kb("VmRSS"), status_kb("VmSwap"));
	size_t bad = 0;
	if (dropped) {
		static unsigned char want[PAGE] __attribute__((aligned(PAGE)));
		static const unsigned char zeros[PAGE];
		for (size_t i = 0; i < pages; i++) {
			if (!(i & 1))
				bad += check_page(m + i * PAGE, want, seed, i, "memory");
			else if (memcmp(m + i * PAGE, zeros, PAGE)) {
				bad++;
				if (reports++ < 10)
					fprintf(stderr, "vmtool: MISMATCH dropped page %zu is not zeros\n", i);
			}
		}
		printf("vmtool: verify (kept pages, dropped ones zeros): %zu bad pages\n", bad);
	} else {
		bad = verify_pass(m, len, seed, 0);
	}
	munmap(m, len);
	printf("vmtool: swaphold %s: %zu MiB, %zu bad pages\n", bad ? "FAILED" : "ok", len >> 20, bad);
	return bad ? 1 : 0;
}

static int open_dev(const char *dev, int flags)
{
	int fd = open(dev, flags | O_DIRECT);
	if (fd < 0) {
		fprintf(stderr, "vmtool: open %s: %s\n", dev, strerror(errno));
		exit(2);
	}
	return fd;
}

static void io_all(int fd, unsigned char *buf, size_t n, uint64_t off, int write)
{
	size_t done = 0;
	while (done < n) {
		ssize_t r = write ? pwrite(fd, buf + done, n - done, off + done)
				  : pread(fd, buf + done, n - done, off + done);
		if (r <= 0) {
			fprintf(stderr, "vmtool: %s at %" PRIu64 ": %s\n", write ? "write" : "read",
				off + done, r < 0 ? strerror(errno) : "short transfer (end of device?)");
			exit(2);
		}
		done += (size_t)r;
	}
}

static void need_aligned(uint64_t off, uint64_t len)
{
	if (off % PAGE || len % PAGE) {
		fprintf(stderr, "vmtool: offset and length must be multiples of %d\n", PAGE);
		exit(2);
	}
}

/* mode: 0 write, 1 verify, 2 zeros */
static int cmd_dev(int mode, const char *dev, uint64_t off, uint64_t len, uint64_t seed)
{
	need_aligned(off, len);
	unsigned char *buf = aligned_alloc(PAGE, CHUNK), *want = aligned_alloc(PAGE, PAGE);
	static unsigned char zero[PAGE];
	int fd = open_dev(dev, mode == 0 ? O_WRONLY : O_RDONLY);
	uint64_t bad = 0;
	for (uint64_t pos = off; pos < off + len; pos += CHUNK) {
		size_t n = off + len - pos < CHUNK ? off + len - pos : CHUNK;
		if (mode == 0) {
			for (size_t i = 0; i < n; i += PAGE)
				gen_page(buf + i, seed, (pos + i) / PAGE);
			io_all(fd, buf, n, pos, 1);
			continue;
		}
		io_all(fd, buf, n, pos, 0);
		for (size_t i = 0; i < n; i += PAGE) {
			if (mode == 1) {
				bad += check_page(buf + i, want, seed, (pos + i) / PAGE, dev);
			} else if (memcmp(buf + i, zero, PAGE)) {
				if (reports++ < 10)
					fprintf(stderr, "vmtool: NOT ZERO %s at byte %" PRIu64 "\n", dev, pos + i);
				bad++;
			}
		}
	}
	if (mode == 0 && fsync(fd)) {
		perror("vmtool: fsync");
		return 2;
	}
	close(fd);
	if (bad)
		fprintf(stderr, "vmtool: %" PRIu64 " of %" PRIu64 " pages wrong on %s\n", bad, len / PAGE, dev);
	return bad ? 1 : 0;
}

static int cmd_flip(const char *dev, uint64_t off)
{
	unsigned char *buf = aligned_alloc(PAGE, PAGE);
	int fd = open_dev(dev, O_RDWR);
	uint64_t base = off & ~(uint64_t)(PAGE - 1);
	io_all(fd, buf, PAGE, base, 0);
	buf[off - base] ^= 0xff;
	io_all(fd, buf, PAGE, base, 1);
	fsync(fd);
	close(fd);
	fprintf(stderr, "vmtool: flipped byte %" PRIu64 " of %s\n", off, dev);
	return 0;
}

static int cmd_gen(uint64_t seed, uint64_t first, uint64_t len)
{
	unsigned char page[PAGE];
	for (uint64_t i = first; len; i++) {
		size_t n = len < PAGE ? len : PAGE;
		gen_page(page, seed, i);
		if (fwrite(page, 1, n, stdout) != n) {
			perror("vmtool: write");
			return 2;
		}
		len -= n;
	}
	return fflush(stdout) ? 2 : 0;
}

static int usage(void)
{
	fprintf(stderr, "usage: vmtool swapfill MIB SEED [PASSES] | swaphold MIB SEED |\n"
			"       walk MIB SEED PASSES cyclic|hotcold|rewrite |\n"
			"       phases MIB SEED PASSES N SECONDS|pPASSES |\n"
			"       write|verify DEV OFF LEN SEED |\n"
			"       zeros DEV OFF LEN | flip DEV OFF | gen SEED FIRSTPAGE LEN | ratio SEED PAGES\n");
	return 2;
}

int main(int argc, char **argv)
{
	if (set_mix(getenv("VMTOOL_MIX"))) {
		fprintf(stderr, "vmtool: VMTOOL_MIX is mixed, text, heap or noisy, not %s\n",
			getenv("VMTOOL_MIX"));
		return 2;
	}
	build_corpus();
	if (argc < 2)
		return usage();
	const char *c = argv[1];
	if (!strcmp(c, "swapfill") && (argc == 4 || argc == 5))
		return cmd_swapfill(num(argv[2]), num(argv[3]), argc == 5 ? (int)num(argv[4]) : 2);
	if (!strcmp(c, "walk") && argc == 6)
		return cmd_walk(num(argv[2]), num(argv[3]), (int)num(argv[4]), argv[5]);
	if (!strcmp(c, "phases") && argc == 7)
		return cmd_phases(num(argv[2]), num(argv[3]), (int)num(argv[4]), (int)num(argv[5]),
				  argv[6]);
	if (!strcmp(c, "swaphold") && argc == 4)
		return cmd_swaphold(num(argv[2]), num(argv[3]));
	if (!strcmp(c, "write") && argc == 6)
		return cmd_dev(0, argv[2], num(argv[3]), num(argv[4]), num(argv[5]));
	if (!strcmp(c, "verify") && argc == 6)
		return cmd_dev(1, argv[2], num(argv[3]), num(argv[4]), num(argv[5]));
	if (!strcmp(c, "zeros") && argc == 5)
		return cmd_dev(2, argv[2], num(argv[3]), num(argv[4]), 0);
	if (!strcmp(c, "flip") && argc == 4)
		return cmd_flip(argv[2], num(argv[3]));
	if (!strcmp(c, "gen") && argc == 5)
		return cmd_gen(num(argv[2]), num(argv[3]), num(argv[4]));
	if (!strcmp(c, "ratio") && argc == 4) {
		uint64_t count[K_NKINDS] = {0}, seed = num(argv[2]), n = num(argv[3]);
		for (uint64_t i = 0; i < n; i++)
			count[page_kind(page_key(seed, i))]++;
		for (int k = 0; k < K_NKINDS; k++)
			printf("%s %" PRIu64 "\n", kind_name[k], count[k]);
		return 0;
	}
	return usage();
}
