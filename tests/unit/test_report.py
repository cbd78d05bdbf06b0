"""The HTML report on a crafted smoke-like folder: well-formed, every section present, figures
embedded as data URIs, nothing fetched from the network, missing files said in one line."""

from __future__ import annotations

import html
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import optuna
import pytest

from orchestrator import findings, runfiles
from orchestrator.config.study_storage import open_file
from orchestrator.report import SECTIONS
from orchestrator.report import cli as report
from orchestrator.report.page import write_report

CHECKED_TAGS = {"html", "head", "body", "section", "h1", "h2", "table", "tr", "ol", "ul", "li"}
TRIALS = (
    "number,state,accumulation_steps,bucket_cap_mb,strategy,samples_per_s,tokens_per_s,"
    "throughput_cv,step_time_s,data_s,fwd_bwd_s,optim_s,loss,exposed_comm_s,compute_s,"
    "comm_fraction,peak_mem_mib,trial_wall_s,reason\n"
    "0,complete,1,25,ddp,240,15360,0.03,0.066,0.001,0.060,0.003,7.6,0.02,0.04,0.33,600,22,\n"
    "1,complete,2,50,ddp,260,16640,0.02,0.061,0.001,0.055,0.003,7.6,0.01,0.045,0.18,650,21,\n"
    '2,oom,1,25,fsdp,,,,,,,,,,,,,5,"out of memory at micro_batch=8 (peak 1.2 GiB)"\n'
    '3,pruned,4,,fsdp,,,,,,,,,,,,,9,"windows at 62.3 samples/s; stopped early"\n'
    "4,complete,4,100,ddp,250,16000,0.04,0.064,0.001,0.058,0.003,7.6,0.015,0.043,0.26,580,20,\n"
)


class TagBalance(HTMLParser):
    """Counts open/close of the structural tags; a mismatch means a broken page."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.ids: list[str] = []
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if found.get("id"):
            self.ids.append(found["id"])
        self.urls += [v for k, v in attrs if k in ("src", "href") and v]
        if tag in CHECKED_TAGS:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in CHECKED_TAGS:
            if not self.stack or self.stack[-1] != tag:
                self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
            else:
                self.stack.pop()


def parse(text: str) -> TagBalance:
    parser = TagBalance()
    parser.feed(text)
    parser.close()
    assert parser.errors == [] and parser.stack == [], (parser.errors, parser.stack)
    return parser


def write_study(path: Path, name: str, num_trials: int) -> None:
    """A real Optuna study in SQLite, as the search leaves it."""
    study = optuna.create_study(
        study_name=name,
        storage=open_file(path),
        direction="maximize",
        sampler=optuna.samplers.RandomSampler(seed=0),
    )

    def objective(trial: optuna.Trial) -> float:
        acc = trial.suggest_categorical("accumulation_steps", [1, 2, 4])
        bucket = trial.suggest_categorical("bucket_cap_mb", [25, 50, 100])
        return 240.0 + 5 * acc + 0.01 * bucket

    study.optimize(objective, n_trials=num_trials)


def write_search(folder: Path, num_study_trials: int = 6) -> Path:
    """A crafted smoke-like search folder with a training run in train/."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "trials.csv").write_text(TRIALS)
    (folder / "best.yaml").write_text(
        "# commtune best configuration: trial 1, 260.00 samples/s\nname: crafted\n"
        "strategy: ddp\nworkload: {model: bert-tiny, global_batch: 16, seq_len: 64}\n"
        "cluster: {num_workers: 2}\nenv: {}\n"
    )
    write_study(folder / "study.db", "crafted", num_study_trials)
    probe = ["op,size_bytes,world_size,backend,time_s,algbw_gbps,busbw_gbps,iters"]
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        probe += [f"{op},{2**k},2,gloo,0.001,{k / 20},{k / 25},20" for k in range(10, 27)]
    (folder / "probe.csv").write_text("\n".join(probe) + "\n")
    (folder / "run_info.json").write_text(json.dumps({"backend": "gloo", "world_size": 2}))
    train = folder / "train"
    train.mkdir(exist_ok=True)
    norms = ["step,layer,norm"]
    norms += [f"{s},layer{i},{0.5 + i / (s + 1)}" for s in (10, 20, 30) for i in range(4)]
    (train / "grad_norms.csv").write_text("\n".join(norms) + "\n")
    (train / "summary.json").write_text(json.dumps({"steps": 30, "nonfinite_steps": 0}))
    return folder


@pytest.fixture(scope="module")
def full_page(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    folder = write_search(tmp_path_factory.mktemp("search") / "crafted")
    assert report.main([str(folder)]) == 0
    return folder, (folder / "report.html").read_text()


def test_report_is_balanced_html_with_every_section(full_page: tuple[Path, str]) -> None:
    _, text = full_page
    parsed = parse(text)
    for sid, _title in SECTIONS:
        assert sid in parsed.ids
    assert text.count("<section>") == len(SECTIONS)
    assert "crafted" in text and "bert-tiny" in text and "gloo" in text  # the header


def test_report_is_self_contained(full_page: tuple[Path, str]) -> None:
    _, text = full_page
    parsed = parse(text)
    assert parsed.urls and all(u.startswith("data:image/png;base64,") for u in parsed.urls)
    assert not re.search(r"""(src|href)\s*=\s*["']?https?://""", text)
    assert "<script" not in text and "<link" not in text
    # throughput, best vs baseline, importance, step time, bandwidth, memory, gradients
    assert text.count("data:image/png;base64,") >= 7


def test_report_sections_carry_their_numbers(full_page: tuple[Path, str]) -> None:
    _, text = full_page
    assert "1.08x" in text  # 260 / 240 from trials.csv
    assert "out of memory at micro_batch=8" in text  # the failed trial's reason
    assert "Importance cannot" not in text  # six complete study trials, two varying knobs
    assert "exposed comm ms" in text and "compute_s/exposed_comm_s were not" not in text
    assert "Training run: steps 30" in text


def test_missing_files_are_said_in_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "bare"
    folder.mkdir()
    (folder / "trials.csv").write_text(
        TRIALS.replace(",exposed_comm_s,compute_s,comm_fraction", "")
    )
    out = tmp_path / "elsewhere.html"
    assert report.main([str(folder), "--out", str(out)]) == 0
    assert not (folder / "report.html").exists()
    text = out.read_text()
    parse(text)
    for needle in ("study.db is missing", "probe.csv is missing", "grad_norms.csv"):
        assert needle in text


def test_importance_says_why_it_cannot_be_computed(tmp_path: Path) -> None:
    folder = write_search(tmp_path / "one", num_study_trials=1)
    assert report.main([str(folder)]) == 0
    text = (folder / "report.html").read_text()
    assert "Importance cannot be computed: 1 complete trial(s)" in text


def test_importance_reads_a_journal_study(tmp_path: Path) -> None:
    """On a network disk the study is Optuna's journal, not study.db."""
    folder = write_search(tmp_path / "nfs")
    (folder / "study.db").unlink()
    write_study(folder / "study.journal", "crafted", 6)
    assert report.main([str(folder)]) == 0
    text = (folder / "report.html").read_text()
    assert "study.db is missing" not in text and "Over 6 trials of study" in text


def test_remeasure_gives_the_interleaved_verdict(tmp_path: Path) -> None:
    folder = write_search(tmp_path / "re")
    (folder / "remeasure.csv").write_text(
        "position,trial,role,state,samples_per_s,throughput_cv\n"
        "0,0,baseline,complete,240,0.01\n1,1,finalist,complete,290,0.01\n"
        "2,0,baseline,complete,242,0.01\n"
    )
    assert report.main([str(folder), "--train", str(folder / "train")]) == 0
    text = (folder / "report.html").read_text()
    assert "paired runs in separate worker groups" in text and "noise threshold δ 2%" in text
    assert "keep trial 1: 1.20x baseline (interval 1." in text
    assert "from 2 paired runs" in text and "a gain above 1 + δ = 1.02" in text


def test_remeasure_with_a_repeated_disturbed_run(tmp_path: Path) -> None:
    folder = write_search(tmp_path / "re")
    head = "position,repeat,trial,role,state,samples_per_s,throughput_cv,windows,disturbed\n"
    (folder / "remeasure.csv").write_text(
        head + "0,0,0,baseline,complete,22.14,0.132,3,\n1,0,5,finalist,complete,27.08,0.034,3,\n"
        "2,0,0,baseline,complete,23.01,0.154,3,\n3,0,2,finalist,complete,21.97,0.042,3,\n"
        "4,0,0,baseline,complete,12.88,0.307,3,cv\n4,1,0,baseline,complete,22.3,0.1,3,\n"
    )
    assert report.main([str(folder), "--train", str(folder / "train")]) == 0
    text = (folder / "report.html").read_text()
    assert "keep trial 5" in text and "disturbed: baseline at position 4" in text
    assert "some repeated after a disturbed run" in text


def test_remeasure_in_paired_windows_says_pairs_delta_and_interval(tmp_path: Path) -> None:
    folder = write_search(tmp_path / "win")
    head = "position,repeat,trial,role,state,samples_per_s,pairing,pair,against,delta\n"
    rows = ["0,0,0,baseline,complete,100,window,,,0.03",
            "1,0,4,finalist,complete,109,window,,4,0.03"]  # fmt: skip
    for k, (base, mine) in enumerate([(100, 110), (101, 111), (99, 109.5)]):
        rows += [f"{2 + 2 * k},0,0,baseline,complete,{base},window,{k},4,0.03",
                 f"{3 + 2 * k},0,4,finalist,complete,{mine},window,{k},4,0.03"]  # fmt: skip
    (folder / "remeasure.csv").write_text(head + "\n".join(rows) + "\n")
    assert report.main([str(folder)]) == 0
    text = (folder / "report.html").read_text()
    assert "paired windows in the same processes" in text and "noise threshold δ 3%" in text
    assert "keep trial 4: 1.10x baseline (interval 1.0" in text and "from 3 window pairs" in text


def test_findings_are_the_doctors_words(tmp_path: Path) -> None:
    folder = write_search(tmp_path / "slow")
    info = {"backend": "gloo", "world_size": 2, "single_worker_samples_per_s": 200.0}
    (folder / "run_info.json").write_text(json.dumps(info))  # 240 / (2 x 200): 60% scaling
    assert report.main([str(folder)]) == 0
    text = (folder / "report.html").read_text()
    found = findings.diagnose(runfiles.collect([folder]))
    assert [f.title for f in found] == ["scaling efficiency 60% on 2 workers"]
    for part in (found[0].title, found[0].evidence, found[0].fix):
        assert html.escape(part) in text


def test_a_broken_file_costs_its_section_only(tmp_path: Path) -> None:
    folder = write_search(tmp_path / "broken")
    (folder / "study.db").write_text("not a database")
    assert report.main([str(folder)]) == 0
    text = (folder / "report.html").read_text()
    parse(text)
    assert "This section could not be drawn: DatabaseError" in text
    assert text.count("data:image/png;base64,") >= 6  # every other figure is still there


def test_empty_folder_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert report.main([str(tmp_path)]) == 2
    assert str(tmp_path) in capsys.readouterr().err


def test_the_trial_table_shows_each_trials_placement() -> None:
    from orchestrator.report.trials import section_throughput
    from orchestrator.runfiles import RunRecord

    rows = [{"number": "0", "state": "complete", "samples_per_s": "10", "placement": "node0:2"},
            {"number": "1", "state": "complete", "samples_per_s": "12",
             "placement": "node0:1,node1:1"}]  # fmt: skip
    html = section_throughput(RunRecord(trials=rows))
    assert "placement (ranks per node)" in html and "node0:1,node1:1" in html


def test_a_hand_edited_best_yaml_costs_its_bad_keys_only(tmp_path: Path) -> None:
    """``name: [1]``, ``workload: bert``, ``cluster: 5``: read as absent (the page is named
    after its folder), never an AttributeError that loses the whole page."""
    folder = write_search(tmp_path / "edited")
    (folder / "best.yaml").write_text("name: [1]\nworkload: bert\ncluster: 5\nenv: [1, 2]\n")
    (folder / "train" / "summary.json").write_text('{"steps": 30, "world_sizes": 5}')
    assert report.main([str(folder)]) == 0
    text = (folder / "report.html").read_text()
    parse(text)
    assert "<title>commtune report: edited</title>" in text
    assert "Training run: steps 30" in text


def test_the_report_replaces_the_page_whole(tmp_path: Path) -> None:
    """A browser (or a copy) holding the old page keeps it whole: the new one is written
    beside and renamed into place, by the command and at the end of a search alike."""
    folder = write_search(tmp_path / "run")
    for write in (lambda: report.main([str(folder)]), lambda: write_report(folder)):
        (folder / "report.html").write_text("old page")
        held = tmp_path / "held.html"
        held.unlink(missing_ok=True)
        held.hardlink_to(folder / "report.html")
        write()
        assert held.read_text() == "old page"
        assert "<!DOCTYPE html>" in (folder / "report.html").read_text()
        assert not list(folder.glob("*.tmp"))


def test_a_repeat_row_is_listed_with_its_reason_and_drawn_as_no_run() -> None:
    from orchestrator.report.html import REPEAT_STATE
    from orchestrator.report.trials import _kind, section_throughput
    from orchestrator.runfiles import RunRecord
    from orchestrator.search.study import REPEAT

    assert REPEAT_STATE == REPEAT, "the report reads the state the search writes"
    rows = [{"number": "0", "state": "complete", "samples_per_s": "10"},
            {"number": "1", "state": REPEAT, "reason": "not run: trial 0's configuration"}]
    assert [_kind(r["state"]) for r in rows] == ["complete", "not run"]
    assert "not run: trial 0&#x27;s configuration" in section_throughput(RunRecord(trials=rows))
