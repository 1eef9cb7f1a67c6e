"""`vltool import`: every source format, built here in a temporary directory, with one corrupt image
and one missing file each, imports from the CLI with the right rows, columns and skip report."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import datasets
import pytest
from PIL import Image
from typer.testing import CliRunner

from vltool.cli import app
from vltool.errors import UsageError
from vltool.importer import ImportConfig, expand_braces, import_data, iter_tar, prepare_image

runner = CliRunner()


# ---------------------------------------------------------------------------------------------- helpers


def jpeg(color=(200, 30, 30), size=(24, 16)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="JPEG")
    return buf.getvalue()


def png_rgba(size=(20, 20)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGBA", size, (0, 120, 255, 128)).save(buf, format="PNG")
    return buf.getvalue()


CORRUPT = b"\xff\xd8\xff\xe0 this is not really a jpeg"


def write_images(d: Path, n: int) -> list[Path]:
    d.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        p = d / f"img{i}.jpg"
        p.write_bytes(jpeg((20 * i, 100, 50)))
        paths.append(p)
    (d / "corrupt.jpg").write_bytes(CORRUPT)
    return paths


def run_import(*args: str) -> dict:
    result = runner.invoke(app, ["import", *args, "--json"])
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout)


def report(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "skipped.jsonl").read_text().splitlines()]


def load(out: Path) -> datasets.Dataset:
    return datasets.load_from_disk(str(out))


def add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


# ---------------------------------------------------------------------------------------------- tables


def test_csv_open_clip_layout(tmp_path):
    """open_clip's CSV: tab-separated in a .csv, columns filepath/title, paths relative to the table."""
    write_images(tmp_path / "imgs", 3)
    rows = [
        ("imgs/img0.jpg", "a red square"),
        ("imgs/img1.jpg", "  padded caption  "),
        ("imgs/corrupt.jpg", "broken"),
        ("imgs/nowhere.jpg", "missing"),
        ("imgs/img2.jpg", "   "),
        (str(tmp_path / "imgs" / "img2.jpg"), "an absolute path"),
    ]
    (tmp_path / "train.csv").write_text("filepath\ttitle\n" + "".join(f"{p}\t{c}\n" for p, c in rows))
    out = tmp_path / "data"
    s = run_import(str(tmp_path / "train.csv"), "--out", str(out))
    assert (s["format"], s["rows_read"], s["rows_out"], s["rows_skipped"]) == ("csv", 6, 3, 3)
    assert s["skipped"] == {"empty caption": 1, "missing file": 1, "undecodable image": 1}
    assert (s["image_column"], s["caption_column"]) == ("filepath", "title")
    ds = load(out)
    assert ds.column_names == ["id", "image", "caption"]
    assert isinstance(ds.features["image"], datasets.Image)
    assert ds["id"] == ["0", "1", "5"]
    assert ds["caption"] == ["a red square", "padded caption", "an absolute path"]
    assert ds[0]["image"].size == (24, 16)
    rep = report(out)
    assert [(r["source"], r["id"], r["reason"]) for r in rep] == [
        ("train.csv row 2", "2", "undecodable image"),
        ("train.csv row 3", "3", "missing file"),
        ("train.csv row 4", "4", "empty caption"),
    ]
    prov = json.loads((out / "vltool.json").read_text())
    assert prov["command"] == "import" and prov["rows_in"] == 6 and prov["rows_out"] == 3
    assert prov["inputs"][0]["format"] == "csv"


@pytest.mark.parametrize("rows,where,expect", [
    ("imgs/img0.jpg,a cat\nimgs/img1.jpg,a dog,and more\nimgs/img2.jpg,a bird\n", "row 1 (line 3)", "has 3 fields where the header has 2"),
    ("imgs/img0.jpg,a cat\nimgs/img1.jpg\nimgs/img2.jpg,a bird\n", "row 1 (line 3)", "has 1 fields where the header has 2"),
    ('imgs/img0.jpg,a cat\nimgs/img2.jpg,"a bird\nimgs/img0.jpg,a cow\nimgs/img1.jpg,a hen\n', "row 1 from line 3",
     "cannot be read (unexpected end of data): a quote is not closed"),
])
def test_csv_ragged_rows_and_an_unclosed_quote_are_refused_with_the_row(tmp_path, rows, where, expect):
    """A row with more fields than the header was skipped, one with fewer padded (caption None, skipped as
    empty), and a quote never closed read the rest of the file as one caption (issue 44): the table cannot be
    read row by row, so it is refused, naming the row and its line; nothing is written."""
    write_images(tmp_path / "imgs", 3)
    (tmp_path / "t.csv").write_text("filepath,title\n" + rows)
    out = tmp_path / "data"
    result = runner.invoke(app, ["import", str(tmp_path / "t.csv"), "--out", str(out)])
    assert result.exit_code == 2, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: {tmp_path / 't.csv'}: ") and where in line and expect in line, line
    assert not out.exists()


def test_csv_header_naming_a_column_twice_is_refused(tmp_path):
    """`filepath,title,title`: one of the two columns was kept silently, the caption maybe from the wrong one."""
    write_images(tmp_path / "imgs", 1)
    (tmp_path / "t.csv").write_text("filepath,title,title\nimgs/img0.jpg,a cat,a dog\n")
    result = runner.invoke(app, ["import", str(tmp_path / "t.csv"), "--out", str(tmp_path / "data")])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines()[-1] == (f"error: {tmp_path / 't.csv'}: the header names a column twice ('title' in "
                                                      "columns 2, 3); give each column its own name")
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16", "utf-16-le-bom", "utf-16-be-bom"])
@pytest.mark.parametrize("sep", [",", "\t"])
def test_csv_with_a_bom_and_crlf_line_ends(tmp_path, encoding, sep):
    """What a spreadsheet saves: a byte-order mark (UTF-8, or UTF-16 for "Unicode text") and CRLF line ends,
    the caption first so the mark touches its name."""
    import codecs

    write_images(tmp_path / "imgs", 2)
    text = f"title{sep}filepath\r\na cat{sep}imgs/img0.jpg\r\n\"a dog\r\non two lines\"{sep}imgs/img1.jpg\r\n"
    if encoding == "utf-16-le-bom":
        data = codecs.BOM_UTF16_LE + text.encode("utf-16-le")
    elif encoding == "utf-16-be-bom":
        data = codecs.BOM_UTF16_BE + text.encode("utf-16-be")
    else:
        data = text.encode(encoding)
    (tmp_path / "t.csv").write_bytes(data)
    s = run_import(str(tmp_path / "t.csv"), "--out", str(tmp_path / "data"))
    assert (s["rows_out"], s["caption_column"], s["image_column"]) == (2, "title", "filepath")
    assert load(tmp_path / "data")["caption"] == ["a cat", "a dog\r\non two lines"]


def test_tsv_with_a_quoted_multi_line_field_is_read(tmp_path):
    """A quoted field holding line breaks is one field of one row (it was skipped as "read over several lines")."""
    write_images(tmp_path / "imgs", 3)
    (tmp_path / "t.tsv").write_text('filepath\ttitle\nimgs/img0.jpg\t"a cat\non two lines"\nimgs/img1.jpg\ta dog\n'
                                    'imgs/img2.jpg\t"a ""quoted"" bird\twith a tab"\n')
    s = run_import(str(tmp_path / "t.tsv"), "--out", str(tmp_path / "data"))
    assert (s["rows_out"], s["rows_skipped"]) == (3, 0)
    ds = load(tmp_path / "data")
    assert ds["caption"] == ["a cat\non two lines", "a dog", 'a "quoted" bird\twith a tab'] and ds["id"] == ["0", "1", "2"]


def test_tsv_named_columns_labels_ids_extras(tmp_path):
    write_images(tmp_path / "root" / "pic", 4)
    lines = ["key\tpic\ttext\tcls\tsource", "k0\tpic/img0.jpg\tone\tdog\tweb", "k1\tpic/img1.jpg\ttwo\tcat\tbook",
             "k2\tpic/img2.jpg\tthree\tdog\tweb", "k3\tpic/corrupt.jpg\tfour\tcat\tweb", "k4\tpic/img3.jpg\tfive\t\tweb"]
    (tmp_path / "meta.tsv").write_text("\n".join(lines) + "\n")
    out = tmp_path / "data"
    s = run_import(str(tmp_path / "meta.tsv"), "--out", str(out), "--image-column", "pic", "--caption-column", "text",
                   "--label-column", "cls", "--image-root", str(tmp_path / "root"), "--extra-column", "source")
    assert (s["rows_read"], s["rows_out"]) == (5, 3)
    assert s["skipped"] == {"missing label": 1, "undecodable image": 1}
    assert s["id_column"] == "key" and s["classes"] == 2
    ds = load(out)
    assert ds.column_names == ["id", "image", "caption", "label", "source"]
    assert ds.features["label"].names == ["cat", "dog"]
    assert ds["id"] == ["k0", "k1", "k2"]
    assert [ds.features["label"].int2str(v) for v in ds["label"]] == ["dog", "cat", "dog"]
    assert ds["source"] == ["web", "book", "web"]


def test_jsonl_several_captions_and_bad_line(tmp_path):
    write_images(tmp_path, 2)
    lines = [
        json.dumps({"id": "a", "image": "img0.jpg", "caption": ["first", "second", " "]}),
        "{not json",
        json.dumps({"id": "b", "image": "img1.jpg", "caption": "only one"}),
        json.dumps({"id": "c", "image": "corrupt.jpg", "caption": ["x"]}),
        json.dumps({"id": "d", "image": "img1.jpg", "caption": []}),
    ]
    (tmp_path / "data.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    s = run_import(str(tmp_path / "data.jsonl"), "--out", str(out))
    assert (s["rows_read"], s["rows_out"]) == (5, 2)
    assert s["skipped"] == {"empty caption": 1, "undecodable image": 1, "unreadable row": 1}
    ds = load(out)
    assert ds.column_names == ["id", "image", "caption", "captions"]
    assert ds["captions"] == [["first", "second"], ["only one"]]
    assert ds["caption"] == ["first", "only one"]


def test_parquet_with_paths_and_duplicate_ids(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    write_images(tmp_path / "im", 3)
    table = pa.table({
        "id": ["x", "y", "x", "z"],
        "image_path": ["im/img0.jpg", "im/img1.jpg", "im/img2.jpg", "im/gone.jpg"],
        "text": ["one", "two", "three", "four"],
    })
    pq.write_table(table, tmp_path / "t.parquet")
    out = tmp_path / "out"
    s = run_import(str(tmp_path / "t.parquet"), "--out", str(out))
    assert s["skipped"] == {"duplicate id": 1, "missing file": 1}
    ds = load(out)
    assert ds["id"] == ["x", "y"] and ds["caption"] == ["one", "two"]
    assert {r["reason"] for r in report(out)} == {"duplicate id", "missing file"}


def test_max_side_resizes(tmp_path):
    (tmp_path / "big.jpg").write_bytes(jpeg(size=(300, 100)))
    (tmp_path / "small.png").write_bytes(png_rgba((10, 10)))
    (tmp_path / "t.csv").write_text("filepath,title\nbig.jpg,big\nsmall.png,small\n")
    out = tmp_path / "out"
    s = run_import(str(tmp_path / "t.csv"), "--out", str(out), "--max-side", "30")
    assert s["rows_out"] == 2 and s["max_side"] == 30
    ds = load(out)
    assert ds[0]["image"].size == (30, 10) and ds[0]["image"].format == "JPEG"
    assert ds[1]["image"].size == (10, 10) and ds[1]["image"].mode == "RGBA"  # small: kept byte for byte
    raw = ds.cast_column("image", datasets.Image(decode=False))[1]["image"]["bytes"]
    assert raw == (tmp_path / "small.png").read_bytes()


def test_prepare_image_rejects_truncated_jpeg():
    data = jpeg(size=(64, 64))
    with pytest.raises(Exception):
        prepare_image(data[: len(data) // 2], None)
    assert prepare_image(data, None) is data


# ---------------------------------------------------------------------------------------------- shards


def write_shards(d: Path) -> None:
    """Two img2dataset-style shards (00000.tar, 00001.tar) plus the metadata parquet img2dataset writes beside them."""
    d.mkdir(parents=True, exist_ok=True)
    samples = [
        [("000000000", jpeg(), "a photo", {"key": "000000000", "url": "http://x/0"}),
         ("000000001", jpeg((0, 0, 255)), "blue", {"key": "000000001", "url": "http://x/1"}),
         ("000000002", CORRUPT, "corrupt", {"key": "000000002"})],
        [("000010000", jpeg((0, 255, 0)), "green", {"key": "000010000", "url": "http://x/2"}),
         ("000010001", None, "no image", {"key": "000010001"}),
         ("000010002", jpeg(), "", {"key": "000010002"})],
    ]
    for s, shard in enumerate(samples):
        with tarfile.open(d / f"{s:05d}.tar", "w") as tar:
            for key, img, cap, meta in shard:
                if img is not None:
                    add_member(tar, f"{key}.jpg", img)
                add_member(tar, f"{key}.txt", cap.encode())
                add_member(tar, f"{key}.json", json.dumps(meta).encode())
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"key": ["000000000"], "status": ["success"]}), d / "00000.parquet")


def test_webdataset_brace_pattern(tmp_path):
    write_shards(tmp_path / "shards")
    out = tmp_path / "out"
    s = run_import(str(tmp_path / "shards" / "{00000..00001}.tar"), "--out", str(out), "--extra-column", "url")
    assert (s["format"], s["files"], s["rows_read"], s["rows_out"]) == ("webdataset", 2, 6, 3)
    assert s["skipped"] == {"empty caption": 1, "no image": 1, "undecodable image": 1}
    ds = load(out)
    assert ds["id"] == ["000000000", "000000001", "000010000"]
    assert ds["caption"] == ["a photo", "blue", "green"]
    assert ds["url"] == ["http://x/0", "http://x/1", "http://x/2"]
    assert [(r["source"], r["id"]) for r in report(out)] == [
        ("00000.tar", "000000002"), ("00001.tar", "000010001"), ("00001.tar", "000010002")]


def test_webdataset_directory_glob_and_truncated_shard(tmp_path):
    write_shards(tmp_path / "shards")
    data = (tmp_path / "shards" / "00001.tar").read_bytes()
    (tmp_path / "shards" / "00002.tar").write_bytes(data[:1500])  # cut inside the second member
    out = tmp_path / "dir"
    s = run_import(str(tmp_path / "shards"), "--out", str(out))  # a directory: its .tar files (not the .parquet)
    assert s["files"] == 3
    assert s["skipped"].get("unreadable shard") == 1
    ids = load(out)["id"]
    assert ids[:3] == ["000000000", "000000001", "000010000"]
    out2 = tmp_path / "glob"
    s2 = run_import(str(tmp_path / "shards" / "0000[01].tar"), "--out", str(out2))
    assert s2["files"] == 2 and s2["rows_out"] == 3


def test_webdataset_num_proc_gives_the_same_dataset(tmp_path):
    write_shards(tmp_path / "shards")
    for s in range(2, 4):  # four shards so that two workers each get two
        (tmp_path / "shards" / f"{s:05d}.tar").write_bytes((tmp_path / "shards" / f"{s - 2:05d}.tar").read_bytes())
    one = import_data(str(tmp_path / "shards" / "*.tar"), tmp_path / "one", ImportConfig())
    two = import_data(str(tmp_path / "shards" / "*.tar"), tmp_path / "two", ImportConfig(num_proc=2))
    assert one["stats"]["skipped"] == two["stats"]["skipped"] == {
        "duplicate id": 3, "empty caption": 2, "no image": 2, "undecodable image": 2}
    a, b = load(tmp_path / "one"), load(tmp_path / "two")
    assert a["id"] == b["id"] == ["000000000", "000000001", "000010000"]
    assert a.cast_column("image", datasets.Image(decode=False))["image"] == b.cast_column("image", datasets.Image(decode=False))["image"]


def test_img2dataset_parquet_shards(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp_path / "pq"
    d.mkdir()
    pq.write_table(pa.table({
        "key": ["000000000", "000000001", "000000002"],
        "jpg": [jpeg(), None, CORRUPT],
        "txt": ["first", "failed download", "bad bytes"],
        "url": ["u0", "u1", "u2"],
        "status": ["success", "failed_to_download", "success"],
    }), d / "00000.parquet", row_group_size=2)
    pq.write_table(pa.table({"key": ["000010000"], "jpg": [png_rgba()], "txt": ["second"], "url": ["u3"], "status": ["success"]}),
                   d / "00001.parquet")
    out = tmp_path / "out"
    s = run_import(str(d), "--out", str(out))
    assert (s["format"], s["rows_read"], s["rows_out"]) == ("parquet", 4, 2)
    assert s["skipped"] == {"no image": 1, "undecodable image": 1}
    ds = load(out)
    assert ds["id"] == ["000000000", "000010000"] and ds["caption"] == ["first", "second"]
    assert ds[1]["image"].mode == "RGBA"


# ---------------------------------------------------------------------------------------------- folders, COCO


def test_imagefolder(tmp_path):
    root = tmp_path / "pets"
    (root / "golden_retriever").mkdir(parents=True)
    (root / "tabby-cat" / "indoor").mkdir(parents=True)
    (root / "golden_retriever" / "a.jpg").write_bytes(jpeg())
    (root / "golden_retriever" / "b.png").write_bytes(png_rgba())
    (root / "golden_retriever" / "notes.txt").write_text("ignored")
    (root / "tabby-cat" / "indoor" / "c.jpg").write_bytes(jpeg())
    (root / "tabby-cat" / "bad.jpg").write_bytes(CORRUPT)
    out = tmp_path / "out"
    s = run_import(str(root), "--out", str(out), "--caption-template", "a photo of a {label}")
    assert (s["format"], s["rows_out"], s["classes"], s["ignored_files"]) == ("imagefolder", 3, 2, 1)
    assert s["skipped"] == {"undecodable image": 1}
    ds = load(out)
    assert ds.features["label"].names == ["golden retriever", "tabby-cat"]  # words for the prompts (issue 39)
    assert ds["id"] == ["golden_retriever/a", "golden_retriever/b", "tabby-cat/indoor/c"]
    assert ds["caption"] == ["a photo of a golden retriever"] * 2 + ["a photo of a tabby cat"]
    # a classnames.txt beside the class folders does not make it CLIP_benchmark's layout (no shards)
    (root / "classnames.txt").write_text("golden retriever\ntabby cat\n")
    s = run_import(str(root), "--out", str(tmp_path / "again"), "--caption-template", "a photo of a {label}")
    assert (s["format"], s["rows_out"]) == ("imagefolder", 3)
    assert ds["label"] == [0, 0, 1]
    assert report(out)[0]["id"] == "tabby-cat/bad"


def test_imagefolder_class_names_are_words(tmp_path):
    """Zero-shot prompts read the class names: folder names kept their underscores ("a photo of a animal_bird.").
    Underscores become spaces, the folder -> name map is recorded, --classnames FILE overrides, and two folders
    that would share a name are refused in one line (issue 39)."""
    root = tmp_path / "animals"
    for cls in ("animal_bird", "animal_cat"):
        (root / cls).mkdir(parents=True)
        (root / cls / "a.jpg").write_bytes(jpeg())
    s = run_import(str(root), "--out", str(tmp_path / "out"))
    assert load(tmp_path / "out").features["label"].names == ["animal bird", "animal cat"]
    assert s["class_names"] == {"animal_bird": "animal bird", "animal_cat": "animal cat"}
    (tmp_path / "names.txt").write_text("bird\ncat\n")
    s = run_import(str(root), "--out", str(tmp_path / "named"), "--classnames", str(tmp_path / "names.txt"),
                   "--caption-template", "a photo of a {label}")
    ds = load(tmp_path / "named")
    assert ds.features["label"].names == ["bird", "cat"] and ds["label"] == [0, 1]
    assert ds["caption"] == ["a photo of a bird", "a photo of a cat"] and s["class_names"]["animal_cat"] == "cat"
    (tmp_path / "one.txt").write_text("bird\n")
    r = CliRunner().invoke(app, ["import", str(root), "--out", str(tmp_path / "bad"), "--classnames", str(tmp_path / "one.txt")])
    assert r.exit_code == 2 and "1 names for 2 class folders" in r.stderr and not (tmp_path / "bad").exists()
    (root / "animal-cat").mkdir()
    (root / "animal-cat" / "b.jpg").write_bytes(jpeg())
    (root / "animal cat").mkdir()
    (root / "animal cat" / "c.jpg").write_bytes(jpeg())
    r = CliRunner().invoke(app, ["import", str(root), "--out", str(tmp_path / "clash")])
    assert r.exit_code == 2 and "both become the class name 'animal cat'" in r.stderr


def test_coco_captions(tmp_path):
    (tmp_path / "annotations").mkdir()
    write_images(tmp_path / "val2017", 3)
    coco = {
        "images": [
            {"id": 1, "file_name": "img0.jpg", "height": 16},
            {"id": 2, "file_name": "img1.jpg", "height": 16},
            {"id": 3, "file_name": "corrupt.jpg", "height": 16},
            {"id": 4, "file_name": "missing.jpg", "height": 16},
            {"id": 5, "file_name": "img2.jpg", "height": 16},
        ],
        "annotations": [
            {"id": 10, "image_id": 1, "caption": "A man rides a horse."},
            {"id": 11, "image_id": 2, "caption": "Two dogs."},
            {"id": 12, "image_id": 1, "caption": "A rider on a brown horse. "},
            {"id": 13, "image_id": 3, "caption": "bad"},
            {"id": 14, "image_id": 4, "caption": "gone"},
        ],
    }
    ann = tmp_path / "annotations" / "captions_val2017.json"
    ann.write_text(json.dumps(coco))
    out = tmp_path / "coco"
    s = run_import(str(ann), "--out", str(out))  # the image directory is found: ../val2017
    assert (s["format"], s["rows_read"], s["rows_out"], s["annotations"]) == ("coco", 5, 2, 5)
    assert s["skipped"] == {"empty caption": 1, "missing file": 1, "undecodable image": 1}
    assert s["image_root"] == str((tmp_path / "val2017").resolve())
    ds = load(out)
    assert ds.column_names == ["id", "image", "caption", "captions"]
    assert ds["id"] == ["1", "2"]
    assert ds["captions"] == [["A man rides a horse.", "A rider on a brown horse."], ["Two dogs."]]
    assert ds["caption"] == ["A man rides a horse.", "Two dogs."]
    assert {r["id"]: r["reason"] for r in report(out)} == {"3": "undecodable image", "4": "missing file", "5": "empty caption"}


# ---------------------------------------------------------------------------------------------- errors


def test_errors_exit_codes_and_messages(tmp_path):
    write_images(tmp_path, 1)
    (tmp_path / "t.csv").write_text("path_to_img,words\nimg0.jpg,hello\n")
    r = runner.invoke(app, ["import", str(tmp_path / "t.csv"), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2
    assert "found no image column" in r.stderr and "path_to_img, words" in r.stderr and "--image-column" in r.stderr
    r = runner.invoke(app, ["import", str(tmp_path / "nope_*.tar"), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "matches no file" in r.stderr
    r = runner.invoke(app, ["import", str(tmp_path / "img0.jpg"), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "--format" in r.stderr
    (tmp_path / "bad.csv").write_text("filepath,title\ncorrupt.jpg,x\n")
    r = runner.invoke(app, ["import", str(tmp_path / "bad.csv"), "--out", str(tmp_path / "o")])
    assert r.exit_code == 1 and "no row could be imported" in r.stderr and "undecodable image" in r.stderr
    assert not (tmp_path / "o").exists() and not list(tmp_path.glob(".o.*"))  # nothing half-written
    ok = tmp_path / "ok.csv"
    ok.write_text("filepath,title\nimg0.jpg,x\n")
    assert runner.invoke(app, ["import", str(ok), "--out", str(tmp_path / "o")]).exit_code == 0
    r = runner.invoke(app, ["import", str(ok), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "--overwrite" in r.stderr
    assert runner.invoke(app, ["import", str(ok), "--out", str(tmp_path / "o"), "--overwrite"]).exit_code == 0
    r = runner.invoke(app, ["import", str(ok), "--out", str(tmp_path / "o2"), "--max-side", "0"])
    assert r.exit_code == 2
    with pytest.raises(UsageError, match="--caption-template"):
        ImportConfig(caption_template="no placeholder").validate()


def test_expand_braces():
    assert expand_braces("s/{00000..00002}.tar") == ["s/00000.tar", "s/00001.tar", "s/00002.tar"]
    assert expand_braces("{a,b}-{1..2}") == ["a-1", "a-2", "b-1", "b-2"]
    assert expand_braces("plain{x}.tar") == ["plain{x}.tar"]
    assert expand_braces("{8..10}") == ["8", "9", "10"]


@pytest.mark.parametrize("fmt,suffix", [(tarfile.PAX_FORMAT, ".tar"), (tarfile.GNU_FORMAT, ".tar"), (tarfile.USTAR_FORMAT, ".tar.gz")])
def test_iter_tar_matches_tarfile(tmp_path, fmt, suffix):
    long = "d/" + "x" * 120 + "/sample"
    names = ["a.jpg", "a.txt", f"{long}.jpg", "ünï/cödé.txt", "sub/dir/b.json"]
    if fmt == tarfile.USTAR_FORMAT:
        names = [n for n in names if len(n) < 100 and n.isascii()]
    path = tmp_path / f"t{suffix}"
    with tarfile.open(path, "w:gz" if suffix.endswith("gz") else "w", format=fmt) as tar:
        d = tarfile.TarInfo("sub/dir")
        d.type = tarfile.DIRTYPE
        tar.addfile(d)
        for i, n in enumerate(names):
            add_member(tar, n, bytes([i]) * (i * 300 + 1))
    with tarfile.open(path) as tar:
        expected = [(m.name, tar.extractfile(m).read()) for m in tar if m.isfile()]
    assert list(iter_tar(str(path))) == expected and len(expected) == len(names)
    cut = tmp_path / "cut.tar"
    cut.write_bytes(path.read_bytes()[:700]) if not suffix.endswith("gz") else cut.write_bytes(b"x" * 700)
    with pytest.raises((tarfile.ReadError, ValueError)):
        list(iter_tar(str(cut)))
