"""params.yaml is validated once, with one line that names the key; it is conf/ composed by Hydra (as
`dvc exp run` writes it), and every profile composes to valid params."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, load_params, stage, write_params

from vgrpo.config import QUANTIZATIONS, ConfigError, compose, config_from_dict, load_config


def set_key(raw: dict, dotted: str, value) -> dict:
    *parents, last = dotted.split(".")
    node = raw
    for key in parents:
        node = node[key]
    node[last] = value
    return raw


def del_key(raw: dict, dotted: str) -> dict:
    *parents, last = dotted.split(".")
    node = raw
    for key in parents:
        node = node[key]
    del node[last]
    return raw


BAD_INPUTS = [
    # (what is wrong, edit, exact message or the start of it)
    ("below minimum", lambda r: set_key(r, "generate.val_size", -3),
     "params.yaml: generate.val_size: expected an integer >= 1, got -3"),
    ("unknown key", lambda r: set_key(r, "generate.colour_mode", "rgb"),
     "params.yaml: generate.colour_mode: unknown key (expected one of seed, image_size"),
    ("unknown top-level key", lambda r: set_key(r, "trian", {}), "params.yaml: trian: unknown key"),
    ("string for a number", lambda r: set_key(r, "train.learning_rate", "fast"),
     "params.yaml: train.learning_rate: expected a number > 0, got 'fast'"),
    ("bool for an integer", lambda r: set_key(r, "generate.seed", True),
     "params.yaml: generate.seed: expected an integer >= 0, got True"),
    ("float for an integer", lambda r: set_key(r, "evaluate.batch_size", 2.5),
     "params.yaml: evaluate.batch_size: expected an integer >= 1, got 2.5"),
    ("missing key", lambda r: del_key(r, "train.seed"), "params.yaml: train.seed: missing key"),
    ("missing group", lambda r: del_key(r, "evaluate"), "params.yaml: evaluate: missing group"),
    ("value not among choices", lambda r: set_key(r, "train.backend", "jax"),
     "params.yaml: train.backend: expected one of auto, unsloth, hf, got 'jax'"),
    ("number above maximum", lambda r: set_key(r, "train.lora_dropout", 1.5),
     "params.yaml: train.lora_dropout: expected a number >= 0 and <= 1, got 1.5"),
    ("no profile name", lambda r: del_key(r, "profile"),
     "params.yaml: profile: expected the name of the profile composed (dvc exp run -S profile=...), got None"),
    ("a group params.yaml does not have", lambda r: set_key(r, "trainer", {"seed": 1}),
     "params.yaml: trainer: unknown key (expected one of profile, model, generate, base, train, evaluate"),
    ("every reward off", lambda r: set_key(r, "train.rewards", {"correctness_tags": 0.0}),
     "params.yaml: train.rewards: every weight is 0"),
    ("bad list element", lambda r: set_key(r, "evaluate.splits", ["val", "holdout"]),
     "params.yaml: evaluate.splits[1]: expected one of train, val, test, ood, got 'holdout'"),
    ("group that is not a mapping", lambda r: set_key(r, "smoke", [1, 2]),
     "params.yaml: smoke: expected a mapping, got [1, 2]"),
    ("ood range inside the training range", lambda r: set_key(r, "generate.ood_min_count", 4),
     "params.yaml: generate.ood_min_count: must exceed the training range"),
    ("shared colour", lambda r: set_key(r, "generate.colours.circles", "red"),
     "params.yaml: generate.colours: each shape needs its own colour"),
    ("unknown reward", lambda r: set_key(r, "train.rewards", {"correctness_tags": 1.0, "vibes": 1.0}),
     "params.yaml: train.rewards.vibes: unknown reward (expected one of correctness_tags, correctness_partial"),
    ("negative reward weight", lambda r: set_key(r, "train.rewards", {"format_tags": -1}),
     "params.yaml: train.rewards.format_tags: expected a number >= 0, got -1"),
    ("group size that does not divide the batch", lambda r: set_key(r, "train.num_generations", 3),
     "params.yaml: train.num_generations: 3 does not divide the generation batch 2"),
    ("unknown quantization", lambda r: set_key(r, "export.quantizations", ["q4_k_m", "q4_k_xl"]),
     "params.yaml: export.quantizations: unknown quantization 'q4_k_xl' (expected one of q4_0"),
    ("cap for an unknown split", lambda r: set_key(r, "evaluate.max_samples", {"val": 5, "holdout": 5}),
     "params.yaml: evaluate.max_samples.holdout: unknown split (expected one of train, val, test, ood)"),
    ("split without a cap", lambda r: set_key(r, "evaluate.max_samples", {"val": 5, "test": 5}),
     "params.yaml: evaluate.max_samples: no cap for split 'ood' (listed in evaluate.splits)"),
    ("shape larger than the image", lambda r: set_key(r, "generate.max_shape_size", 300),
     "params.yaml: generate.max_shape_size: does not fit in a 256px image"),
    ("answer smoothing above 1", lambda r: set_key(r, "base.answer_smoothing", 1.5),
     "params.yaml: base.answer_smoothing: expected a number >= 0 and <= 1, got 1.5"),
    ("answer smoothing without the sampled softmax", lambda r: set_key(r, "base.answer_smoothing", 0.5),
     "params.yaml: base.answer_smoothing: is computed in the sampled-softmax loss: set base.sampled_negatives > 0"),
    ("no warm-up answer described", lambda r: set_key(r, "base.described_share", 0),
     "params.yaml: base.described_share: expected a number > 0 and <= 1, got 0"),
    ("brief answers neither right nor guessed", lambda r: set_key(r, "base.brief_answers", "wrong"),
     "params.yaml: base.brief_answers: expected one of right, guessed, got 'wrong'"),
    ("a fixed baseline with dynamic sampling", lambda r: set_key(set_key(r, "train.advantage_baseline", 2.0),
                                                                 "train.prompt_oversampling", 2),
     "params.yaml: train.advantage_baseline: dynamic sampling picks groups by their spread around the group's mean"),
    ("a fixed baseline with scaled rewards", lambda r: set_key(set_key(r, "train.advantage_baseline", 2.0),
                                                                "train.scale_rewards", "group"),
     "params.yaml: train.advantage_baseline: a fixed baseline's advantages are not divided by a reward std"),
    ("an answer temperature of 0", lambda r: set_key(r, "train.answer_temperature", 0),
     "params.yaml: train.answer_temperature: expected a number > 0, got 0"),
    ("an answer temperature with vLLM", lambda r: set_key(set_key(r, "train.answer_temperature", 1.4),
                                                          "train.use_vllm", True),
     "params.yaml: train.answer_temperature: vLLM samples the rollouts with its own settings"),
    ("revisits beyond a batch's groups", lambda r: set_key(r, "train.revisit_unsolved", 2),
     "params.yaml: train.revisit_unsolved: 2 groups, but a generation batch holds 1 (per_device_train_batch_size"),
    ("revisits in several processes", lambda r: set_key(set_key(r, "train.revisit_unsolved", 1),
                                                         "train.num_processes", 2),
     "params.yaml: train.revisit_unsolved: revisits run in one process (train.num_processes: 1)"),
    ("revisits without a correctness reward", lambda r: set_key(set_key(r, "train.revisit_unsolved", 1),
                                                                "train.rewards", {"format_tags": 1.0}),
     "params.yaml: train.revisit_unsolved: tells unsolved prompts by a correctness reward"),
    ("a baseline that is not a number", lambda r: set_key(r, "train.advantage_baseline", "mean"),
     "params.yaml: train.advantage_baseline:"),
    ("positive advantages weighed above 1", lambda r: set_key(r, "train.positive_advantage_weight", 1.5),
     "params.yaml: train.positive_advantage_weight: expected a number >= 0 and <= 1, got 1.5"),
    ("positive advantages weighed below 0", lambda r: set_key(r, "train.positive_advantage_weight", -0.1),
     "params.yaml: train.positive_advantage_weight: expected a number >= 0 and <= 1, got -0.1"),
    ("a warm-up range below the training range", lambda r: set_key(r, "generate.warmup_max_count", 4),
     "params.yaml: generate.warmup_max_count: must be >= generate.max_count (4 < 5): the warm-up split covers the "
     "training range"),
    ("no warm-up count", lambda r: set_key(r, "generate.warmup_max_count", 0),
     "params.yaml: generate.warmup_max_count: expected an integer >= 1, got 0"),
    ("no guess", lambda r: set_key(r, "base.brief_guess_max", 0),
     "params.yaml: base.brief_guess_max: expected an integer >= 1, got 0"),
    ("a guess max without guessed brief answers", lambda r: set_key(r, "base.brief_guess_max", 8),
     "params.yaml: base.brief_guess_max: is only read with base.brief_answers: guessed (got right): set it to null"),
    ("guesses below the smallest count", lambda r: set_key(set_key(set_key(
        r, "base.brief_answers", "guessed"), "generate.min_count", 3), "base.brief_guess_max", 2),
     "params.yaml: base.brief_guess_max: must be >= generate.min_count (2 < 3)"),
]


@pytest.mark.parametrize("what, edit, message", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_params_name_the_key(what, edit, message):
    with pytest.raises(ConfigError) as info:
        config_from_dict(edit(load_params()))
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith(message), text


def test_every_profile_composes_to_valid_params():
    from vgrpo.config import profiles

    assert profiles() == ["book", "cpu", "full", "gpu16", "tiny"]
    for profile in profiles():
        config = config_from_dict(compose(profile))
        assert config.profile == profile
    full = config_from_dict(load_params())
    assert full.model.name == "Qwen/Qwen3-VL-8B-Instruct"
    assert (full.generate.train_size, full.generate.val_size, full.generate.test_size, full.generate.ood_size) >= (
        500, 100, 100, 100)


def test_the_committed_params_are_conf_composed_with_the_default_profile():
    """params.yaml in git is what `dvc exp run` would write from conf/ (so its first run changes nothing)."""
    from dvc.utils.hydra import compose_and_dump

    assert compose("full") == load_params()
    with tempfile.TemporaryDirectory() as tmp:
        compose_and_dump(Path(tmp) / "params.yaml", str(ROOT / "conf"), None, "config", "", [])
        assert (Path(tmp) / "params.yaml").read_text() == (ROOT / "params.yaml").read_text()  # byte for byte


def test_a_profile_sets_keys_and_the_rest_stays():
    tiny, full = compose("tiny"), load_params()
    assert tiny["model"]["name"] == "tiny" and tiny["train"]["max_steps"] == 6
    assert tiny["train"]["lora_r"] == full["train"]["lora_r"]  # not set by the profile: the default
    assert tiny["generate"]["colours"] == full["generate"]["colours"]
    assert compose("tiny", ["train.max_steps=2"])["train"]["max_steps"] == 2  # -S after the profile wins


def test_a_profile_turns_rewards_off_by_weight():
    """Composition merges the reward table key by key: the book profile turns the tag rewards off with 0."""
    from vgrpo.rewards import reward_functions

    book = config_from_dict(compose("book"))
    funcs, weights = reward_functions(book.train.rewards)
    assert [f.__name__ for f in funcs] == ["correctness_free", "description", "reasoning"] and weights == [1.0] * 3


def test_an_unknown_profile_or_override_is_one_line():
    with pytest.raises(ConfigError, match=r"^profile: unknown profile 'huge' \(expected one of book, cpu, full, gpu16, "
                                          r"tiny: "):
        compose("huge")
    with pytest.raises(ConfigError, match=r"cannot compose profile tiny with \['train.no_such_key=1'\]: "):
        compose("tiny", ["train.no_such_key=1"])


def test_not_yaml_and_missing_file(tmp_path):
    bad = tmp_path / "params.yaml"
    bad.write_text("generate: [unclosed\n")
    with pytest.raises(ConfigError, match=r"params.yaml: not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match=r"nowhere.yaml: file not found"):
        load_config(tmp_path / "nowhere.yaml")


def test_quantization_names_match_llama_cpp():
    import llama_cpp

    for name, ftype in QUANTIZATIONS.items():
        assert getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{name.upper()}") == ftype


def test_stage_exits_2_with_one_line_before_heavy_imports(tmp_path):
    raw = set_key(load_params(), "generate.val_size", -3)
    params = write_params(tmp_path / "params.yaml", raw)
    result = stage("generate", "--params", str(params), "--out", str(tmp_path / "shapes"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: params.yaml: generate.val_size: expected an integer >= 1, got -3"]
    assert not (tmp_path / "shapes").exists()


def test_validation_imports_nothing_heavy():
    code = ("import sys; from vgrpo.config import load_config; load_config('params.yaml'); "
            "print(sorted(m for m in ('torch', 'transformers', 'datasets', 'trl') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_params_file_has_one_group_per_stage():
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert raw["profile"] == "full"
    assert set(raw) == {"profile", "model", "generate", "base", "train", "evaluate", "export", "smoke"}
