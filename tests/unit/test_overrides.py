"""``workload.model_overrides`` that transformers would refuse exit 2 before Ray, naming the key;
valid ones, and the keys a config class maps to others, still pass."""

from __future__ import annotations

import contextlib
import io

import pytest

from orchestrator.config.schema import ConfigError, load_config
from orchestrator.planning.from_config import check_model
from orchestrator.search.cli import main
from orchestrator.train import cli as train

BAD = [
    ("num_attention_heads=0", "num_attention_heads", "use 1 or more"),
    ("vocab_size=-5", "vocab_size", "use 1 or more"),
    ("hidden_size=101", "hidden_size", "not a multiple of the number of attention heads"),
    ("num_hiden_layers=3", "num_hiden_layers", "did you mean 'num_hidden_layers'"),
    ("num_hidden_layers=2.5", "num_hidden_layers", "use a whole number"),
    ("hidden_dropout_prob=2.0", "hidden_dropout_prob", "probability"),
    ("layer_norm_eps=1e-5", "layer_norm_eps", "write the number with a point"),
    ("is_decoder=3", "is_decoder", "true or false"),
    ("hidden_act=nope", "hidden_act", "refused by transformers building 'bert-tiny'"),
    ("return_dict=false", "return_dict", "no such config key to set"),
    ("num_hidden_layers=100000", "num_hidden_layers", "at most 1024 layers"),
]


@pytest.mark.parametrize(("item", "key", "text"), BAD, ids=[b[0] for b in BAD])
def test_a_refused_override_exits_2_before_ray_naming_the_key(
    item: str, key: str, text: str, tmp_path
) -> None:
    import ray

    for entry in (main, train.main):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = entry(["--preset", "smoke", "--out", str(tmp_path / "out"),
                          "--set", f"workload.model_overrides.{item}"])  # fmt: skip
        assert code == 2, err.getvalue()
        assert err.getvalue().count("\n") == 1, err.getvalue()
        assert f"error: workload.model_overrides.{key}: " in err.getvalue()
        assert text in err.getvalue(), err.getvalue()
        assert not ray.is_initialized() and not (tmp_path / "out").exists()


def test_the_key_named_is_the_one_that_breaks_the_build() -> None:
    """Two overrides that each pass alone: the one whose addition breaks the model is named."""
    sets = ["workload.model_overrides.num_attention_heads=4",
            "workload.model_overrides.hidden_size=130"]  # fmt: skip
    config = load_config(preset="smoke", sets=sets)
    with pytest.raises(ConfigError, match=r"model_overrides\.hidden_size: 130 .*\(4\)"):
        check_model(config)


def test_valid_overrides_pass_and_build_the_model_they_describe() -> None:
    from train_fns.models import resolve_model_config

    sets = ["workload.model_overrides.num_hidden_layers=1",
            "workload.model_overrides.attention_probs_dropout_prob=0.0",
            "workload.model_overrides.layer_norm_eps=1.0e-6"]  # fmt: skip
    config = load_config(preset="smoke", sets=sets)
    assert check_model(config) == (config, [])
    built = resolve_model_config(config.workload.model, config.workload.model_overrides)
    assert (built.num_hidden_layers, built.layer_norm_eps, built.vocab_size) == (1, 1e-6, 2048)


def test_a_key_the_config_class_maps_is_known() -> None:
    """GPT-2 names its width n_embd and maps hidden_size to it: both are accepted."""
    for key in ("hidden_size", "n_embd"):
        config = load_config(sets=["workload.model=gpt2", "workload.seq_len=32",
                                   f"workload.model_overrides.{key}=64",
                                   "workload.model_overrides.n_head=2",
                                   "workload.model_overrides.n_layer=1"])  # fmt: skip
        assert check_model(config) == (config, [])


@pytest.mark.parametrize(
    ("sets", "key", "text"),
    [
        (["workload.model_overrides.num_hidden_layers=0"], "num_hidden_layers", "1 or more"),
        (["workload.model_overrides.n_layer=0"], "n_layer", "1 or more"),
        (["workload.model_overrides.hidden_size=abc"], "hidden_size", "whole number"),
        (["workload.model_overrides.n_positions=64",
          "workload.model_overrides.max_position_embeddings=128"],
         "max_position_embeddings", "names the same field as 'n_positions'"),
    ],
)  # fmt: skip
def test_an_alias_is_checked_as_its_field(sets: list[str], key: str, text: str) -> None:
    """GPT-2 maps num_hidden_layers to n_layer, hidden_size to n_embd: an alias gets its field's
    checks, and an alias set beside its field is refused rather than one silently winning."""
    config = load_config(sets=["workload.model=gpt2", "workload.seq_len=32", *sets])
    with pytest.raises(ConfigError, match=rf"^workload.model_overrides.{key}: .*{text}"):
        check_model(config)


def test_a_wrong_kind_on_an_hf_model_type_names_the_key_not_a_traceback() -> None:
    """A model named by its type (not a preset) had its config read with the overrides while
    the seq_len was checked, and transformers' validation error escaped as a traceback."""
    config = load_config(sets=["workload.model=bert", "workload.model_overrides.vocab_size=abc"])
    with pytest.raises(ConfigError, match="^workload.model_overrides.vocab_size: got 'abc'"):
        check_model(config)
