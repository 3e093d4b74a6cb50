#!/usr/bin/env python3
"""Write the 1000 ImageNet-1k class names, in class-index order, one per line.

    make_classes.py TIMM_WHEEL OUT_FILE

Reads timm/data/_info/imagenet_synsets.txt (the 1000 wnids, sorted = class
order) and imagenet_synset_to_lemma.txt (wnid -> "tabby, tabby cat") from the
timm wheel without installing it, and keeps the full lemma string.
"""

import os
import sys
import zipfile

SYNSETS = "timm/data/_info/imagenet_synsets.txt"
LEMMAS = "timm/data/_info/imagenet_synset_to_lemma.txt"
# Spot checks of the standard class order.
EXPECTED = {0: "tench", 281: "tabby", 285: "Egyptian cat", 657: "missile", 967: "espresso", 999: "toilet tissue"}


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    wheel, out = sys.argv[1:]
    with zipfile.ZipFile(wheel) as z:
        wnids = z.read(SYNSETS).decode().split()
        lemma = dict(line.split("\t", 1) for line in z.read(LEMMAS).decode().splitlines() if line)
    if len(wnids) != 1000 or wnids != sorted(wnids):
        sys.exit(f"{SYNSETS}: expected 1000 sorted wnids, got {len(wnids)}")
    names = [lemma[w].strip() for w in wnids]
    for i, want in EXPECTED.items():
        if not names[i].startswith(want):
            sys.exit(f"class {i} is {names[i]!r}, expected {want!r}: class order is wrong")
    with open(out + ".tmp", "w") as f:
        f.write("\n".join(names) + "\n")
    os.replace(out + ".tmp", out)
    print(f"wrote {len(names)} class names to {out}")


if __name__ == "__main__":
    main()
