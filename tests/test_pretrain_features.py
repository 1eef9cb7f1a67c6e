"""vltool.pretrain.features: the frozen towers' features are read back only when computed as this run would
compute them (issue 52: a chaotic JSD run gave other numbers on features computed another way)."""

from __future__ import annotations

import pytest
import torch

from tests.fixtures.eval_data import make_colors


@pytest.fixture(scope="module")
def colors(tmp_path_factory):
    return make_colors(tmp_path_factory.mktemp("colors") / "colors", per_class=24)  # (144 rows: one step at batch 128)


def _run(data, out, **kw):
    from vltool.pretrain import PretrainConfig, pretrain

    cfg = PretrainConfig(**{**dict(arch="vltool-tiny-rn", batch_size=8, steps=2, lr=1e-3, log_every=1, checkpoint_every=100,
                                   augment="none", precision="no", lock_image=True, lock_text=True), **kw})
    return pretrain([data], out, cfg, progress=False)["stats"]["cached_features"]["reused_from_store"]


def test_features_computed_another_way_are_not_read_back(colors, tmp_path, monkeypatch):
    """The key holds the encoding batch (max(64, --batch-size)), the device and, on a CPU, the threads and the
    kernels' instruction set; a run that computes them as the stored ones were reads them back."""
    monkeypatch.setenv("VLTOOL_CACHE", str(tmp_path / "cache"))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert _run(colors, tmp_path / "a") == {"image": False, "text": False}
        assert _run(colors, tmp_path / "b") == {"image": True, "text": True}          # the same computation
        assert _run(colors, tmp_path / "c", batch_size=32) == {"image": True, "text": True}  # (both encode in batches of 64)
        assert _run(colors, tmp_path / "d", batch_size=128) == {"image": False, "text": False}  # batches of 128
        torch.set_num_threads(2)
        assert _run(colors, tmp_path / "e") == {"image": False, "text": False}        # another thread count
        torch.set_num_threads(1)
        monkeypatch.setenv("MKL_CBWR", "AVX2")
        assert _run(colors, tmp_path / "f") == {"image": False, "text": False}        # MKL pinned to AVX2's kernels
    finally:
        torch.set_num_threads(threads)


def test_the_record_names_the_cpu_kernels():
    from vltool.provenance import runtime

    rec = runtime()
    assert rec["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
