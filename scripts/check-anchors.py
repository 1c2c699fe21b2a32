#!/usr/bin/env python3
"""Checks that every `docs/<file>.md#<anchor>` cited in the repository's code, scripts and docs
names a heading that exists (docs/design.md#the-recovery-policy: the design is cited, so it must
stay true). An anchor is a heading's GitHub slug: lower case, punctuation other than '-' and '_'
dropped, spaces made '-', and '-1', '-2', ... for repeats.

Usage: check-anchors.py ROOT [--also PATH=TEXT]
--also adds a pretend file with TEXT (the test that the check can fail)."""
import os
import re
import sys

CITE = re.compile(r"docs/([A-Za-z0-9_.-]+\.md)#([A-Za-z0-9_-]+)")
SCANNED = (".h", ".cc", ".cu", ".py", ".sh", ".md", ".txt", ".cmake", ".json")
SKIPPED_DIRS = {".git", "build", "build-cpu", "node_modules", "__pycache__"}


def slug(heading):
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    found, seen = set(), {}
    in_code = False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("```"):
                in_code = not in_code
                continue
            m = None if in_code else re.match(r"#{1,6} (.+)", line)
            if not m:
                continue
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def main():
    root = sys.argv[1]
    pretend = {}
    args = sys.argv[2:]
    while args:
        if args[0] == "--also" and len(args) > 1:
            path, _, text = args[1].partition("=")
            pretend[path] = text
            args = args[2:]
        else:
            sys.exit(f"check-anchors.py: unknown argument {args[0]}")
    texts = dict(pretend)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIPPED_DIRS and not d.startswith("build")]
        for name in filenames:
            if name.endswith(SCANNED) or name == "CMakeLists.txt":
                path = os.path.join(dirpath, name)
                try:
                    with open(path, encoding="utf-8") as f:
                        texts[os.path.relpath(path, root)] = f.read()
                except (UnicodeDecodeError, OSError):
                    continue
    known, missing = {}, []
    cited = 0
    for rel, text in sorted(texts.items()):
        for number, line in enumerate(text.splitlines(), 1):
            for doc, anchor in CITE.findall(line):
                cited += 1
                if doc not in known:
                    path = os.path.join(root, "docs", doc)
                    known[doc] = anchors(path) if os.path.exists(path) else None
                if known[doc] is None:
                    missing.append(f"{rel}:{number}: docs/{doc} does not exist")
                elif anchor not in known[doc]:
                    missing.append(f"{rel}:{number}: docs/{doc} has no heading #{anchor}")
    for m in missing:
        print(m)
    print(f"{cited} citations checked, {len(missing)} missing")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
