#!/usr/bin/env python3
"""Checks the internal links of the book (docs/src) and of README.md.

Every relative link must name a file or directory that exists in the repository, every
book page must be listed in SUMMARY.md, and every `#anchor` on a markdown target must be
the id of one of its headings, slugged as mdBook slugs them (and, for the files outside
the book, as GitHub does: the same rule for the headings used here). Links to other
sites (http, https, mailto) are not followed.

With --html DIR (mdBook's output), the ids this script computes for each page are also
checked against the ids mdBook wrote, so the slug rule here cannot drift from mdBook's.

Why not mdbook-linkcheck or mdbook-linkcheck2: neither checks anchors (the upstream
request, mdbook-linkcheck#52, is open), mdbook-linkcheck fails on mdBook 0.5's render
context, and README.md is not part of the book. Standard library only.

Usage: book_links.py [--html DIR] REPO_ROOT
"""

import argparse
import html
import re
import sys
from pathlib import Path

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
# [text](target) and ![alt](target); the target ends at whitespace or ')'.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def lines_outside_code(text):
    """Yields (line number, line) for lines outside fenced code blocks."""
    fence = None
    for n, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif m.group(1) == fence:
                fence = None
            continue
        if fence is None:
            yield n, line


def heading_text(raw):
    """The rendered text of a heading's markdown: code spans, links and emphasis unwrapped."""
    text = INLINE_CODE.sub(lambda m: m.group(2).strip(), raw)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"(\*\*|\*)", "", text)
    return html.unescape(text)


def slug(text):
    """mdBook's normalize_id: alphanumerics, '_' and '-' kept (lower-cased), whitespace
    becomes '-', everything else is dropped."""
    out = []
    for ch in text:
        if ch.isalnum() or ch in "_-":
            out.append(ch.lower())
        elif ch.isspace():
            out.append("-")
    return "".join(out)


def anchors(path, cache={}):
    """The heading ids of a markdown file, with mdBook's -1, -2 suffixes for repeats."""
    if path not in cache:
        ids, seen = [], {}
        for _, line in lines_outside_code(path.read_text(encoding="utf-8")):
            m = HEADING.match(line)
            if not m:
                continue
            base = slug(heading_text(m.group(2)))
            n = seen.get(base, 0)
            seen[base] = n + 1
            ids.append(base if n == 0 else f"{base}-{n}")
        cache[path] = ids
    return cache[path]


def links(path):
    for n, line in lines_outside_code(path.read_text(encoding="utf-8")):
        stripped = INLINE_CODE.sub("", line)
        for m in INLINE_LINK.finditer(stripped):
            yield n, m.group(1)
        m = REF_DEF.match(stripped)
        if m:
            yield n, m.group(1)


def summary_pages(src):
    pages = set()
    for _, target in links(src / "SUMMARY.md"):
        if not EXTERNAL.match(target):
            pages.add((src / target.split("#", 1)[0]).resolve())
    return pages


def check(root, html_dir):
    src = root / "docs" / "src"
    errors = []
    listed = summary_pages(src)
    pages = sorted(src.rglob("*.md"))
    for page in pages:
        if page.name != "SUMMARY.md" and page.resolve() not in listed:
            errors.append(f"{page.relative_to(root)}: not listed in docs/src/SUMMARY.md, so mdBook does not render it")
    for doc in pages + [root / "README.md"]:
        rel = doc.relative_to(root)
        for n, target in links(doc):
            if EXTERNAL.match(target) or target.startswith("//"):
                continue
            path_part, _, anchor = target.partition("#")
            dest = (doc.parent / path_part).resolve() if path_part else doc.resolve()
            where = f"{rel}:{n}: {target}"
            try:
                dest.relative_to(root.resolve())
            except ValueError:
                errors.append(f"{where}: points outside the repository")
                continue
            if not dest.exists():
                errors.append(f"{where}: no such file or directory")
                continue
            if doc != root / "README.md" and dest.suffix == ".md" and src.resolve() in dest.parents and dest not in listed:
                errors.append(f"{where}: a page SUMMARY.md does not list")
            if anchor:
                if dest.suffix != ".md":
                    errors.append(f"{where}: an anchor on a file that is not markdown")
                elif anchor not in anchors(dest):
                    errors.append(f"{where}: no heading with id '{anchor}' in {dest.relative_to(root.resolve())}")
    if html_dir:
        for page in pages:
            if page.name == "SUMMARY.md":
                continue
            out = html_dir / page.relative_to(src).with_suffix(".html")
            if not out.exists():
                errors.append(f"{out}: mdBook wrote no page for {page.relative_to(root)}")
                continue
            ids = set(re.findall(r'<h[1-6] id="([^"]+)"', out.read_text(encoding="utf-8")))
            for a in anchors(page):
                if a not in ids:
                    errors.append(
                        f"{page.relative_to(root)}: heading id '{a}' computed here is not in mdBook's {out.name} "
                        f"(its ids: {', '.join(sorted(ids))}): the slug rule in {Path(__file__).name} needs updating"
                    )
    return errors


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--html", type=Path, help="mdBook's HTML output, to check the slug rule against")
    ap.add_argument("root", type=Path)
    args = ap.parse_args()
    root = args.root.resolve()
    errors = check(root, args.html.resolve() if args.html else None)
    for e in errors:
        print(f"book_links: {e}", file=sys.stderr)
    if errors:
        print(f"book_links: {len(errors)} broken link(s)", file=sys.stderr)
        return 1
    print("book_links: every internal link and anchor resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
