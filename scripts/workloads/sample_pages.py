"""Take an even, seeded sample of 4 KiB pages from several page files and interleave them.

Each input contributes the same number of pages (all of its pages if it has fewer). An input of
P pages is cut into K equal strata and one page is drawn at random from each, so the sample
spans the whole dump (every heap region, not only the first pages) and keeps zero and
same-filled pages in the proportion they occur. The output takes one page from each input in
turn. Usage: sample_pages.py --pages N [--seed S] OUTPUT INPUT...
"""

import argparse
import os
import random
import sys

PAGE = 4096


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, required=True, help="total pages to write")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("output")
    ap.add_argument("inputs", nargs="+")
    args = ap.parse_args()

    per_input = args.pages // len(args.inputs)
    rng = random.Random(args.seed)
    picks = []
    for path in args.inputs:
        size = os.path.getsize(path)
        if size % PAGE:
            sys.exit(f"{path}: {size} bytes is not a whole number of {PAGE}-byte pages")
        total = size // PAGE
        k = min(per_input, total)
        # Stratum i covers pages [i*total//k, (i+1)*total//k).
        picks.append([rng.randrange(i * total // k, (i + 1) * total // k) for i in range(k)])

    files = [open(p, "rb") for p in args.inputs]
    written = zero = 0
    with open(args.output, "wb") as out:
        for i in range(max(len(p) for p in picks)):
            for f, pages in zip(files, picks):
                if i < len(pages):
                    f.seek(pages[i] * PAGE)
                    page = f.read(PAGE)
                    out.write(page)
                    written += 1
                    zero += page.count(0) == PAGE
    print(f"{args.output}: {written} pages ({written * PAGE >> 20} MiB), "
          f"{zero} zero ({100.0 * zero / max(written, 1):.1f}%)")


if __name__ == "__main__":
    main()
