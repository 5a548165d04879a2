#!/usr/bin/env python3
"""Every Markdown link in README.md, docs/ and hack/README.md resolves inside the repository:
the file exists and, for `file.md#anchor`, the heading does (GitHub's anchor rules). A user
who clones the repository must never follow a link out of it or into nothing."""
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def anchors(path):
    text = open(path, encoding="utf-8").read()
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    heads = re.findall(r"^#+ (.*)$", text, re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def main():
    os.chdir(ROOT)
    files = ["README.md", "hack/README.md", *sorted(glob.glob("docs/*.md"))]
    bad = []
    for f in files:
        text = open(f, encoding="utf-8").read()
        text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
        for link in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", link):
                bad.append(f"{f}: {link} leaves the repository")
                continue
            path, _, anchor = link.partition("#")
            target = os.path.normpath(os.path.join(os.path.dirname(f), path)) if path else f
            if not os.path.exists(target):
                bad.append(f"{f}: {link} names a file that does not exist")
            elif anchor and target.endswith(".md") and anchor not in anchors(target):
                bad.append(f"{f}: {link} names a heading {target} does not have")
    for b in bad:
        print(b, file=sys.stderr)
    print(f"links: {len(files)} files checked, {len(bad)} broken")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
