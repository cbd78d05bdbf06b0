"""Worker-side pieces without a process group: data, models, precision, timing, watchdog."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForMaskedLM, BertTokenizer

from train_fns.data import IGNORE_INDEX, make_batch_source, num_masked, sample_indices
from train_fns.loop import window_ends
from train_fns.metrics import HANG_EXIT_CODE, WATCHDOG_PREFIX
from train_fns.model_presets import is_known_model
from train_fns.models import (
    MODEL_PRESETS,
    build_model,
    default_task,
    resolve_model_config,
)
from train_fns.plan import (
    DDPOptions,
    InfeasiblePlan,
    TrialPlan,
    steps_per_window,
    window_lengths,
)
from train_fns.precision import Precision
from train_fns.strategies import apply_activation_checkpointing
from train_fns.timing import StepTimer
from train_fns.watchdog import Watchdog
from train_fns.weights import canonical_name
from train_fns.workload import default_blocks

CPU = torch.device("cpu")
REPO_ROOT = Path(__file__).resolve().parents[2]
TINY = {
    "vocab_size": 96,
    "hidden_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 32,
    "max_position_embeddings": 32,
}
TINY_GPT2 = {"vocab_size": 96, "n_embd": 16, "n_layer": 3, "n_head": 2, "n_positions": 32}


def make_plan(world_size: int = 1, accumulation_steps: int = 1, **changes: object) -> TrialPlan:
    plan = TrialPlan(
        model="bert-tiny",
        task="mlm",
        seq_len=20,
        global_batch=8,
        world_size=world_size,
        accumulation_steps=accumulation_steps,
        micro_batch=8 // (world_size * accumulation_steps),
        model_overrides=TINY,
    )
    return dataclasses.replace(plan, **changes)


def global_batch(plan: TrialPlan, step: int) -> dict[str, torch.Tensor]:
    """Step ``step``'s samples as every rank and micro-step of ``plan`` see them, in order."""
    source = make_batch_source(plan, resolve_model_config(plan.model, plan.model_overrides))
    parts = [
        source.batch(rank, step, micro, CPU)
        for rank in range(plan.world_size)
        for micro in range(plan.accumulation_steps)
    ]
    return {key: torch.cat([part[key] for part in parts]) for key in parts[0]}


# --- data ------------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["mlm", "clm"])
def test_a_step_sees_the_same_samples_whatever_the_split(task: str) -> None:
    reference = global_batch(make_plan(task=task), step=3)
    for world_size, accumulation in [(2, 1), (2, 4), (4, 2), (1, 8)]:
        split = global_batch(make_plan(world_size, accumulation, task=task), step=3)
        for key in reference:
            assert torch.equal(split[key], reference[key]), (world_size, accumulation, key)


def test_sample_indices_cover_each_step_once() -> None:
    plan = make_plan(world_size=2, accumulation_steps=2)
    seen = [
        i
        for rank in range(2)
        for micro in range(2)
        for i in sample_indices(plan, rank, step=1, micro_step=micro)
    ]
    assert seen == list(range(8, 16))


def test_mlm_masks_the_same_number_of_tokens_in_every_sample() -> None:
    plan = make_plan()
    batch = global_batch(plan, step=0)
    labelled = batch["labels"] != IGNORE_INDEX
    assert labelled.sum(dim=1).tolist() == [num_masked(plan.seq_len)] * 8 == [3] * 8
    source = make_batch_source(plan, resolve_model_config(plan.model, plan.model_overrides))
    assert (batch["input_ids"][labelled] == source.mask_token_id).all()
    assert int(batch["input_ids"].max()) < TINY["vocab_size"]


def test_clm_labels_are_the_inputs_and_seeds_change_the_data() -> None:
    batch = global_batch(make_plan(task="clm"), step=0)
    assert torch.equal(batch["labels"], batch["input_ids"])
    other = global_batch(make_plan(task="clm", seed=1), step=0)
    assert not torch.equal(other["input_ids"], batch["input_ids"])


@pytest.fixture
def tokenizer_dir(tmp_path: Path) -> Path:
    words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog"]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    directory = tmp_path / "tokenizer"
    BertTokenizer(vocab={w: i for i, w in enumerate(vocab)}).save_pretrained(directory)
    return directory


@pytest.mark.parametrize("suffix", [".txt", ".jsonl"])
def test_file_data_is_tokenized_into_blocks(
    tmp_path: Path, tokenizer_dir: Path, suffix: str
) -> None:
    documents = ["the quick brown fox jumps over a lazy dog"] * 10
    path = tmp_path / f"corpus{suffix}"
    lines = documents if suffix == ".txt" else [json.dumps({"text": d}) for d in documents]
    path.write_text("\n".join(lines) + "\n")
    plan = make_plan(task="clm", data=str(path), tokenizer=str(tokenizer_dir))
    batch = global_batch(plan, step=0)
    assert batch["input_ids"].shape == (8, plan.seq_len)
    assert int(batch["input_ids"][0, 0]) >= 5 and int(batch["input_ids"].max()) < 14
    # 10 documents x (9 words + [SEP]) = 100 tokens = 5 blocks of 20; sample 5 wraps to 0.
    assert torch.equal(batch["input_ids"][5], batch["input_ids"][0])


def test_missing_file_or_tokenizer_names_the_path(tmp_path: Path, tokenizer_dir: Path) -> None:
    config = resolve_model_config("bert-tiny", TINY)
    missing = tmp_path / "nope.txt"
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        make_batch_source(make_plan(data=str(missing), tokenizer=str(tokenizer_dir)), config)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the fox\n")
    with pytest.raises(FileNotFoundError, match="no-tokenizer"):
        make_batch_source(
            make_plan(data=str(corpus), tokenizer=str(tmp_path / "no-tokenizer")), config
        )


# --- models ----------------------------------------------------------------------------


def test_presets_resolve_and_bert_large_has_335m_parameters() -> None:
    assert resolve_model_config("bert-base", {}).hidden_size == 768
    assert resolve_model_config("bert-mini", {}).num_hidden_layers == 4
    assert resolve_model_config("bert-tiny", {"num_hidden_layers": 1}).num_hidden_layers == 1
    assert resolve_model_config("gpt2", {}).model_type == "gpt2"
    with torch.device("meta"):  # counts parameters without allocating 1.3 GB
        model = AutoModelForMaskedLM.from_config(resolve_model_config("bert-large", {}))
    assert 330e6 < sum(p.numel() for p in model.parameters()) < 340e6


def test_tasks_and_unknown_models() -> None:
    assert default_task(resolve_model_config("bert-tiny", {})) == "mlm"
    assert default_task(resolve_model_config("gpt2", {})) == "clm"
    assert default_task(resolve_model_config("llama", {})) == "clm"
    assert all(spec["task"] in ("mlm", "clm") for spec in MODEL_PRESETS.values())
    with pytest.raises(ValueError, match="never downloaded"):
        resolve_model_config("bert-huge", {})


def test_is_known_model(tmp_path: Path) -> None:
    assert is_known_model("bert-large") and is_known_model("roberta")
    assert not is_known_model("bert-huge") and not is_known_model(str(tmp_path))
    resolve_model_config("bert-tiny", TINY).save_pretrained(tmp_path)
    assert is_known_model(str(tmp_path))


def test_transformer_blocks_finds_the_layer_stack() -> None:
    bert = build_model(make_plan())
    assert [type(b).__name__ for b in default_blocks(bert)] == ["BertLayer"] * 2
    gpt2 = build_model(make_plan(model="gpt2", task="clm", model_overrides=TINY_GPT2))
    assert [type(b).__name__ for b in default_blocks(gpt2)] == ["GPT2Block"] * 3


@pytest.mark.parametrize("model", ["bert-tiny", "gpt2"])
def test_activation_checkpointing_keeps_gradients(model: str) -> None:
    """Single process, both model families (the dist tests cover BERT under DDP and FSDP2)."""
    no_dropout = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    if model == "gpt2":
        overrides = {**TINY_GPT2, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
        plan = make_plan(model=model, task="clm", model_overrides=overrides)
    else:
        plan = make_plan(model_overrides={**TINY, **no_dropout})
    grads = []
    for checkpointing in (False, True):
        net = build_model(plan)
        if checkpointing:
            apply_activation_checkpointing(net, default_blocks(net))
            assert {type(b).__name__ for b in default_blocks(net)} == {"CheckpointWrapper"}
        batch = make_batch_source(plan, net.config).batch(0, 0, 0, CPU)
        net(**batch).loss.backward()
        grads.append({canonical_name(n): p.grad for n, p in net.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, msg=name)


def test_build_is_seeded_and_local_weights_load(tmp_path: Path) -> None:
    first, again = build_model(make_plan()), build_model(make_plan())
    other_seed = build_model(make_plan(seed=7))
    weights = first.state_dict()
    assert all(torch.equal(t, again.state_dict()[k]) for k, t in weights.items())
    assert not all(torch.equal(t, other_seed.state_dict()[k]) for k, t in weights.items())
    other_seed.save_pretrained(tmp_path)
    loaded = build_model(make_plan(model=str(tmp_path), model_overrides={}))
    assert loaded.training and first.training
    assert all(torch.equal(t, loaded.state_dict()[k]) for k, t in other_seed.state_dict().items())


def test_seq_len_beyond_positions_is_infeasible() -> None:
    with pytest.raises(InfeasiblePlan, match="max_position_embeddings=32"):
        build_model(make_plan(seq_len=40))


# --- plan, precision, timing, watchdog --------------------------------------------------


def test_static_graph_with_accumulation_is_infeasible() -> None:
    with pytest.raises(InfeasiblePlan, match="static_graph"):
        make_plan(world_size=2, accumulation_steps=2, ddp=DDPOptions(static_graph=True))


def test_windows_split_measured_steps() -> None:
    assert window_ends(make_plan(warmup_steps=3, measure_steps=12, num_windows=3)) == [7, 11, 15]
    assert window_ends(make_plan(warmup_steps=0, measure_steps=5, num_windows=2)) == [3, 5]


def test_the_driver_plans_with_the_shortest_window() -> None:
    """The race, the 1-worker baseline and a smaller size's search read a window's steps from
    the split the workers run, so an uneven split cannot make them disagree."""
    assert window_lengths(5, 2) == [3, 2] and window_lengths(12, 3) == [4, 4, 4]
    assert [steps_per_window(*a) for a in ((12, 3), (5, 2), (7, 3), (2, 3))] == [4, 2, 2, 1]


def test_precision_autocast_and_nonfinite_count() -> None:
    bf16 = Precision(make_plan(precision="bf16"), CPU)
    with bf16.autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    param = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([param], lr=0.1)
    for loss in (torch.tensor(1.0), torch.tensor(float("nan")), torch.tensor(float("inf"))):
        param.grad = torch.ones(2)
        bf16.step(optimizer, loss)
    assert bf16.num_nonfinite() == 2
    bf16.reset_num_nonfinite()
    assert bf16.num_nonfinite() == 0


class _Clock:
    """A logical clock that moves only when told: exact bounds on any machine."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_step_timer_reports_medians() -> None:
    clock = _Clock()
    timer = StepTimer(CPU, clock=clock)
    for work_s in (0.001, 0.02, 0.002):
        timer.start_step()
        with timer.phase("fwd_bwd"):
            clock.t += work_s
        clock.t += 0.0005  # outside every phase: in the total only
        timer.end_step()
    window = timer.take_window()
    assert window["num_steps"] == 3 and window["fwd_bwd"] == pytest.approx(0.002)
    assert window["total"] == pytest.approx(0.0025) and window["data"] == 0.0


def test_watchdog_ends_a_worker_that_finishes_no_step() -> None:
    code = "from train_fns.watchdog import Watchdog; import time; Watchdog(3, 0.3).start(); "
    code += "time.sleep(30)"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, cwd=REPO_ROOT
    )
    assert done.returncode == HANG_EXIT_CODE
    assert done.stderr.strip() == (
        f"{WATCHDOG_PREFIX} rank 3 finished no step in 0.3s; ending this worker (hang)"
    )


def test_watchdog_beats_and_stop_keep_it_quiet() -> None:
    clock, exits = _Clock(), []
    watchdog = Watchdog(0, 0.2, exit_fn=exits.append, clock=clock)
    for _ in range(6):  # a beat every 50 ms holds it off, 300 ms in all
        clock.t += 0.05
        watchdog.beat()
        assert not watchdog.check()
    clock.t += 0.19
    assert not watchdog.check() and exits == []
    clock.t += 0.02  # 210 ms since the last beat
    assert watchdog.check() and exits == [HANG_EXIT_CODE]
    stopped, quiet = Watchdog(1, 0.2, exit_fn=exits.append, clock=clock).start(), len(exits)
    stopped.stop()
    clock.t += 10.0  # however late it gets, a stopped watchdog no longer looks
    assert not stopped._thread.is_alive() and len(exits) == quiet


def test_importing_train_fns_stays_light() -> None:
    code = (
        "import sys, train_fns; print(sorted({'torch', 'transformers', 'ray'} & set(sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT
    )
    assert done.stdout.strip() == "[]"
