#!/usr/bin/env python3
"""What compressing runs of neighbouring pages together would store, against page by page.

Reads a page file (raw 4 KiB pages, or zstd-compressed as testdata/sample.pages.zst), leaves out
same-filled pages as the device does, and prints the pool bytes of `zstd` page by page and of
`zstd` over runs of N consecutive pages cut into chunks of at most 4 KiB (objects rounded up to
16-byte classes, a full chunk costing a page, pages compressing to 3264 bytes or more stored raw,
an 8-byte header and 8 bytes a chunk per group). Needs python3-zstandard (pip install zstandard).
Usage: group-gain.py PAGEFILE [LEVEL]
"""

import sys

import zstandard

PAGE = 4096
HUGE = 3264  # the device stores a page raw from here (the class of whole pages)


def cost(n):
    """Pool bytes of one object of n bytes."""
    return PAGE if n >= HUGE else -(-n // 16) * 16


def group_cost(n_compressed):
    """Pool bytes of a group whose frame is n_compressed bytes."""
    chunks = -(-(n_compressed + 16) // PAGE)
    n = n_compressed + 8 + 8 * chunks
    full, tail = divmod(n, PAGE)
    return full * PAGE + (-(-tail // 16) * 16 if tail else 0)


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__.strip().splitlines()[-1])
    raw = open(sys.argv[1], "rb").read()
    if raw[:4] == b"\x28\xb5\x2f\xfd":
        raw = zstandard.ZstdDecompressor().decompressobj().decompress(raw)
    level = int(sys.argv[2]) if len(sys.argv) == 3 else 3
    cz = zstandard.ZstdCompressor(level=level, write_content_size=False)
    pages = [raw[i:i + PAGE] for i in range(0, len(raw) - PAGE + 1, PAGE)]
    stored = [p for p in pages if p != p[:8] * (PAGE // 8)]
    sizes = [len(cz.compress(p)) for p in stored]
    single = sum(cost(n) for n in sizes)
    print(f"{len(pages)} pages, {len(stored)} stored; zstd -{level} page by page: {single} bytes")
    for n in (2, 4, 8, 16, 32, 64):
        total, run = 0, []
        for page, size in zip(stored + [None], sizes + [None]):
            # A huge page stays single; so does a run of one.
            if page is not None and size < HUGE:
                run.append(page)
            if run and (page is None or size >= HUGE or len(run) == n):
                total += group_cost(len(cz.compress(b"".join(run)))) if len(run) > 1 else \
                    cost(len(cz.compress(run[0])))
                run = []
            if page is not None and size >= HUGE:
                total += PAGE
        print(f"  groups of {n:2d}: {total} bytes, {total / single:.3f} of page by page")


if __name__ == "__main__":
    main()
