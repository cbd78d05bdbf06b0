"""transformers' model types and default positions, read from its source without importing it
(so that a typo in a model name is refused without the seconds importing transformers takes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.config.schema import ConfigError, from_dict
from train_fns import hf_source
from train_fns.model_presets import POSITION_KEYS

ROOT = Path(__file__).resolve().parents[2]


def test_model_types_match_what_transformers_registers() -> None:
    types = hf_source.model_types()
    assert types is not None and types["roberta"] == "RobertaConfig"
    assert types["gpt-sw3"] == "GPT2Config" and "mlcd" in types  # added in configuration_auto
    pytest.importorskip("transformers")
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    assert types == dict(CONFIG_MAPPING_NAMES)


@pytest.mark.parametrize(
    ("model_type", "stated", "expected"),
    [
        ("roberta", {}, 512),  # a dataclass field
        ("gpt2", {}, 1024),  # n_positions, through attribute_map
        ("gpt-sw3", {}, 1024),  # no module of its own: GPT2Config's
        ("mistral", {}, 4096 * 32),  # arithmetic on literals
        ("camembert", {}, 512),
        ("gpt2", {"n_positions": 2048}, 2048),  # a config.json states the aliased key
        ("roberta", {"max_position_embeddings": 64}, 64),
    ],
)
def test_default_positions_as_transformers_builds_them(
    model_type: str, stated: dict, expected: int
) -> None:
    assert hf_source.default_positions(model_type, POSITION_KEYS, stated) == expected


def test_seq_len_beyond_an_hf_type_and_a_local_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="workload.seq_len: 4096 exceeds the 512 positions"):
        from_dict({"workload": {"model": "roberta", "seq_len": 4096}})
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))  # states none
    with pytest.raises(ConfigError, match="workload.seq_len: 2048 exceeds the 1024 positions"):
        from_dict({"workload": {"model": str(tmp_path), "seq_len": 2048}})


def test_hub_cache_copy_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    snapshot = tmp_path / "models--org--tiny" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert hf_source.hub_cache_snapshot("org/tiny") == snapshot
    assert hf_source.hub_cache_snapshot("org/other") is None
    with pytest.raises(ConfigError, match=f"Hugging Face cache: workload.model: {snapshot}"):
        from_dict({"workload": {"model": "org/tiny"}})


def test_model_typos_exit_fast_without_importing_transformers(tmp_path: Path) -> None:
    """The three inputs only transformers used to answer, through the real CLI in one fresh
    interpreter: each exits 2 naming its key, without what took seconds: transformers (and
    torch) never imported, no name looked up and no connection made (no hub lookup)."""
    (tmp_path / "typo").mkdir()
    (tmp_path / "typo" / "config.json").write_text('{"model_type": "robertta"}')
    (tmp_path / "long.yaml").write_text("workload:\n  model: roberta\n  seq_len: 4096\n")
    argvs = [
        ["--preset", "smoke", "--set", f"workload.model={tmp_path / 'typo'}"],
        ["--preset", "smoke", "--set", "workload.model=robertta"],
        ["--config", str(tmp_path / "long.yaml")],
    ]
    script = (
        "import sys\n"
        "network = []\n"
        "def audit(event, args):\n"
        "    if event in ('socket.connect', 'socket.getaddrinfo', 'socket.gethostbyname'):\n"
        "        network.append(event)\n"
        "sys.addaudithook(audit)\n"
        "from orchestrator.search.cli import main\n"
        f"for argv in {argvs!r}:\n"
        "    print(main(argv + ['--out', sys.argv[1]]))\n"
        "print('transformers' in sys.modules, 'torch' in sys.modules, network)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "out")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    lines = proc.stdout.split("\n")
    assert lines[:3] == ["2", "2", "2"], proc.stdout + proc.stderr
    assert lines[3] == "False False []", proc.stdout
    errors = proc.stderr.splitlines()
    assert "workload.model" in errors[0] and "did you mean 'roberta'" in errors[0], errors
    assert "workload.model" in errors[1] and "did you mean 'roberta'" in errors[1], errors
    assert "workload.seq_len: 4096 exceeds the 512" in errors[2], errors
