"""`vltool recaption`: tiny random BLIP, BLIP-2 and GPT-2 models built from configs (bench/tiny_models.py),
saved to a temporary directory and loaded through the ordinary from_pretrained path."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vltool.errors import UsageError
from vltool.recaption import (
    DEFAULT_EXAMPLES,
    RecaptionConfig,
    inspect_model,
    load_examples,
    load_generator,
    newline_token_ids,
    paraphrase_prompt,
    recaption,
    work_dir_for,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models: one thread is faster, and the machine is shared."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from bench.tiny_models import make_bert, make_blip, make_blip2, make_gpt2

    root = tmp_path_factory.mktemp("models")
    return {
        "blip": make_blip(root / "blip"),
        "blip2": make_blip2(root / "blip2"),
        "gpt2": make_gpt2(root / "gpt2"),
        "bert": make_bert(root / "bert"),
    }


def make_images_dataset(path: Path, n: int = 7, none_at: int | None = 3) -> str:
    import datasets
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    images = []
    for i in range(n):
        arr = rng.integers(0, 256, size=(24, 24, 4 if i % 2 else 3), dtype=np.uint8)
        images.append(None if i == none_at else Image.fromarray(arr, "RGBA" if i % 2 else "RGB"))
    ds = datasets.Dataset.from_dict(
        {
            "id": [f"r{i}" for i in range(n)],
            "image": images,
            "caption": [f"a photo of thing {i}" for i in range(n)],
            "captions": [[f"a photo of thing {i}", f"thing {i}"] for i in range(n)],
            "split": ["train" if i % 3 else "test" for i in range(n)],
        },
        features=datasets.Features(
            {
                "id": datasets.Value("string"),
                "image": datasets.Image(),
                "caption": datasets.Value("string"),
                "captions": datasets.List(datasets.Value("string")),
                "split": datasets.Value("string"),
            }
        ),
    )
    ds.save_to_disk(str(path))
    return str(path)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return make_images_dataset(tmp_path_factory.mktemp("data") / "images")


def load(path):
    import datasets

    return datasets.load_from_disk(str(path))


def run(data, out, quiet=True, **kw):
    opts = {k: kw.pop(k) for k in ("where", "split", "overwrite", "process_index", "num_processes") if k in kw}
    return recaption(data, out, RecaptionConfig(**kw), log=(lambda m: None) if quiet else None, **opts)


# ------------------------------------------------------------------------------------------------ prompt


def test_paraphrase_prompt_is_the_papers_format():
    expected = (
        "Paraphrase the sentence below\n"
        "Input: A little boy standing next to a dog in a field.\n"
        "Output: A dog parked filled with people and a bunch of different dogs.\n"
        "Paraphrase the sentence below\n"
        "Input: Some people are on the sandy beach flying kites.\n"
        "Output: a sunny day at the beach with colorful kites in the sky\n"
        "Paraphrase the sentence below\n"
        "Input: A living room filled with furniture and a table.\n"
        "Output: A living room with a nice couch and a coffee table.\n"
        "Paraphrase the sentence below\n"
        "Input: A couple of people on a surfboard in the ocean.\n"
        "Output: A dog is lying on the surfboard as it surfs on a wave.\n"
        "Paraphrase the sentence below\n"
        "Input: a handful of snowmen make this with a glove .\n"
        "Output:"
    )
    # the caption's own line break (the paper's example has one) becomes a space: the prompt is line-based
    assert paraphrase_prompt("a handful of snowmen\nmake this with a glove .") == expected
    assert paraphrase_prompt("x", [("in 1", "out 1")]) == (
        "Paraphrase the sentence below\nInput: in 1\nOutput: out 1\nParaphrase the sentence below\nInput: x\nOutput:"
    )


def test_examples_file_formats(tmp_path):
    assert load_examples(None) == DEFAULT_EXAMPLES
    (tmp_path / "pairs.json").write_text(json.dumps([["a b", "c d"], {"input": "e", "output": "f"}]))
    assert load_examples(tmp_path / "pairs.json") == (("a b", "c d"), ("e", "f"))
    (tmp_path / "pairs.jsonl").write_text('{"input": "a", "output": "b"}\n["c", "d"]\n')
    assert load_examples(tmp_path / "pairs.jsonl") == (("a", "b"), ("c", "d"))
    for bad in ("[]", '[["only one"]]', '[{"input": "a"}]', "{not json", '[["a", ""]]'):
        (tmp_path / "bad.json").write_text(bad)
        with pytest.raises(UsageError):
            load_examples(tmp_path / "bad.json")


def test_generator_tokenizes_exactly_the_prompt(models):
    config = RecaptionConfig(paraphrase=True, lm=models["gpt2"])
    gen = load_generator(inspect_model(models["gpt2"], True), config, "cpu")
    captions = ["Young friends eating pizza in the park", "a dog"]
    enc = gen.prepare(captions)
    decoded = gen.tokenizer.batch_decode(enc["input_ids"], skip_special_tokens=True)
    assert decoded == [paraphrase_prompt(c) for c in captions]
    assert enc["attention_mask"][1, 0] == 0  # left padding: every prompt ends where generation starts
    nl = gen.tokenizer("\n", add_special_tokens=False)["input_ids"]
    assert len(nl) == 1 and nl[0] in gen.stop_ids and nl[0] in newline_token_ids(gen.tokenizer)


# ------------------------------------------------------------------------------------------------ captioner


def test_blip_k_captions_after_existing(images, models, tmp_path):
    out = tmp_path / "out"
    prov = run(images, out, model=models["blip"], num_captions=3, batch_size=2, shard_size=3)
    assert prov["finished"] and not work_dir_for(out).exists()
    ds, src = load(out), load(images)
    assert ds.column_names == ["id", "image", "caption", "captions", "split", "caption_source"]
    for row, old in zip(ds, src):
        label = "recaption:nucleus:blip"
        if row["id"] == "r3":  # no image: nothing generated, the row is kept as it was
            assert row["captions"] == old["captions"]
            assert row["caption_source"]["captions"] == ["original", "original"]
            continue
        assert row["captions"][:2] == old["captions"]
        new = row["captions"][2:]
        assert len(new) == 3 and all(isinstance(t, str) and t for t in new)
        assert row["caption"] == old["caption"]
        assert row["caption_source"] == {"caption": "original", "captions": ["original"] * 2 + [label] * 3}
    meta = json.loads((out / "vltool.json").read_text())
    g = meta["stats"]["generation"]
    assert (g["strategy"], g["top_p"], g["repetition_penalty"], g["min_new_tokens"], g["max_new_tokens"]) == (
        "nucleus", 0.9, 1.1, 5, 40
    )
    assert meta["command"] == "recaption" and meta["rows_in"] == meta["rows_out"] == 7
    assert meta["stats"]["rows_without_input"] == 1 and meta["stats"]["captions_generated"] == 18
    assert meta["inputs"][1]["kind"] == "captioner"  # the model is an input of the provenance chain


def new_captions(path) -> dict:
    ds = load(path)
    ds = ds.remove_columns([c for c in ("image",) if c in ds.column_names])
    return {r["id"]: [c for c, s in zip(r["captions"], r["caption_source"]["captions"]) if s != "original"] for r in ds}


def test_seeded_captions_do_not_depend_on_batching(images, models, tmp_path):
    a = run(images, tmp_path / "a", model=models["blip"], num_captions=2, batch_size=1, shard_size=2)
    b = run(images, tmp_path / "b", model=models["blip"], num_captions=2, batch_size=4, shard_size=5)
    c = run(images, tmp_path / "c", model=models["blip"], num_captions=2, batch_size=4, seed=1)
    assert a["finished"] and b["finished"] and c["finished"]
    ca, cb, cc = new_captions(tmp_path / "a"), new_captions(tmp_path / "b"), new_captions(tmp_path / "c")
    assert ca == cb
    assert ca != cc
    assert all(len(set(v)) == 2 for k, v in ca.items() if k != "r3")  # a different seed per caption


def test_where_selects_rows(images, models, tmp_path):
    run(images, tmp_path / "o", model=models["blip"], num_captions=1, where=["split=test"])
    ds = load(tmp_path / "o")
    assert ds["id"] == ["r0", "r3", "r6"]
    # a row's captions are the same whichever rows are selected with it
    run(images, tmp_path / "all", model=models["blip"], num_captions=1)
    assert {k: v for k, v in new_captions(tmp_path / "all").items() if k in ("r0", "r6")} == {
        k: v for k, v in new_captions(tmp_path / "o").items() if k in ("r0", "r6")
    }


def test_beam_search_and_set_caption_replace(images, models, tmp_path):
    out = tmp_path / "beam"
    run(images, out, model=models["blip"], num_captions=2, strategy="beam", set_caption=True, replace=True)
    ds = load(out).remove_columns(["image"])
    for row in ds:
        if row["id"] == "r3":
            assert row["captions"] == [] and row["caption"] == "a photo of thing 3"
            assert row["caption_source"]["caption"] == "original"
            continue
        assert len(row["captions"]) == 2 and row["caption"] == row["captions"][0]
        assert row["caption_source"] == {"caption": "recaption:beam:blip", "captions": ["recaption:beam:blip"] * 2}
    meta = json.loads((out / "vltool.json").read_text())
    assert meta["stats"]["generation"]["num_beams"] == 2 and meta["stats"]["generation"]["top_p"] is None
    run(images, tmp_path / "beam2", model=models["blip"], num_captions=2, strategy="beam", batch_size=3)
    assert new_captions(tmp_path / "beam2") == new_captions(out)  # beam search is deterministic


def test_blip2_with_prompt(images, models, tmp_path):
    out = tmp_path / "b2"
    run(images, out, model=models["blip2"], num_captions=2, prompt="a picture of", max_new_tokens=8)
    caps = new_captions(out)
    assert all(len(v) == 2 for k, v in caps.items() if k != "r3")
    assert not any(c.startswith("a picture of") for v in caps.values() for c in v)  # the prompt is stripped
    run(images, tmp_path / "kp", model=models["blip2"], num_captions=2, prompt="a picture of", max_new_tokens=8,
        keep_prompt=True)
    kept = new_captions(tmp_path / "kp")
    assert all(c.startswith("a picture of") for v in kept.values() for c in v)


def test_no_captions_column_uses_caption(models, tmp_path):
    import datasets
    from PIL import Image

    ds = datasets.Dataset.from_dict({"id": ["a", "b"], "image": [Image.new("RGB", (16, 16), c) for c in ("red", "blue")],
                                     "caption": ["red square", None]})
    ds.save_to_disk(str(tmp_path / "d"))
    run(str(tmp_path / "d"), tmp_path / "o", model=models["blip"], num_captions=1)
    out = load(tmp_path / "o").remove_columns(["image"])
    assert out[0]["captions"][0] == "red square" and len(out[0]["captions"]) == 2
    assert len(out[1]["captions"]) == 1 and out[1]["caption_source"] == {"caption": None, "captions": ["recaption:nucleus:blip"]}


# ------------------------------------------------------------------------------------------------ resume


def test_resume_after_deterministic_stop(images, models, tmp_path):
    ref = tmp_path / "ref"
    run(images, ref, model=models["blip"], num_captions=2, shard_size=2)
    out = tmp_path / "out"
    status = run(images, out, model=models["blip"], num_captions=2, shard_size=2, max_shards=1)
    assert not status["finished"] and status["shards_run"] == 1 and not out.exists()
    shards = sorted((work_dir_for(out) / "shards").glob("*.json"))
    assert [s.name for s in shards] == ["000000.json"]
    first = shards[0].read_text()
    status = run(images, out, model=models["blip"], num_captions=2, shard_size=2, max_shards=2)
    assert not status["finished"] and status["shards_done_before"] == 1 and status["shards_run"] == 2
    # a different job is refused, not mixed in
    with pytest.raises(UsageError, match="different job"):
        run(images, out, model=models["blip"], num_captions=2, shard_size=2, seed=5)
    assert (work_dir_for(out) / "shards" / "000000.json").read_text() == first  # nothing redone or lost
    prov = run(images, out, model=models["blip"], num_captions=2, shard_size=2, batch_size=3)  # batch size may change
    assert prov["finished"] and prov["stats"]["shards_done_before_this_run"] == 3 and prov["stats"]["shards_run_by_process_0"] == 1
    assert new_captions(out) == new_captions(ref)
    assert not work_dir_for(out).exists()


def test_restart_discards_partial_work(images, models, tmp_path):
    out = tmp_path / "out"
    run(images, out, model=models["blip"], num_captions=1, shard_size=2, max_shards=1)
    prov = run(images, out, model=models["blip"], num_captions=1, shard_size=2, seed=3, restart=True)
    assert prov["finished"] and prov["stats"]["shards_done_before_this_run"] == 0


def test_resume_after_sigkill(models, tmp_path):
    data = make_images_dataset(tmp_path / "data", n=16, none_at=None)
    args = dict(model=models["blip"], num_captions=2, shard_size=1, batch_size=1, min_new_tokens=20, max_new_tokens=20)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "vltool", "recaption", data, "--out", str(out), "--model", str(models["blip"]),
           "--num-captions", "2", "--shard-size", "1", "--batch-size", "1", "--min-new-tokens", "20",
           "--max-new-tokens", "20"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    shards = work_dir_for(out) / "shards"
    deadline = time.monotonic() + 180
    try:
        while len(list(shards.glob("*.json"))) < 2:
            assert proc.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "no shard written in time"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    done = sorted(p.name for p in shards.glob("*.json"))
    assert 2 <= len(done) < 16 and not out.exists()
    before = {name: (shards / name).read_text() for name in done}

    prov = run(data, out, **args)
    assert prov["finished"] and prov["stats"]["shards_done_before_this_run"] == len(done)
    run(data, tmp_path / "ref", **args)
    assert new_captions(out) == new_captions(tmp_path / "ref")
    ours = new_captions(out)
    for name, text in before.items():  # the shards written before the kill are the ones in the output
        rec = json.loads(text)
        assert [ours[i] for i in rec["ids"]] == rec["captions"]


# ------------------------------------------------------------------------------------------------ processes


def test_process_shares_are_merged(images, models, tmp_path):
    kw = dict(model=models["blip"], num_captions=2, shard_size=2)
    run(images, tmp_path / "single", **kw)
    out = tmp_path / "multi"
    s1 = run(images, out, process_index=1, num_processes=2, **kw)
    assert not s1["finished"] and s1["shards_run"] == 2 and not out.exists()  # shards 1 and 3 of 0..3
    assert sorted(p.name for p in (work_dir_for(out) / "shards").glob("*.json")) == ["000001.json", "000003.json"]
    s0 = run(images, out, process_index=0, num_processes=2, **kw)
    assert s0["finished"] and s0["stats"]["shards_run_by_process_0"] == 2
    assert new_captions(out) == new_captions(tmp_path / "single")


@pytest.mark.slow
def test_accelerate_launch_two_processes(images, models, tmp_path):
    run(images, tmp_path / "single", model=models["blip"], num_captions=2, shard_size=2)
    out = tmp_path / "multi"
    # on a CPU-only machine --multi_gpu is what makes accelerate start several processes (through torchrun)
    cmd = ["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "vltool", "recaption", images, "--out", str(out), "--model",
           str(models["blip"]), "--num-captions", "2", "--shard-size", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    meta = json.loads((out / "vltool.json").read_text())
    assert meta["stats"]["num_processes"] == 2
    assert new_captions(out) == new_captions(tmp_path / "single")


# ------------------------------------------------------------------------------------------------ paraphrase


def test_paraphrase_gpt2(models, tmp_path):
    import datasets

    captions = ["Young friends eating pizza in the park", "A dog on a couch.", "", None]
    datasets.Dataset.from_dict({"id": ["a", "b", "c", "d"], "caption": captions}).save_to_disk(str(tmp_path / "d"))
    out = tmp_path / "p"
    prov = run(str(tmp_path / "d"), out, paraphrase=True, lm=models["gpt2"], num_captions=3)
    rows = load(out)
    assert rows[0]["captions"][0] == captions[0] and len(rows[0]["captions"]) <= 4
    assert all("\n" not in c for r in rows for c in r["captions"])
    assert rows[2]["captions"] == [] and rows[3]["captions"] == []  # nothing to paraphrase
    assert set(rows[0]["caption_source"]["captions"][1:]) <= {"paraphrase:nucleus:gpt2"}
    g = prov["stats"]["generation"]
    assert (g["temperature"], g["top_p"], g["min_new_tokens"]) == (0.8, 1.0, 1)
    assert prov["stats"]["rows_without_input"] == 2
    # deterministic under the seed
    run(str(tmp_path / "d"), tmp_path / "p2", paraphrase=True, lm=models["gpt2"], num_captions=3, batch_size=1)
    assert new_captions(out) == new_captions(tmp_path / "p2")


def test_paraphrase_stops_at_the_end_of_the_output_line(models, tmp_path):
    """A GPT-2 whose every next token after the first is a line break: generation must stop there."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tmp_path / "nl"
    shutil.copytree(models["gpt2"], path)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    nl = tok("\n", add_special_tokens=False)["input_ids"][0]
    with torch.no_grad():
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.fill_(1.0)  # every hidden state is all ones
        model.lm_head.weight[nl] = 10.0  # so the line break wins by far
    model.save_pretrained(path)
    config = RecaptionConfig(paraphrase=True, lm=path, num_captions=2, max_new_tokens=20)
    gen = load_generator(inspect_model(path, True), config, "cpu")
    lengths = []
    generate = gen.model.generate

    def spy(**kw):
        out = generate(**kw)
        lengths.append(out.shape[1] - kw["input_ids"].shape[1])
        return out

    gen.model.generate = spy
    texts = gen(["a dog", "two cats on a bed"], ["a", "b"])
    # min_new_tokens=1 holds the line break back for one token, then it ends the line
    assert lengths == [2]
    assert all(len(t) == 2 for t in texts)


# ------------------------------------------------------------------------------------------------ errors


def cli(*args):
    from typer.testing import CliRunner

    from vltool.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


def test_clear_errors(images, models, tmp_path):
    out = tmp_path / "o"
    r = cli("recaption", images, "--out", out, "--model", tmp_path / "nope")
    assert r.exit_code == 2 and "does not exist" in r.stderr and "Traceback" not in r.stderr
    r = cli("recaption", images, "--out", out, "--model", models["bert"])
    assert r.exit_code == 2 and "not an image captioner" in r.stderr
    r = cli("recaption", images, "--out", out, "--model", models["gpt2"])
    assert r.exit_code == 2 and "--paraphrase --lm" in r.stderr
    (tmp_path / "empty").mkdir()  # (not tmp_path itself: --out may not lie inside the model directory, an input)
    r = cli("recaption", images, "--out", out, "--model", tmp_path / "empty")
    assert r.exit_code == 2 and "no config.json" in r.stderr
    r = cli("recaption", images, "--out", tmp_path / "empty" / "o", "--model", tmp_path / "empty")
    assert r.exit_code == 2 and "would overwrite the input" in r.stderr
    r = cli("recaption", images, "--out", out, "--paraphrase", "--lm", models["blip"])
    assert r.exit_code == 2 and "not a causal or seq2seq language model" in r.stderr
    r = cli("recaption", images, "--out", out, "--paraphrase")
    assert r.exit_code == 2 and "--paraphrase needs --lm" in r.stderr
    r = cli("recaption", images, "--out", out)
    assert r.exit_code == 2 and "--model LOCAL_CAPTIONER" in r.stderr
    r = cli("recaption", images, "--out", out, "--model", models["blip"], "--strategy", "greedy", "--top-p", "2")
    assert r.exit_code == 2 and "--strategy" in r.stderr and "--top-p" in r.stderr  # every problem at once
    r = cli("recaption", images, "--out", images, "--model", models["blip"])
    assert r.exit_code == 2 and "inputs are never modified" in r.stderr
    out.mkdir()
    r = cli("recaption", images, "--out", out, "--model", models["blip"])
    assert r.exit_code == 2 and "--overwrite" in r.stderr


def test_cli_runs_and_prints(images, models, tmp_path):
    out = tmp_path / "o"
    r = cli("recaption", images, "--out", out, "--model", models["blip"], "--num-captions", "2", "--json")
    assert r.exit_code == 0, r.stderr
    stats = json.loads(r.stdout)
    assert stats["captions_generated"] == 12 and stats["out"] == str(out)
    r = cli("recaption", images, "--out", tmp_path / "p", "--paraphrase", "--lm", models["gpt2"], "--num-captions", "1",
            "--where", "split=test")
    assert r.exit_code == 0, r.stderr
    assert "paraphrase" in r.stdout and load(tmp_path / "p").num_rows == 3


def test_a_captioner_from_the_hub_cache(images, models, tmp_path, monkeypatch):
    """--model hf:ORG/NAME reads the captioner from huggingface_hub's cache (HF_HUB_OFFLINE=1) and the output
    names the commit it resolved to; an id missing from the cache is one line."""
    from tests.fixtures.hf_models import put_in_hub_cache
    from vltool.errors import UsageError

    commit = "b1" * 20
    put_in_hub_cache(tmp_path / "home", "testorg/tiny-blip", models["blip"], commit)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "out"
    prov = run(images, out, model="hf:testorg/tiny-blip", num_captions=1, batch_size=4, shard_size=8)
    assert prov["finished"]
    meta = json.loads((out / "vltool.json").read_text())
    model = next(i for i in meta["inputs"] if i.get("kind") == "captioner")
    assert model["revision"] == {"repo": "testorg/tiny-blip", "revision": "main", "commit": commit}
    assert "recaption:nucleus:tiny-blip" in load(out)[0]["caption_source"]["captions"]
    with pytest.raises(UsageError, match="testorg/nope cannot be loaded: it is not in the Hugging Face cache"):
        run(images, tmp_path / "out2", model="hf:testorg/nope", num_captions=1)


def test_truncated_weights_are_one_line_and_leave_nothing_that_blocks_the_rerun(images, models, tmp_path, monkeypatch):
    """issue 40: a truncated model.safetensors was "internal error (SafetensorError ...)" and left OUT.partial,
    which refused the rerun after the file was repaired ("unfinished work of a different job"). Errors name a
    Hub id as given, not its snapshot folder."""
    import shutil

    from tests.fixtures.hf_models import put_in_hub_cache

    commit = "b2" * 20
    snap = put_in_hub_cache(tmp_path / "home", "testorg/tiny-blip", models["blip"], commit)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    weights = snap / "model.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[: len(good) // 2])
    out = tmp_path / "out"
    r = cli("recaption", images, "--out", out, "--model", "hf:testorg/tiny-blip", "--num-captions", "1", "--no-progress")
    assert r.exit_code == 1 and "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "--model hf:testorg/tiny-blip: cannot load its weights" in r.stderr
    assert str(snap) not in r.stderr
    assert not out.exists() and not (tmp_path / "out.partial").exists()
    weights.write_bytes(good)  # repaired (a new modification time: another fingerprint)
    r = cli("recaption", images, "--out", out, "--model", "hf:testorg/tiny-blip", "--num-captions", "1", "--no-progress")
    assert r.exit_code == 0, r.stderr
    # a work dir left without any finished shard (a run killed while loading) does not block another job either
    shutil.rmtree(out)
    from vltool.recaption import WorkDir

    WorkDir(tmp_path / "out.partial").open({"command": "recaption", "model": "another"}, restart=False)
    r = cli("recaption", images, "--out", out, "--model", "hf:testorg/tiny-blip", "--num-captions", "1", "--no-progress")
    assert r.exit_code == 0, r.stderr


def test_dtype_auto_on_cuda_is_the_models_own_never_float16_by_default(tmp_path, monkeypatch):
    """--precision auto (issue 51; --dtype before issue 54): float32 on CPU; on CUDA a bf16-saved model in bf16 (float16 overflows it), a
    float16-saved one in float16, a float32-saved one in bf16 where the GPU computes it, else float32."""
    import json

    import torch

    from vltool.recaption import resolve_dtype

    def model(name, dtype, key="torch_dtype", nested=False):
        d = tmp_path / name
        d.mkdir()
        cfg = {"text_config": {key: dtype}} if nested else {key: dtype}
        (d / "config.json").write_text(json.dumps(cfg))
        return d

    bf, fp16, fp32 = model("bf", "bfloat16"), model("h", "float16", key="dtype"), model("f", "float32", nested=True)
    assert resolve_dtype("auto", "cpu", bf) == torch.float32
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert [resolve_dtype("auto", "cuda", m) for m in (bf, fp16, fp32, tmp_path / "none")] == [torch.bfloat16, torch.float16, torch.bfloat16, torch.bfloat16]
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert resolve_dtype("auto", "cuda:0", fp32) == torch.float32 and resolve_dtype("fp16", "cuda", bf) == torch.float16
