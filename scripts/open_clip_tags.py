"""The list of open_clip's pretrained tags in docs/models.md and how vltool runs each, generated from
open_clip's registry (open_clip.list_pretrained) and vltool's own rules (vltool.model.open_clip_tag_support).

    python scripts/open_clip_tags.py                       # print the list
    python scripts/open_clip_tags.py --write docs/models.md  # regenerate the marked list
    python scripts/open_clip_tags.py --check docs/models.md  # exit 1 if it is out of date

The list lies between two HTML comments, replaced whole:

    <!-- open_clip-tags -->
    <!-- /open_clip-tags -->

tests/test_open_clip_native.py checks it against the installed open_clip and timm.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MARK = re.compile(r"(<!-- open_clip-tags -->\n)(?P<body>.*?)(<!-- /open_clip-tags -->)", re.S)


def table() -> str:
    import open_clip

    from vltool.model import open_clip_tag_support

    by_arch: dict[str, list[str]] = {}
    for arch, tag in open_clip.list_pretrained():
        by_arch.setdefault(arch, []).append(tag)
    counts = {"rebuilt": 0, "open_clip": 0, "refused": 0}
    rows = []
    for arch, tags in by_arch.items():
        kinds = {}
        for tag in tags:
            kind, detail = open_clip_tag_support(arch, tag)
            counts[kind] += 1
            kinds.setdefault((kind, detail), []).append(tag)
        for (kind, detail), ts in kinds.items():
            how = {"rebuilt": "vltool's towers", "open_clip": f"open_clip's own model ({detail})",
                   "refused": f"refused before fetching: {detail}"}[kind]
            rows.append(f"| `{arch}` | {', '.join(f'`{t}`' for t in ts)} | {how} |")
    total = sum(counts.values())
    head = (f"open_clip {open_clip.__version__}: {total} pretrained tags; {counts['rebuilt']} run on vltool's own towers "
            f"(evaluated and fine-tuned), {counts['open_clip']} as open_clip's own model (evaluated), "
            f"{counts['refused']} refused.\n\n| architecture | tags | how vltool runs it |\n|---|---|---|\n")
    return head + "\n".join(rows) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", metavar="DOC")
    ap.add_argument("--check", metavar="DOC")
    a = ap.parse_args(argv)
    doc = a.write or a.check
    if doc is None:
        print(table(), end="")
        return 0
    text = Path(doc).read_text()
    m = MARK.search(text)
    if m is None:
        print(f"{doc}: no <!-- open_clip-tags --> ... <!-- /open_clip-tags --> markers", file=sys.stderr)
        return 1
    new = text[:m.start("body")] + table() + text[m.end("body"):]
    if a.check:
        if new != text:
            print(f"{doc}: the open_clip tag list is out of date: python scripts/open_clip_tags.py --write {doc}", file=sys.stderr)
            return 1
        return 0
    Path(doc).write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
