"""Take an even, seeded sample of 4 KiB pages from several page files and interleave them.

Each input contributes the same number of pages (all of its pages if it has fewer). An input of
P pages is cut into K equal strata and one run of R neighbouring pages (--run, default 1) is
drawn at random from each, so the sample spans the whole dump (every heap region, not only the
first pages) and keeps zero and same-filled pages in the proportion they occur. The output takes
one run from each input in turn: with R > 1 neighbours stay neighbours, as a process's pages
reclaimed together sit in neighbouring swap slots (the kernel reclaims up to 32 pages a batch).
Usage: sample_pages.py --pages N [--run R] [--seed S] OUTPUT INPUT...
"""

import argparse
import os
import random
import sys

PAGE = 4096


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, required=True, help="total pages to write")
    ap.add_argument("--run", type=int, default=1, help="neighbouring pages a draw")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("output")
    ap.add_argument("inputs", nargs="+")
    args = ap.parse_args()

    run = args.run
    if run < 1 or args.pages % (run * len(args.inputs)):
        sys.exit(f"--pages {args.pages} is not a whole number of runs of {run} from each input")
    per_input = args.pages // len(args.inputs) // run
    rng = random.Random(args.seed)
    picks = []
    for path in args.inputs:
        size = os.path.getsize(path)
        if size % PAGE:
            sys.exit(f"{path}: {size} bytes is not a whole number of {PAGE}-byte pages")
        total = size // PAGE
        if total < run:
            sys.exit(f"{path}: {total} pages, fewer than one run of {run}")
        starts = total - run + 1
        k = min(per_input, starts)
        # Stratum i covers run starts [i*starts//k, (i+1)*starts//k).
        picks.append([rng.randrange(i * starts // k, (i + 1) * starts // k) for i in range(k)])

    files = [open(p, "rb") for p in args.inputs]
    written = zero = 0
    with open(args.output, "wb") as out:
        for i in range(max(len(p) for p in picks)):
            for f, pages in zip(files, picks):
                if i < len(pages):
                    f.seek(pages[i] * PAGE)
                    for _ in range(run):
                        page = f.read(PAGE)
                        out.write(page)
                        written += 1
                        zero += page.count(0) == PAGE
    print(f"{args.output}: {written} pages ({written * PAGE >> 20} MiB), "
          f"{zero} zero ({100.0 * zero / max(written, 1):.1f}%)")


if __name__ == "__main__":
    main()
