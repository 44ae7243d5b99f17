"""Profiles: the paper's values (appendix C), the pocket ones, and schema errors."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from moir_lib.profiles import Profile, ProfileError, list_profiles, load_profile, profiles_dir

PAPER = {
    "olmo2-7b-instruct": ("allenai/OLMo-2-1124-7B-Instruct", (9, 10, 11, 12, 13, 14)),
    "llama3.1-8b-instruct": ("meta-llama/Llama-3.1-8B-Instruct", (3, 4, 5, 6, 7, 8)),
    "qwen3-8b": ("Qwen/Qwen3-8B", (12, 13, 14, 15, 16, 17)),
}


def write(tmp_path: Path, data: dict, name: str = "custom") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture
def qwen_dict() -> dict:
    return load_profile("qwen3-8b").to_dict()


def test_the_five_profiles_exist() -> None:
    assert {"olmo2-7b-instruct", "llama3.1-8b-instruct", "qwen3-8b", "pocket", "pocket-micro"} <= set(
        list_profiles()
    )


@pytest.mark.parametrize("name", sorted(PAPER))
def test_paper_profiles_carry_appendix_c_values(name: str) -> None:
    p = load_profile(name)
    model, layers = PAPER[name]
    assert (p.name, p.model, p.edit_layers, p.dtype, p.revision) == (name, model, layers, "float16", None)
    g = p.generation
    assert (g.n_samples, g.max_new_tokens, g.seed_strategy) == (100_000, 256, "rand1")
    assert (g.temperature, g.top_p) == (1.0, 1.0)
    assert p.covariance.tokens_per_batch == 12_288 and p.covariance.wiki_samples == 100_000
    m = p.memit
    assert (m.lambda_, m.lambda_mode, m.v_num_grad_steps, m.v_lr, m.v_weight_decay, m.kl_factor) == (
        15_000.0, "absolute", 25, 0.5, 1e-3, 0.0625)
    assert p.alphaedit.tau_grid == (0.02, 0.005, 0.001, 0.0005) and p.alphaedit.tau in p.alphaedit.tau_grid
    assert m.context_templates == p.alphaedit.context_templates == 5  # the authors' get_context_templates
    e = p.editing
    assert e.batch_sizes_memit == (1000, 2000, 3000, 5000)
    assert e.batch_sizes_alphaedit == (5000, 10000, 20000)
    assert e.sequential_milestones == (10, 50, 100, 200, 500, 1000, 2000, 5000)
    import torch

    assert p.torch_dtype is torch.float16


def test_pocket_profiles() -> None:
    pocket, micro = load_profile("pocket"), load_profile("pocket-micro")
    assert (pocket.model, pocket.dtype) == ("pocket", "float32")
    assert micro.model == "pocket-micro"
    assert micro.generation.n_samples < pocket.generation.n_samples < 100_000
    # MEMIT's own prefixes; AlphaEdit loses ES with them on the pocket model
    assert (pocket.memit.context_templates, pocket.alphaedit.context_templates) == (5, 0)
    with pytest.raises(FileNotFoundError, match="'pocket-editable' is now 'pocket'.*--profile pocket"):
        load_profile("pocket-editable")


def test_profiles_are_frozen_and_overrides_revalidate() -> None:
    p = load_profile("pocket")
    before = p.memit.lambda_
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.memit.v_lr = 1.0  # type: ignore[misc]
    q = p.with_overrides({"memit.lambda": 5000, "generation.n_samples": 10, "edit_layers": [0, 1]})
    assert (q.memit.lambda_, q.generation.n_samples, q.edit_layers) == (5000.0, 10, (0, 1))
    assert p.memit.lambda_ == before != 5000.0  # unchanged
    with pytest.raises(ProfileError, match=r"memit: unknown key 'lamda'; valid keys: lambda, lambda_mode"):
        p.with_overrides({"memit.lamda": 1})
    with pytest.raises(ProfileError, match="must be > 0"):
        p.with_overrides({"generation.n_samples": 0})


def test_to_dict_round_trips(tmp_path: Path, qwen_dict: dict) -> None:
    path = write(tmp_path, qwen_dict, name="qwen3-8b")
    again = load_profile(path)
    assert again == load_profile("qwen3-8b") and isinstance(again, Profile)
    assert again.path == path


def test_missing_profile_lists_the_available_ones() -> None:
    listing = r"no profile 'olmo3'.*available profiles.*olmo2-7b-instruct.*pocket"
    with pytest.raises(FileNotFoundError, match=listing):
        load_profile("olmo3")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(layers=[1]), r"unknown key 'layers'; valid keys: name, model, dtype, edit_"),
        (lambda d: d["memit"].update(lamda=1.0), r"memit: unknown key 'lamda'; valid keys: lambda, lambda_"),
        (lambda d: d["alphaedit"].pop("tau"), r"alphaedit: missing key 'tau'"),
        (lambda d: d["editing"].update(context_templates=5),
         r"editing: unknown key 'context_templates'.*per editor now: memit.context_templates and alphaedit"),
        (lambda d: d.pop("edit_layers"), r"missing key 'edit_layers'"),
        (lambda d: d.update(edit_layers="9-14"), r"edit_layers: expected a list"),
        (lambda d: d.update(edit_layers=[3, 2]), r"edit_layers: must be strictly increasing"),
        (lambda d: d.update(edit_layers=[-1, 2]), r"edit_layers: must be >= 0"),
        (lambda d: d.update(edit_layers=[]), r"edit_layers: the list is empty"),
        (lambda d: d.update(dtype="fp16"), r"dtype: 'fp16' is not one of 'float16', 'bfloat16'"),
        (lambda d: d["generation"].update(seed_strategy="random"), r"seed_strategy: 'random' is not \"bos\""),
        (lambda d: d["generation"].update(top_p=1.5), r"top_p: must be in \(0, 1\]"),
        (lambda d: d["generation"].update(n_samples=1.5), r"n_samples: expected an integer"),
        (lambda d: d["memit"].update(v_lr="fast"), r"v_lr: expected a number"),
        (lambda d: d["alphaedit"].update(tau_mode="percent"), r"tau_mode: 'percent' is not one of"),
        (lambda d: d.update(memit=[1, 2]), r"memit: expected a mapping"),
    ],
)
def test_schema_errors_name_the_key(tmp_path: Path, qwen_dict: dict, edit, message: str) -> None:
    edit(qwen_dict)
    with pytest.raises(ProfileError, match=message):
        load_profile(write(tmp_path, qwen_dict))


def test_yaml_quirks_and_names(tmp_path: Path, qwen_dict: dict) -> None:
    qwen_dict["memit"]["v_weight_decay"] = "1e-3"  # YAML 1.1 reads 1e-3 as a string
    qwen_dict["generation"]["seed_strategy"] = "prompt:Once upon a time"
    del qwen_dict["name"]
    p = load_profile(write(tmp_path, qwen_dict, name="mine"))
    assert p.memit.v_weight_decay == 1e-3 and p.name == "mine"
    (tmp_path / "bad.yaml").write_text("model: [unclosed\n")
    with pytest.raises(ProfileError, match="not valid YAML"):
        load_profile(tmp_path / "bad.yaml")


def test_moir_profiles_env_and_name_check(tmp_path: Path, qwen_dict: dict, monkeypatch) -> None:
    monkeypatch.setenv("MOIR_PROFILES", str(tmp_path))
    assert profiles_dir() == tmp_path and list_profiles() == []
    write(tmp_path, qwen_dict, name="renamed")
    assert list_profiles() == ["renamed"]
    with pytest.raises(ProfileError, match="name 'qwen3-8b' differs from the file name 'renamed'"):
        load_profile("renamed")


def test_organism_defaults_to_zero_and_is_left_out_of_the_keys_there(tmp_path: Path, qwen_dict: dict) -> None:
    """Organism 0 is the recipe's own model: its profile dict (hence every result key) is the one a profile
    without the field gives; another organism enters it, through overrides as from YAML."""
    p = load_profile("pocket")
    assert p.organism == 0 and "organism" not in p.to_dict()
    zero = p.with_overrides({"organism": 0})
    assert zero == p and zero.to_dict() == p.to_dict()
    q = p.with_overrides({"organism": 1})
    assert q.organism == 1 and q != p
    assert q.to_dict() == {**p.to_dict(), "organism": 1}
    assert q.with_overrides({"memit.lambda": 4.0}).organism == 1  # kept through later overrides
    assert q.with_overrides({"organism": 0}) == p
    data = {**load_profile("pocket-micro").to_dict(), "organism": 2}
    again = load_profile(write(tmp_path, data, name="pocket-micro"))
    assert again.organism == 2 and again.to_dict() == data


@pytest.mark.parametrize(("value", "message"), [(-1, "organism: must be >= 0, got -1"),
                                                 (1.5, "organism: expected an integer"),
                                                 ("1", "organism: expected an integer"),
                                                 (True, "organism: expected an integer")])
def test_bad_organisms_are_refused(value, message: str) -> None:
    with pytest.raises(ProfileError, match=message):
        load_profile("pocket").with_overrides({"organism": value})
