#!/usr/bin/env python3
"""The chart's version follows its files (a step of `make test`).

hack/chart-releases.txt records, for each released chart version, a digest of the
chart's files as released. The check fails when
  - Chart.yaml names a released version but the files differ from that release
    (a change without a bump),
  - Chart.yaml names a new version that is not greater than every released one, or
  - CHANGELOG.md has no section for Chart.yaml's version.

  python3 hack/chart-version.py            check
  python3 hack/chart-version.py --release  record the current version's digest
                                           (`make chart-release`, when the chart ships)
  --root DIR                               the repository (default: this one)

The digest: sha256 over every file's path and bytes, sorted by path; tests/ is left out
(helm unittest suites, not in the package: .helmignore).
"""

import argparse
import hashlib
import re
import sys
from pathlib import Path

CHART = Path("charts/cocoon-hibernation")
RECORD = Path("hack/chart-releases.txt")
SEMVER = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?$")


def digest(chart: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in chart.rglob("*") if p.is_file()):
        rel = f.relative_to(chart).as_posix()
        if rel.startswith("tests/"):
            continue
        h.update(rel.encode() + b"\0")
        data = f.read_bytes()
        h.update(str(len(data)).encode() + b"\0" + data)
    return "sha256:" + h.hexdigest()


def version_of(chart: Path) -> str:
    for line in (chart / "Chart.yaml").read_text().splitlines():
        m = re.match(r"^version:\s*[\"']?([^\"'\s#]+)", line)
        if m:
            return m.group(1)
    raise SystemExit(f"chart-version: no version in {chart / 'Chart.yaml'}")


def key(version: str):
    """SemVer precedence: a pre-release sorts before its release."""
    m = SEMVER.match(version)
    if not m:
        raise SystemExit(f"chart-version: {version!r} is not SemVer (MAJOR.MINOR.PATCH)")
    pre = m.group(4)
    parts = []
    for p in (pre or "").split(".") if pre else []:
        parts.append((0, int(p), "") if p.isdigit() else (1, 0, p))
    return (int(m.group(1)), int(m.group(2)), int(m.group(3)), pre is None, parts)


def released(root: Path) -> dict:
    out = {}
    path = root / RECORD
    if path.exists():
        for line in path.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                version, dig = line.split()
                out[version] = dig
    return out


def has_changelog(root: Path, version: str) -> bool:
    path = root / "CHANGELOG.md"
    if not path.exists():
        return False
    want = re.compile(r"^## \[?" + re.escape(version) + r"\]?(\s|$)")
    return any(want.match(line) for line in path.read_text().splitlines())


def check(root: Path) -> list:
    chart = root / CHART
    version, now, rel = version_of(chart), digest(root / CHART), released(root)
    errors = []
    if version in rel:
        if rel[version] != now:
            errors.append(
                f"chart files changed since {version} was released: "
                "bump version in Chart.yaml and add a CHANGELOG entry"
            )
    else:
        newer = [v for v in rel if key(v) >= key(version)]
        if newer:
            errors.append(
                f"Chart.yaml version {version} is new but not greater than the released "
                f"{', '.join(sorted(newer, key=key))}: bump past {max(rel, key=key)}"
            )
    if not has_changelog(root, version):
        errors.append(f"CHANGELOG.md has no section '## [{version}]'")
    return errors


def release(root: Path) -> None:
    chart = root / CHART
    version, now, rel = version_of(chart), digest(chart), released(root)
    key(version)
    if not has_changelog(root, version):
        raise SystemExit(f"chart-version: CHANGELOG.md has no section '## [{version}]'")
    if rel.get(version) == now:
        print(f"chart-version: {version} already recorded")
        return
    if version in rel:
        raise SystemExit(f"chart-version: {version} was released with other files: bump the version")
    with (root / RECORD).open("a") as f:
        f.write(f"{version} {now}\n")
    print(f"chart-version: recorded {version} {now} in {RECORD}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--release", action="store_true", help="record the current version's digest")
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    args = ap.parse_args()
    if args.release:
        release(args.root)
        return 0
    errors = check(args.root)
    for e in errors:
        print(f"chart-version: FAIL: {e}", file=sys.stderr)
    if errors:
        return 1
    print(f"chart-version: ok ({version_of(args.root / CHART)}, {digest(args.root / CHART)[:19]}…)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
