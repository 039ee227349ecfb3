"""Whole-step CUDA graphs (--cuda-graphs) as far as a CPU shows them: the refusals, which runs fall
back to the eager step and why, the weight average's device-scalar fold, and checkpoints of a
capturable AdamW read by a run that is not. The recorded step itself is tested in test_cuda.py."""
import contextlib
import copy
from types import SimpleNamespace

import pytest
import torch

from conftest import TINY_DATA, run_in_process
from training.loop.recipe import WeightAverage
from training.loop.step import RunAdamW, build_adamw
from training.loop.step_graph import graph_fallback

CUDA_DEVICE = torch.device("cuda")  # a device object only: nothing here runs on it


@pytest.mark.parametrize("flags, says", [
    (["--device", "cpu"], "--cuda-graphs records CUDA graphs, which need a GPU; on cpu drop it"),
    (["--compile"], "--cuda-graphs records the eager step; drop --compile/--compile-mode"),
    (["--compile-mode", "reduce-overhead"], "--cuda-graphs records the eager step"),
])
def test_cuda_graphs_are_refused_in_one_line_where_they_cannot_record(tmp_path, flags, says):
    code, _, err = run_in_process("main.py", [*TINY_DATA, "--cuda-graphs", *flags, "--save-dir", tmp_path / "run"])
    assert code == 2 and err.count("\n") == 1 and says in err
    assert not (tmp_path / "run").exists()


def strategy(name="single", world_size=1, data_parallel_size=1, device=CUDA_DEVICE, replicated=False):
    return SimpleNamespace(name=name, world_size=world_size, data_parallel_size=data_parallel_size, device=device,
                           replicated=replicated)


NO_SCALER = SimpleNamespace(needs_grad_scaler=False)  # bf16 or fp32
FP16 = SimpleNamespace(needs_grad_scaler=True)


def test_one_process_on_one_gpu_without_a_grad_scaler_records_its_step():
    assert graph_fallback(strategy(), NO_SCALER, 1) is None
    # Each DDP rank of a replicated head steps alone, with no collective inside the step.
    assert graph_fallback(strategy("ddp", world_size=2, data_parallel_size=2, replicated=True), NO_SCALER, 1) is None


def test_runs_whose_step_cannot_be_one_graph_say_why_and_run_eagerly():
    cases = [(strategy(device=torch.device("cpu")), NO_SCALER, 1, "runs eagerly on cpu"),
             (strategy("ddp", world_size=2, data_parallel_size=2), NO_SCALER, 1, "runs eagerly under ddp"),
             (strategy("dp", data_parallel_size=2), NO_SCALER, 1, "runs eagerly under dp"),
             (strategy(), FP16, 1, "use --amp-dtype bf16 to record it"),
             (strategy(), NO_SCALER, 2, "with --grad-accum-steps 2")]
    for run_strategy, precision, accumulation, says in cases:
        line = graph_fallback(run_strategy, precision, accumulation)
        assert line.startswith("--cuda-graphs: the step runs eagerly") and says in line, line


def test_the_weight_average_folds_the_same_with_a_device_scalar_weight():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    by_number, by_tensor = WeightAverage(model, 0.9), WeightAverage(model, 0.9)
    for _ in range(3):
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(torch.randn_like(parameter))
            model[1].running_mean.add_(1.0)
            model[1].num_batches_tracked.add_(1)
        weight = by_number.next_weight()
        assert by_tensor.next_weight() == weight
        by_number.fold(weight)
        by_tensor.fold(torch.tensor(weight))
    for (name, expected), (_, actual) in zip(by_number.module.state_dict().items(),
                                             by_tensor.module.state_dict().items(), strict=True):
        torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-7, msg=name)
    assert by_number.updates == by_tensor.updates == 3
    assert int(by_tensor.module[1].num_batches_tracked) == 3  # counters copied, not averaged


def test_a_capturable_adamws_checkpoint_resumes_in_a_run_that_is_not():
    """A run with --cuda-graphs saves capturable param groups and its LR as a tensor; a run without
    takes the moments and keeps its own kernel and LR, as it does for `fused`."""
    model = torch.nn.Linear(3, 2)
    saved = build_adamw(model, 1e-3, 0.01, torch.device("cpu"))
    model(torch.randn(4, 3)).sum().backward()
    saved.step()
    state = copy.deepcopy(saved.state_dict())
    for group in state["param_groups"]:
        group.update(capturable=True, lr=torch.tensor(5e-3))
    resumed = build_adamw(model, 2e-3, 0.01, torch.device("cpu"))
    assert isinstance(resumed, RunAdamW)
    resumed.load_state_dict(state)
    assert [(group["capturable"], group["lr"]) for group in resumed.param_groups] == [(False, 2e-3)] * 2
    model(torch.randn(4, 3)).sum().backward()
    resumed.step()  # a capturable group would refuse CPU parameters here
    assert all(torch.isfinite(parameter).all() for parameter in model.parameters())


class RefusingRecording:
    """Stands in for torch.cuda's streams and graphs on a CPU, with a recording that fails the way an
    operation a graph cannot hold fails it: after the warm-up passes, inside the recording."""

    class Stream:
        def wait_stream(self, other):
            pass

    class Generator:
        """A failed recording marks the CUDA generator; the clean copy taken before must replace its state."""

        def __init__(self):
            self.states_set = []

        def clone_state(self):
            return "the state before recording"

        def graphsafe_set_state(self, state):
            self.states_set.append(state)

    def __init__(self, monkeypatch):
        stream, self.generator = self.Stream(), self.Generator()
        for name, value in {"Stream": lambda device=None: stream, "current_stream": lambda device=None: stream,
                            "stream": lambda stream: contextlib.nullcontext(), "CUDAGraph": object,
                            "graph": self.recording, "synchronize": lambda device=None: None,
                            "default_generators": [self.generator],
                            "get_rng_state": lambda device=None: torch.get_rng_state(),
                            "set_rng_state": lambda state, device=None: torch.set_rng_state(state)}.items():
            monkeypatch.setattr(torch.cuda, name, value)

    @contextlib.contextmanager
    def recording(self, graph, capture_error_mode=None):
        yield
        raise RuntimeError("operation not permitted when stream is capturing\nmore detail")


def cpu_trainer(save_dir):
    from training.config.settings import RunConfig
    from training.distributed.strategy import make_strategy
    from training.trainer import Trainer
    config = RunConfig().replace(dataset="synthetic", synthetic_windows_per_subject=8, model="cnn1d", device="cpu",
                                 save_dir=str(save_dir), batch_size=24, augment="rotate,scale,jitter,shift",
                                 ema_decay=0.9, dropout=0.1, epochs=1, resume=None, figures=False).validate()
    return Trainer.build(config, make_strategy(config), quiet=True)


def test_a_failed_recording_leaves_the_run_as_it_was_and_trains_eagerly(tmp_path, monkeypatch):
    """The warm-up passes before a recording move the weights, BatchNorm's statistics, AdamW's moments,
    the average and the random streams; a recording that then fails must put all of it back, so the
    run trains exactly as the eager step would have, after one warning line."""
    from training.loop.epochs import train_epoch
    from training.loop.step_graph import WholeStepGraph
    eager = cpu_trainer(tmp_path / "eager")
    train_epoch(eager, 0)
    cuda = RefusingRecording(monkeypatch)
    refused, warnings = cpu_trainer(tmp_path / "refused"), []
    refused.step.graph = WholeStepGraph(refused.step, warnings.append)
    train_epoch(refused, 0)
    assert len(warnings) == 1 and warnings[0].count("\n") == 0
    assert "recording the step failed (RuntimeError: operation not permitted" in warnings[0]
    assert refused.step.graph.failed and refused.state.step == eager.state.step
    assert cuda.generator.states_set == ["the state before recording"]
    for name, tensor in eager.model.state_dict().items():
        assert torch.equal(refused.model.state_dict()[name], tensor), name
    for name, tensor in eager.step.ema.module.state_dict().items():
        assert torch.equal(refused.step.ema.module.state_dict()[name], tensor), name
    for index, moments in eager.step.optimizer.state_dict()["state"].items():
        for key, tensor in moments.items():
            assert torch.equal(refused.step.optimizer.state_dict()["state"][index][key], tensor), (index, key)
    assert torch.equal(torch.get_rng_state(), eager_rng_after(tmp_path))


def eager_rng_after(tmp_path):
    """The CPU random stream after an eager epoch of the same run, from the same start."""
    from training.loop.epochs import train_epoch
    again = cpu_trainer(tmp_path / "again")
    train_epoch(again, 0)
    return torch.get_rng_state()


def test_by_default_only_models_shown_to_record_record_and_none_warns():
    from models.cnn_lstm import CNNLSTM
    from models.minirocket import MiniRocket
    from training.loop.step_graph import records_step_graph
    warnings = []

    def decide(wanted, model, run_strategy=None, precision=NO_SCALER, accumulation=1, compiled=False):
        return records_step_graph(wanted, model, run_strategy or strategy(), precision, accumulation, compiled,
                                  warnings.append)
    assert decide(None, MiniRocket) and decide(True, MiniRocket) and decide(True, CNNLSTM)
    assert not decide(None, CNNLSTM) and not decide(False, MiniRocket)
    assert not decide(None, MiniRocket, strategy("ddp", world_size=2, data_parallel_size=2))
    assert not decide(None, MiniRocket, compiled=True)
    assert not decide(None, MiniRocket, precision=FP16) and warnings == []  # the default falls back quietly
    assert not decide(True, MiniRocket, precision=FP16) and len(warnings) == 1
