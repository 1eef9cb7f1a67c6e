"""The process topology (vltool.topology): processes started by `accelerate launch` leave no process group
for interpreter teardown to destroy (a gloo group left to it can abort the process at exit, and the
launcher then kills the processes still writing: the blocked-mining test failed that way in 1 of 4 runs)."""

from __future__ import annotations

import pytest

from tests.fixtures.launch import launch

SCRIPT = """
import atexit, sys
import torch.distributed as dist

# registered first, so it runs after vltool's exit hook (atexit runs last-in first-out)
atexit.register(lambda: open(f"{sys.argv[1]}.{RANK}", "w").write(str(dist.is_initialized())))
if sys.argv[2] == "state":
    from vltool.topology import process_state

    RANK = process_state().process_index
else:
    from vltool.pretrain.config import PretrainConfig
    from vltool.pretrain.runtime import _accelerator

    RANK = _accelerator(PretrainConfig(arch="vltool-micro")).process_index
assert dist.is_initialized()
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["state", "pretrain"])
def test_the_process_group_is_destroyed_before_exit(tmp_path, how):
    """With 2 processes, the group is up while the command runs and down when exit hooks run, both for
    commands that take vltool's process state and for pretrain's Accelerator."""
    script = tmp_path / "exit.py"
    script.write_text(SCRIPT)
    launch([script, tmp_path / "up", how], 2)
    assert [(tmp_path / f"up.{r}").read_text() for r in (0, 1)] == ["False", "False"]


# ---------------------------------------------------------------------------------------------------
# issue 54: --device and --threads of every command that computes (vltool.topology.compute_scope)
# ---------------------------------------------------------------------------------------------------

def test_compute_scope_sets_the_threads_for_the_command_and_restores_them():
    import torch

    from vltool.topology import compute_scope

    before = torch.get_num_threads()
    with compute_scope("cpu", 1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), compute_scope("auto", 1):
        raise RuntimeError("the command failed")
    assert torch.get_num_threads() == before  # restored after a failure too


def test_a_second_device_in_one_process_is_refused(monkeypatch):
    """accelerate's PartialState is made once per process: a command asking for the GPU after one made it on
    the CPU would silently compute on the CPU, so it is refused (on a machine that has a GPU, pretended)."""
    import torch

    from vltool.topology import compute_scope, process_state

    with compute_scope("cpu"):
        assert process_state().device.type == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ValueError, match="already computes on cpu"), compute_scope("auto"):
        pass
    with compute_scope("cpu"):  # the same device again is fine
        pass


def test_zeroshot_on_one_thread_records_it_and_equals_the_default(cli, tmp_path):
    import json

    import torch

    from tests.fixtures.eval_data import make_colors, make_model

    model, data = make_model(tmp_path / "run"), make_colors(tmp_path / "colors")
    before = torch.get_num_threads()
    records = {}
    for name, extra in (("default", []), ("one", ["--threads", "1", "--device", "cpu"])):
        r = cli("zeroshot", data, "--model", model, "--where", "split=test", "--bootstrap", "20", "--no-progress",
                "--cache-dir", tmp_path / f"cache-{name}", "--out", tmp_path / f"{name}.json", *extra)
        assert r.exit_code == 0, r.output
        records[name] = json.loads((tmp_path / f"{name}.json").read_text())
    assert records["one"]["runtime"]["torch_threads"] == 1 and records["one"]["runtime"]["device"] == "cpu"
    assert records["default"]["runtime"]["torch_threads"] == before == torch.get_num_threads()
    assert records["one"]["metrics"] == records["default"]["metrics"]


def test_device_cuda_without_a_gpu_is_one_line_before_any_work(cli, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    r = cli("zeroshot", tmp_path / "missing", "--model", tmp_path / "missing-model", "--device", "cuda")
    assert r.exit_code == 2
    assert "cuda: this machine has no CUDA GPU that torch can see (use auto or cpu)" in r.stderr
