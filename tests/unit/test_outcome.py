"""Trial outcomes from worker reports and failures: pure logic, no Ray."""

from __future__ import annotations

import dataclasses

import pytest

from orchestrator.search.outcome import _COMMTUNE_ROOT, classify_failure, comm_split, summarize
from train_fns import metrics as m
from train_fns.plan import TrialPlan

PLAN = TrialPlan(
    model="bert-tiny",
    task="mlm",
    seq_len=64,
    global_batch=16,
    world_size=2,
    accumulation_steps=2,
    micro_batch=4,
    num_windows=3,
    measure_steps=6,
)


def _report(rank: int, step: float, mem: int = 100) -> dict:
    return {
        m.RANK: rank,
        m.STEP_TIME_S: step,
        m.MEAN_STEP_TIME_S: step + 0.05,  # a slow step in each window lifts the mean
        m.DATA_S: 0.01,
        m.FWD_BWD_S: step * 0.8,
        m.OPTIM_S: step * 0.1,
        m.LOSS: 5.0,
        m.PEAK_MEM_BYTES: mem,
        m.ENV_SEEN: {"NCCL_ALGO": None},
        m.SETUP_S: {"model_build_s": 1.0},
    }


def test_summary_uses_slowest_rank_and_median_window() -> None:
    windows = [
        [_report(0, 0.10), _report(1, 0.20)],  # slowest rank: 0.20 s -> 80/s
        [_report(0, 0.25), _report(1, 0.10)],  # 0.25 s -> 64/s
        [_report(0, 0.16), _report(1, 0.16, mem=900)],
    ]  # 0.16 s -> 100/s
    s = summarize(windows, PLAN)
    assert s[m.SAMPLES_PER_S] == pytest.approx(80.0)
    assert s[m.TOKENS_PER_S] == pytest.approx(80.0 * 64)
    tps = [80.0, 64.0, 100.0]
    mean = sum(tps) / 3
    cv = (sum((t - mean) ** 2 for t in tps) / 3) ** 0.5 / mean
    assert s[m.THROUGHPUT_CV] == pytest.approx(cv)
    assert s[m.PEAK_MEM_BYTES] == 900
    assert s[m.STEP_TIME_S] == pytest.approx(0.20)
    assert set(s[m.ENV_SEEN]) == {"0", "1"}
    # the mean steps the same way: slowest rank's 0.25, 0.30, 0.21 s; the median window 0.25 s
    assert s[m.MEAN_SAMPLES_PER_S] == pytest.approx(16 / 0.25)


def test_summary_splits_exposed_comm_and_reads_gpu_util() -> None:
    def report(rank: int, sync: float, nosync: float, util: float | None) -> dict:
        return {**_report(rank, 0.2), m.SYNC_MICRO_S: sync, m.NOSYNC_MICRO_S: nosync,
                m.GPU_UTIL: util}  # fmt: skip

    windows = [[report(0, 0.09, 0.07, 0.5), report(1, 0.10, 0.07, 0.7)]] * 3
    s = summarize(windows, PLAN)
    # the slowest rank's sync micro-step exceeds its no-sync twin by 30 ms: exposed comm
    assert s[m.EXPOSED_COMM_S] == pytest.approx(0.03)
    assert s[m.COMPUTE_S] == pytest.approx(0.16 - 0.03)  # fwd_bwd (0.8 x 0.2) minus it
    assert s[m.COMM_FRACTION] == pytest.approx(0.03 / 0.16)
    assert s[m.GPU_UTIL] == pytest.approx(0.6)
    cpu = [[{**w, m.GPU_UTIL: None} for w in ranks] for ranks in windows]
    assert summarize(cpu, PLAN)[m.GPU_UTIL] is None


def test_summary_needs_a_window() -> None:
    with pytest.raises(ValueError):
        summarize([], PLAN)


class FakeWorkerGroupError(Exception):
    def __init__(self, failures: dict) -> None:
        super().__init__("Training failed due to worker errors")
        self.worker_failures = failures


@pytest.mark.parametrize(
    ("failure", "state", "words"),
    [
        (
            RuntimeError("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB"),
            m.OOM,
            "micro_batch=4",
        ),
        (
            RuntimeError("commtune watchdog: rank 1 finished no step in 60s"),
            m.HANG,
            "step_deadline_s",
        ),
        (RuntimeError("[Gloo] Timed out waiting 90000ms for recv operation"), m.HANG, "ended"),
        (
            RuntimeError("ActorDiedError: The actor died unexpectedly before finishing this task."),
            m.CRASH,
            "died",
        ),
        (ValueError("shape mismatch in attention"), m.ERROR, "shape mismatch"),
    ],
)
def test_failures_are_classified_with_reasons(failure: Exception, state: str, words: str) -> None:
    exc = FakeWorkerGroupError({1: failure})
    got_state, reason = classify_failure(exc, PLAN, peak_mem_bytes=3 * 1024**3)
    assert got_state == state
    assert words in reason
    if state == m.OOM:
        assert "3.00 GiB" in reason


def test_oom_wins_over_the_collective_errors_it_causes() -> None:
    exc = FakeWorkerGroupError(
        {
            0: RuntimeError("Timed out waiting for recv"),
            1: RuntimeError("OutOfMemoryError: injected"),
        }
    )
    assert classify_failure(exc, PLAN)[0] == m.OOM


def test_trial_line_shows_exposed_comm_and_its_bound() -> None:
    from orchestrator.search.progress import comm_text

    result = {"exposed_comm_s": 0.012, "comm_fraction": 0.25, "comm_bound_s": 0.008}
    assert comm_text(result) == ", comm 12 ms exposed = 25%, bound 8 ms at the probed bandwidth"
    assert comm_text({}) == ""


def test_comm_split_takes_the_slowest_ranks_exposed_comm_and_the_median_window() -> None:
    """Exposed comm is a rank's syncing micro-step minus its no-sync twin (never below 0), the
    window's the largest over ranks; compute is the slowest fwd+bwd less it; medians over
    windows. Figures chosen so that min for max, or mean for median, gives other numbers."""
    def w(sync: float, nosync: float, fwd_bwd: float) -> dict[str, float]:
        return {m.SYNC_MICRO_S: sync, m.NOSYNC_MICRO_S: nosync, m.FWD_BWD_S: fwd_bwd}

    windows = [
        [w(0.30, 0.20, 0.50), w(0.25, 0.24, 0.60)],  # exposed 0.10, compute 0.50
        [w(0.22, 0.20, 0.40), w(0.20, 0.21, 0.45)],  # exposed 0.02 (-0.01 is 0), compute 0.43
        [w(0.90, 0.20, 1.50), w(0.30, 0.25, 0.50)],  # exposed 0.70, compute 0.80
    ]
    split = comm_split(windows)
    assert split[m.EXPOSED_COMM_S] == pytest.approx(0.10)
    assert split[m.COMPUTE_S] == pytest.approx(0.50)
    assert split[m.COMM_FRACTION] == pytest.approx(0.10 / 0.60)
    assert comm_split([[{m.SYNC_MICRO_S: 0.1, m.FWD_BWD_S: 0.2}]]) == {}, "no twin: no split"


def _worker_traceback(frames: list[str], raised: str) -> RuntimeError:
    """A worker's failure as Ray hands it over: the traceback's text in the message."""
    lines = ["Traceback (most recent call last):"]
    for path in frames:
        lines += [f'  File "{path}", line 12, in step', "    x = f()"]
    return RuntimeError("\n".join([*lines, raised]))


SITE = "/venv/lib/python3.11/site-packages"
ROOT = _COMMTUNE_ROOT
REDUCER = (
    "RuntimeError: Expected to have finished reduction in the prior iteration before starting "
    "a new one. This error indicates that your module has parameters that were not used in "
    "producing loss."
)


def test_a_failure_is_attributed_to_whose_code_raised_it() -> None:
    """The user's frames on the stack: their code; only torch.distributed and commtune below
    the failing call: torch.distributed's (with the fix for DDP's unused-parameter error);
    commtune's own frames innermost: a commtune bug."""
    cases = {
        "the training code raised ValueError: bad shape (at /home/me/moe.py:12": [
            f"{SITE}/ray/train/_internal/utils.py", f"{ROOT}/train_fns/loop.py",
            "/home/me/moe.py", f"{SITE}/torch/nn/functional.py"],
        "torch.distributed (DDP, FSDP or a collective": [
            f"{SITE}/ray/train/_internal/utils.py", f"{ROOT}/train_fns/loop.py",
            f"{SITE}/torch/nn/parallel/distributed.py"],
        "commtune's worker code (a commtune bug": [
            f"{SITE}/ray/train/_internal/utils.py", f"{ROOT}/train_fns/loop.py"],
        "the model's library code raised": [
            f"{ROOT}/train_fns/loop.py", f"{SITE}/transformers/models/bert/modeling.py"],
    }  # fmt: skip
    for words, frames in cases.items():
        raised = REDUCER if "torch.distributed" in words else "ValueError: bad shape"
        exc = FakeWorkerGroupError({0: _worker_traceback(frames, raised)})
        state, reason = classify_failure(exc, PLAN)
        assert state == m.CRASH and words in reason, reason
        assert ("set workload.unused_parameters: true" in reason) == (raised == REDUCER), reason


def test_a_reducer_error_raised_in_autograd_is_torch_distributeds() -> None:
    """DDP's reducer raises from its C++ hooks: the innermost Python frame is autograd's
    engine, and only the message names the reducer (seen in an end-to-end MoE search)."""
    frames = [f"{ROOT}/train_fns/loop.py", f"{SITE}/torch/_tensor.py",
              f"{SITE}/torch/autograd/graph.py"]  # fmt: skip
    raised = ("RuntimeError: Encountered gradient which is undefined, but still allreduced by "
              "DDP reducer. This indicates a bug in DDP implementation")  # fmt: skip
    exc = FakeWorkerGroupError({0: _worker_traceback(frames, raised)})
    assert "torch.distributed (DDP, FSDP" in classify_failure(exc, PLAN)[1]


def test_a_folder_named_like_commtunes_is_the_users_and_an_installed_package_too() -> None:
    """Frames are commtune's by where commtune is, not by a folder's name; a package-form
    entrypoint's frames are the user's even in site-packages."""
    frames = [f"{ROOT}/train_fns/loop.py", "/home/a/orchestrator/wl.py"]
    exc = FakeWorkerGroupError({0: _worker_traceback(frames, "ValueError: x")})
    assert "the training code raised" in classify_failure(exc, PLAN)[1]
    frames = [f"{ROOT}/train_fns/loop.py", f"{SITE}/mypkg/model.py", f"{SITE}/torch/nn/f.py"]
    exc = FakeWorkerGroupError({0: _worker_traceback(frames, "ValueError: x")})
    packaged = dataclasses.replace(PLAN, entrypoint="mypkg.work:make_workload")
    reason = classify_failure(exc, packaged)[1]
    assert "the training code raised" in reason and "mypkg/model.py" in reason, reason
