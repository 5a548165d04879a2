#!/usr/bin/env python3
"""Caps a minimized fuzz corpus (`make fuzz-cmin`, issue 22): keeps the KEEP inputs that
cover the most, chosen greedily from libFuzzer's own merge control file.

    fuzz-keep.py CONTROL_FILE KEEP DIR

libFuzzer's -set_cover_merge keeps every input that adds a feature; for the parsers that
is hundreds of inputs each adding one or two. This keeps, in turn, the input that adds
the most features not yet covered (the smaller on a tie) until KEEP are kept, removes
the others from DIR (where the merge named each input by the SHA-1 of its bytes), and
prints the share of features kept.
"""
import hashlib
import os
import sys


def main() -> None:
    control, keep, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    with open(control) as f:
        lines = f.read().splitlines()
    count = int(lines[0])
    paths = lines[2 : 2 + count]
    features: dict[int, set[int]] = {}
    sizes: dict[int, int] = {}
    for line in lines[2 + count :]:
        parts = line.split()
        if parts[:1] == ["STARTED"]:
            sizes[int(parts[1])] = int(parts[2])
        elif parts[:1] == ["FT"]:
            features[int(parts[1])] = {int(x) for x in parts[2:]}
    everything = set().union(*features.values()) if features else set()
    covered: set[int] = set()
    chosen: list[int] = []
    while len(chosen) < keep:
        best = max(
            features,
            key=lambda i: (len(features[i] - covered), -sizes.get(i, 0)),
            default=None,
        )
        if best is None or not features[best] - covered:
            break
        chosen.append(best)
        covered |= features.pop(best)
    names = set()
    for i in chosen:
        with open(paths[i], "rb") as f:
            names.add(hashlib.sha1(f.read()).hexdigest())
    for name in os.listdir(out):
        if name not in names:
            os.remove(os.path.join(out, name))
    share = 100 * len(covered) / max(len(everything), 1)
    print(f"kept {len(chosen)} inputs covering {share:.1f}% of {len(everything)} features")


if __name__ == "__main__":
    main()
