"""Cost model against hand-worked numbers: BERT-large (335M fp32 params, S = 1.34e9 bytes)."""

from __future__ import annotations

import pytest

from orchestrator.planning.costmodel import (
    DEFAULT_BUCKET_BYTES,
    LINKS,
    NET_100G,
    PCIE_V100,
    Link,
    ModelSize,
    bus_factor,
    bytes_per_rank,
    collective_time,
    comm_bound,
    comm_per_step,
    exposed_comm_s,
    knob_traffic,
    latency_steps,
    predict_step_time,
    rank_candidates,
)
from train_fns.plan import DDPOptions, TrialPlan

BERT = ModelSize.bert_large()
S = 1_340_000_000  # 335e6 params x 4 bytes
# NET_100G: alpha = 20e-6 s, beta = 1 / 12.5e9 = 8e-11 s/byte


def _ddp(n: int, link: Link = NET_100G, **kw: object):
    return comm_per_step("ddp", BERT.num_params, 4, n, 1, True, link, **kw)


def test_bert_large_size() -> None:
    assert BERT.num_params * 4 == S
    assert BERT.num_fsdp_units == 25  # 24 blocks + the root


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (4, 2_010_000_000),  # 2 * 3/4 * S = 1.5 * S = 2.01e9
        (8, 2_345_000_000),  # 2 * 7/8 * S = 1.75 * S = 2.345e9
    ],
)
def test_ring_all_reduce_bytes_per_rank(n: int, expected: int) -> None:
    assert bytes_per_rank("all_reduce", S, n) == pytest.approx(expected, rel=1e-12)
    assert _ddp(n).bytes_per_rank == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("n", "expected_s"),
    [
        (4, 0.16092),  # 2*3 steps * 20e-6 = 1.2e-4, + 2.01e9 * 8e-11 = 0.1608
        (8, 0.18788),  # 2*7 steps * 20e-6 = 2.8e-4, + 2.345e9 * 8e-11 = 0.1876
    ],
)
def test_ring_all_reduce_time_is_the_formula(n: int, expected_s: float) -> None:
    assert collective_time("all_reduce", S, n, NET_100G) == pytest.approx(expected_s, rel=1e-12)


def test_tree_all_reduce_time() -> None:
    # depth ceil(log2 8) = 3: 2*3 * 20e-6 = 1.2e-4, + 2 * S * 8e-11 = 0.2144
    assert latency_steps("all_reduce", 8, "tree") == 6
    assert latency_steps("all_reduce", 5, "tree") == 6  # ceil(log2 5) = 3
    assert collective_time("all_reduce", S, 8, NET_100G, "tree") == pytest.approx(0.21452)
    with pytest.raises(ValueError, match="no tree all_gather"):
        collective_time("all_gather", S, 8, NET_100G, "tree")


def test_all_gather_and_reduce_scatter() -> None:
    for op in ("all_gather", "reduce_scatter"):
        # (n-1)/n * S = 3/4 * 1.34e9 = 1.005e9; 3 * 20e-6 + 1.005e9 * 8e-11 = 0.08046
        assert bytes_per_rank(op, S, 4) == pytest.approx(1.005e9)
        assert collective_time(op, S, 4, NET_100G) == pytest.approx(0.08046)


def test_one_rank_moves_nothing() -> None:
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        assert collective_time(op, S, 1, NET_100G) == 0.0
    assert collective_time("all_reduce", S, 1, NET_100G, "tree") == 0.0


def bus_bandwidth(op: str, size_bytes: float, time_s: float, n: int) -> float:
    """nccl-tests' busbw: algbw (size over time) scaled to what each link carried, so figures
    compare across n; the probe computes it the same way (``sweep.with_busbw``)."""
    return size_bytes / time_s * bus_factor(op, n)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_bus_bandwidth_matches_nccl_tests(n: int) -> None:
    t = 0.2  # algbw S / t = 6.7e9 bytes/s
    assert bus_bandwidth("all_reduce", S, t, n) == S / t * (2 * (n - 1) / n)
    assert bus_bandwidth("all_gather", S, t, n) == S / t * ((n - 1) / n)
    assert bus_bandwidth("reduce_scatter", S, t, n) == S / t * ((n - 1) / n)


def test_bus_bandwidth_hand_worked() -> None:
    # 4 ranks, 0.2 s: algbw 1.34e9 / 0.2 = 6.7e9; busbw 6.7e9 * 1.5 = 1.005e10
    assert bus_bandwidth("all_reduce", S, 0.2, 4) == pytest.approx(1.005e10)
    # 8 ranks: 6.7e9 * 1.75 = 1.1725e10
    assert bus_bandwidth("all_reduce", S, 0.2, 8) == pytest.approx(1.1725e10)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_link_bandwidth_is_bus_bandwidth(n: int) -> None:
    # Without latency, the ring time of a probe-sized message gives back the link's busbw.
    link = Link(12e9, 0.0, "no-latency")
    t = collective_time("all_reduce", S, n, link)
    assert bus_bandwidth("all_reduce", S, t, n) == pytest.approx(12e9, rel=1e-12)


def test_ddp_buckets_pay_latency() -> None:
    # 1.34e9 / 25 MiB (26,214,400) = 51.1 -> 52 buckets; 52 * 6 * 20e-6 = 6.24e-3, + 0.1608
    traffic = _ddp(4)
    assert traffic.num_messages == 52
    assert traffic.comm_s == pytest.approx(0.16704)
    # 10 buckets of 1.34e8 bytes against 1: 9 more messages x 6 steps x 20e-6 = 1.08e-3 s
    ten = _ddp(4, bucket_bytes=134_000_000)
    one = _ddp(4, bucket_bytes=S)
    assert (ten.num_messages, one.num_messages) == (10, 1)
    assert ten.bytes_per_rank == one.bytes_per_rank
    assert ten.comm_s - one.comm_s == pytest.approx(1.08e-3)


def test_accumulation_leaves_ddp_traffic_alone() -> None:
    base = comm_per_step("ddp", BERT.num_params, 4, 4, 1, True, NET_100G)
    for steps in (2, 4, 8):
        accumulated = comm_per_step("ddp", BERT.num_params, 4, 4, steps, True, NET_100G)
        assert accumulated.bytes_per_rank == base.bytes_per_rank
        assert accumulated.comm_s == base.comm_s


@pytest.mark.parametrize("n", [4, 8])
def test_fsdp_traffic_against_ddp(n: int) -> None:
    ddp = _ddp(n).bytes_per_rank  # 2 (n-1)/n S
    resharded = comm_per_step("fsdp", BERT.num_params, 4, n, 1, True, NET_100G)
    kept = comm_per_step("fsdp", BERT.num_params, 4, n, 1, False, NET_100G)
    # 2 all-gathers + 1 reduce-scatter = 3 (n-1)/n S = 1.5x; 1 + 1 = 2 (n-1)/n S = 1x
    assert resharded.bytes_per_rank == pytest.approx(1.5 * ddp, rel=1e-12)
    assert kept.bytes_per_rank == pytest.approx(ddp, rel=1e-12)
    assert [c.op for c in resharded.collectives] == ["all_gather", "reduce_scatter"]
    assert [c.num_calls for c in resharded.collectives] == [2, 1]


def test_fsdp_gathers_repeat_per_micro_step() -> None:
    # 4 micro-steps x 2 gathers + 1 reduce-scatter = 9 x 3/4 S = 6.75 S = 9.045e9 bytes,
    # (2*4 + 1) / 2 = 4.5x DDP's 1.5 S
    traffic = comm_per_step("fsdp", BERT.num_params, 4, 4, 4, True, NET_100G, num_fsdp_units=25)
    assert traffic.bytes_per_rank == pytest.approx(9.045e9)
    assert traffic.bytes_per_rank == pytest.approx(4.5 * _ddp(4).bytes_per_rank)
    assert traffic.num_messages == (8 + 1) * 25  # 8 all-gathers + 1 reduce-scatter, 25 units
    assert "fsdp on 4 ranks" in traffic.summary()


def test_step_time_model() -> None:
    # compute 0.1 s, comm 0.06 s: full overlap hides it, none adds it, half leaves 0.01 exposed
    assert predict_step_time(0.1, 0.06, 1.0) == pytest.approx(0.1)  # max(compute, comm)
    assert predict_step_time(0.1, 0.06, 0.0) == pytest.approx(0.16)  # compute + comm
    assert exposed_comm_s(0.1, 0.06, 0.5) == pytest.approx(0.01)
    assert predict_step_time(0.1, 0.06, 0.5) == pytest.approx(0.11)
    # comm-bound: 0.1 + (0.3 - 0.05) = 0.35 = max(0.1, 0.3) + (1 - 0.5) * 0.1
    assert predict_step_time(0.1, 0.3, 0.5) == pytest.approx(0.35)
    with pytest.raises(ValueError):
        predict_step_time(0.1, 0.06, 1.5)


def test_rank_candidates_puts_the_clearly_better_first() -> None:
    # PCIe, 4 ranks, global batch 32, 5 ms/sample: compute 0.04 s per step against 0.17 s of
    # DDP all-reduce. FSDP with accumulation moves 4.5x the bytes; 1 MiB buckets add
    # 1278 x 6 x 10e-6 = 77 ms of latency.
    best = {"strategy": "ddp", "bucket_cap_mb": 25, "NCCL_ALGO": "Ring"}  # unknown key ignored
    tiny_buckets = {"strategy": "ddp", "bucket_cap_mb": 1}
    fsdp = {"strategy": "fsdp", "accumulation_steps": 4, "reshard_after_forward": True}
    ranked = rank_candidates([fsdp, tiny_buckets, best], BERT, 4, PCIE_V100, 5e-3, global_batch=32)
    assert [c for _, c in ranked] == [best, tiny_buckets, fsdp]
    assert ranked[0][0] > ranked[1][0] > ranked[2][0]
    # DDP: comm 2.01e9 / 12e9 + 52 x 6 x 1e-5 = 0.17062 s; exposed: comm - 2/3 x 0.04
    step_s = 0.04 + 0.17062 - 2 / 3 * 0.04
    assert ranked[0][0] == pytest.approx(32 / step_s)


def test_rank_candidates_defaults_and_ties() -> None:
    # A missing key means torch's default, so these two are the same config and keep their order.
    bare: dict[str, object] = {}
    explicit = {"strategy": "ddp", "accumulation_steps": 1, "bucket_cap_mb": None}
    ranked = rank_candidates([bare, explicit], BERT, 8, LINKS["nvlink_a100"], 1e-3, global_batch=64)
    assert ranked[0][0] == ranked[1][0]
    assert ranked[0][1] is bare
    assert DEFAULT_BUCKET_BYTES == 25 * 2**20


def test_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="strategy"):
        comm_per_step("zero3", BERT.num_params, 4, 4, 1, True, NET_100G)
    with pytest.raises(ValueError, match="world_size"):
        comm_per_step("ddp", BERT.num_params, 4, 0, 1, True, NET_100G)
    with pytest.raises(ValueError, match="bandwidth"):
        Link(0.0, 1e-6)


def test_link_from_probe_rows() -> None:
    from orchestrator.planning.costmodel import link_from_probe

    rows = [
        {"op": "all_gather", "size_bytes": "1024", "world_size": "2", "time_s": "1",
         "busbw_gbps": "9"},
        {"op": "all_reduce", "size_bytes": "67108864", "world_size": "2", "time_s": "0.05",
         "busbw_gbps": "1.25", "backend": "gloo"},
        {"op": "all_reduce", "size_bytes": "1024", "world_size": "2", "time_s": "0.0002",
         "busbw_gbps": "0.005", "backend": "gloo"},
    ]  # fmt: skip
    link = link_from_probe(rows)
    assert link.bandwidth_bytes_per_s == 1.25e9  # the largest all-reduce's bus bandwidth
    assert link.latency_s == pytest.approx(0.0002 / 2)  # ring on 2 ranks: 2 sequential steps
    assert link_from_probe(rows[:1]) is None


def test_knobs_are_priced_in_one_place_with_the_plans_defaults() -> None:
    """A ranking, the dry run and a trial's bound price the same bytes: the plan's bucket size
    when none is sampled, FSDP's gathers in the precision's dtype."""
    knobs = {"strategy": "fsdp", "accumulation_steps": 2}
    plan = TrialPlan("bert-tiny", "mlm", 64, 16, 4, 2, 2, strategy="fsdp", precision="bf16")
    bf16 = knob_traffic(knobs, ModelSize(10**8), 4, NET_100G, precision="bf16")
    assert comm_bound(plan, 10**8, NET_100G)["comm_bound_s"] == bf16.comm_s
    assert bf16.collectives[0].size_bytes == 2 * 10**8  # gathers in bf16, reductions in fp32
    assert bf16.collectives[1].size_bytes == 4 * 10**8
    ddp = knob_traffic({"bucket_cap_mb": None}, BERT, 4, NET_100G)
    assert ddp.num_messages == -(-S // int(DDPOptions().bucket_cap_mb * 2**20)) == 52
