#!/usr/bin/env python3
"""Rule IDs cited by test names, checked against docs/rules.md.

  hack/rule-index.py          fail when a test cites a rule ID that docs/rules.md never defines
  hack/rule-index.py --write  also rewrite the "Where each rule is proved" table

A test cites rules through the leading tokens of its name: `s1_h3_...`, `e2e_s2_...`, and
an rstest case through its own name too (`#[case::v4_pod_ref_immutable(...)]`, listed as
`<fn>::<case>`).
"""
import pathlib
import re
import sys
from collections import defaultdict

ROOT = pathlib.Path(__file__).resolve().parent.parent
RULES = ROOT / "docs" / "rules.md"
START, END = "<!-- rule-index:start -->", "<!-- rule-index:end -->"
RULE_TOKEN = re.compile(r"^[arhwdfgscovpkiq][0-9]+$")
TEST_ATTR = re.compile(r"#\[(test|rstest|tokio::test|case|proptest)|proptest!")
FN = re.compile(r"^\s*(?:pub\s+)?(?:async\s+)?fn\s+([a-z0-9_]+)")
CASE = re.compile(r"^\s*#\[case::([a-z0-9_]+)")


def defined_ids(text):
    return set(re.findall(r"^- \*\*([A-Z][0-9]+)\b", text, re.M))


def cited(name):
    # An rstest case `<fn>::<case>` cites through its case name; its fn cites on its own.
    tokens = name.split("::")[-1].split("_")
    if tokens and tokens[0] == "e2e":
        tokens = tokens[1:]
    ids = []
    for t in tokens:
        if not RULE_TOKEN.match(t):
            break
        ids.append(t.upper())
    return ids


def test_functions():
    files = [f for d in ("tests", "src", "crates") for f in sorted((ROOT / d).rglob("*.rs"))]
    for path in files:
        lines = path.read_text(encoding="utf-8").splitlines()
        in_proptest = False
        cases = []
        for i, line in enumerate(lines):
            if "proptest!" in line:
                in_proptest = True
            c = CASE.match(line)
            if c:
                cases.append(c.group(1))
            m = FN.match(line)
            if not m:
                continue
            window = "\n".join(lines[max(0, i - 8) : i])
            rel = path.relative_to(ROOT).as_posix()
            if TEST_ATTR.search(window) or in_proptest or cases:
                yield rel, m.group(1)
                for case in cases:
                    yield rel, f"{m.group(1)}::{case}"
            cases = []


def main():
    text = RULES.read_text(encoding="utf-8")
    known = defined_ids(text)
    proved = defaultdict(lambda: defaultdict(list))
    undefined = []
    for path, name in test_functions():
        for rule in cited(name):
            if rule not in known:
                undefined.append(f"{path}: {name} cites {rule}")
            proved[rule][path].append(name)
    if undefined:
        print("rule-index: tests cite rule IDs that docs/rules.md does not define:")
        print("\n".join(f"  {u}" for u in sorted(set(undefined))))
        return 1
    unproved = sorted(known - set(proved))
    if "--write" in sys.argv:
        order = "ARHWDFGSCOVPKIQ"
        rows = ["| rule | tests (by file) |", "|---|---|"]
        for rule in sorted(proved, key=lambda r: (order.index(r[0]), int(r[1:]))):
            cells = "<br>".join(
                f"`{path}`: " + ", ".join(f"`{n}`" for n in sorted(set(names)))
                for path, names in sorted(proved[rule].items())
            )
            rows.append(f"| {rule} | {cells} |")
        if START not in text or END not in text:
            print(f"rule-index: {RULES} lacks the {START} / {END} markers")
            return 1
        head, rest = text.split(START, 1)
        _, tail = rest.split(END, 1)
        RULES.write_text(head + START + "\n" + "\n".join(rows) + "\n" + END + tail, encoding="utf-8")
    print(
        f"rule-index: {len(known)} rules defined, {len(proved)} cited by tests"
        + (f"; not cited by any test name: {', '.join(unproved)}" if unproved else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
