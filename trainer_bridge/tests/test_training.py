"""Training on the CPU with a tiny model built from a config: nothing is downloaded."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from trainer_bridge.tiny import (
    tiny_model_dir,
    toy_art_export,
    toy_art_group,
    toy_corpus,
    toy_dpo_export,
    toy_sft_export,
)
from trainer_bridge.training import (
    Conversation,
    ExportError,
    advantage_stats,
    art_groups_read,
    conversation_tokenize,
    dpo_pairs_read,
    group_advantages,
    message_normalize,
    train,
)
from trainer_bridge.training_config import TrainingConfig, TrainingConfigError


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_dir(tmp_path_factory.mktemp("tiny"), vocab_corpus=toy_corpus())


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def test_the_tiny_model_and_its_tokenizer_load_offline_and_render_tools(model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    messages: list[Any] = [
        {"role": "user", "content": "What colour is the sky?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "lookup", "arguments": {"thing": "sky"}}}],
        },
        {"role": "tool", "tool_call_id": "call-1", "content": "blue"},
        {"role": "assistant", "content": "Blue."},
    ]

    text = tokenizer.apply_chat_template(messages, tools=[{"name": "lookup"}], tokenize=False)

    assert text == (
        '<|im_start|>system\ntools: [{"name": "lookup"}]<|im_end|>\n'
        "<|im_start|>user\nWhat colour is the sky?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>lookup {"thing": "sky"}</tool_call><|im_end|>\n'
        "<|im_start|>tool call-1\nblue<|im_end|>\n"
        "<|im_start|>assistant\nBlue.<|im_end|>\n"
    )
    assert model.config.num_hidden_layers == 2
    assert model.config.vocab_size == len(tokenizer)
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text


def test_group_advantages_are_standardised_within_the_group() -> None:
    advantages = group_advantages([1.0, 0.0, 0.5, 0.5])

    # mean 0.5, population std sqrt(0.125)
    std = math.sqrt(0.125)
    assert advantages == pytest.approx([0.5 / (std + 1e-6), -0.5 / (std + 1e-6), 0.0, 0.0])
    assert advantage_stats(advantages) == pytest.approx(
        {
            "advantage_mean": 0.0,
            "advantage_std": math.sqrt(0.5 * (0.5 / (std + 1e-6)) ** 2),
            "advantage_min": -0.5 / (std + 1e-6),
            "advantage_max": 0.5 / (std + 1e-6),
        }
    )


def test_a_group_with_equal_rewards_has_exactly_zero_advantages() -> None:
    # The float mean of three 0.7s is 0.6999999999999998; (r − mean)/ε would be 2e-10, not zero.
    assert group_advantages([0.7, 0.7, 0.7]) == [0.0, 0.0, 0.0]
    assert group_advantages([0.7]) == [0.0]
    assert group_advantages([]) == []


def test_a_choice_becomes_an_assistant_message_with_parsed_arguments() -> None:
    choice = {
        "finish_reason": "tool_calls",
        "index": 0,
        "message": {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}],
        },
    }

    assert message_normalize(choice) == {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}],
    }
    assert message_normalize({"role": "user", "content": [{"type": "text", "text": "hi"}]}) == {
        "role": "user",
        "content": "hi",
    }


def test_the_loss_mask_covers_the_assistant_turns_only(model_dir: Path, tmp_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    export = tmp_path / "groups.jsonl"
    export.write_text(json.dumps(toy_art_group("sky", "blue")) + "\n")
    conversation = art_groups_read(export)[0].conversations[0]

    tokenized = conversation_tokenize(tokenizer, conversation)

    trained = [token for token, bit in zip(tokenized.input_ids, tokenized.loss_mask, strict=True) if bit]
    untrained = [token for token, bit in zip(tokenized.input_ids, tokenized.loss_mask, strict=True) if not bit]
    assert tokenizer.decode(trained) == (
        '<tool_call>lookup {"thing": "sky"}</tool_call><|im_end|>\nChecked: the sky is blue.<|im_end|>\n'
    )
    context = str(tokenizer.decode(untrained))
    assert "Checked" not in context
    assert context.endswith("<|im_start|>assistant\n")
    assert len(tokenized.input_ids) == len(tokenized.loss_mask)


def test_assistant_turns_in_a_dpo_prompt_are_context(model_dir: Path, tmp_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    export = tmp_path / "pairs.jsonl"
    row = {
        "prompt": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "sky?"},
        ],
        "chosen": [{"role": "assistant", "content": "blue"}],
        "rejected": [{"role": "assistant", "content": "pink"}],
    }
    export.write_text(json.dumps(row) + "\n")
    pair = dpo_pairs_read(export)[0]

    chosen = conversation_tokenize(tokenizer, pair.chosen)

    trained = [token for token, bit in zip(chosen.input_ids, chosen.loss_mask, strict=True) if bit]
    assert tokenizer.decode(trained) == "blue<|im_end|>\n"


def test_a_turn_past_max_length_is_cut(model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    conversation = Conversation(
        messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x" * 200}]
    )

    tokenized = conversation_tokenize(tokenizer, conversation, max_length=16)

    assert len(tokenized.input_ids) == 16
    assert len(tokenized.loss_mask) == 16


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"method": "ppo"}, "method"),
        ({"steps": 10}, "method"),
        ({"method": "grpo", "steps": 0}, "steps"),
        ({"method": "grpo", "steps": True}, "steps"),
        ({"method": "grpo", "learning_rate": 0}, "learning_rate"),
        ({"method": "grpo", "learning_rate": "fast"}, "learning_rate"),
        ({"method": "sft", "batch_size": -1}, "batch_size"),
        ({"method": "sft", "lora_r": 0}, "lora_r"),
        ({"method": "sft", "lora_dropout": 1.0}, "lora_dropout"),
        ({"method": "sft", "lora_target_modules": []}, "lora_target_modules"),
        ({"method": "grpo", "kl_coef": -0.1}, "kl_coef"),
        ({"method": "dpo", "dpo_beta": 0}, "dpo_beta"),
        ({"method": "dpo", "validation_every": -1}, "validation_every"),
        ({"method": "dpo", "epochs": 3}, "epochs"),
    ],
)
def test_a_bad_config_names_the_field(data: dict[str, object], field: str) -> None:
    with pytest.raises(TrainingConfigError) as caught:
        TrainingConfig.from_dict(data)

    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}: ")


def test_a_config_from_json_accepts_integral_numbers_and_module_lists() -> None:
    config = TrainingConfig.from_dict(
        {"method": "sft", "learning_rate": 1, "lora_target_modules": ["q_proj", "v_proj"], "kl_coef": 0}
    )

    assert config.learning_rate == 1.0
    assert config.lora_target_modules == ("q_proj", "v_proj")


@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")
def test_grpo_raises_the_policy_preference_for_high_reward_completions(model_dir: Path, tmp_path: Path) -> None:
    export = toy_art_export(tmp_path / "groups.jsonl")
    config = TrainingConfig(
        method="grpo", steps=40, learning_rate=3e-3, batch_size=2, kl_coef=0.05, validation_every=10, seed=7
    )
    reported: list[dict[str, float]] = []

    result = train(
        config,
        base_model_dir=model_dir,
        export_path=export,
        output_dir=tmp_path / "adapter",
        on_metrics=reported.append,
    )

    steps = [m for m in reported if m["step"] > 0]
    validations = [m for m in reported if "validation_score" in m]
    assert [m["step"] for m in steps] == list(range(1, 41))
    assert [m["step"] for m in validations] == [0, 10, 20, 30, 40]
    assert set(steps[0]) >= {
        "loss", "kl", "reward_mean", "reward_std", "advantage_mean", "advantage_std", "advantage_min",
        "advantage_max", "policy_reward", "zero_advantage_groups_skipped", "groups", "trajectories",
    }  # fmt: skip
    assert steps[0]["zero_advantage_groups_skipped"] == 1.0
    assert steps[0]["groups"] == 2.0
    assert steps[0]["trajectories"] == 8.0
    assert steps[0]["reward_mean"] == pytest.approx(0.475)
    # The loss falls, the policy comes to prefer the high-reward completions, on held-out groups too.
    assert _mean([m["loss"] for m in steps[-5:]]) < _mean([m["loss"] for m in steps[:5]]) - 0.3
    assert _mean([m["policy_reward"] for m in steps[-5:]]) > _mean([m["policy_reward"] for m in steps[:5]]) + 0.15
    assert validations[-1]["validation_score"] > validations[0]["validation_score"] + 0.15
    # Measured on the same training groups at every validation, the training reward rises too.
    assert validations[-1]["train_policy_reward"] > validations[0]["train_policy_reward"] + 0.15
    assert steps[0]["kl"] < steps[-1]["kl"]
    assert result.steps_done == 40
    assert result.stopped is False
    assert result.adapter_dir is not None
    assert result.final_metrics["validation_score"] == validations[-1]["validation_score"]

    # The saved adapter carries what was learnt: it raises a high-reward completion's log-prob over the base's.
    tokenizer = AutoTokenizer.from_pretrained(result.adapter_dir)
    high = art_groups_read(export)[-1].conversations[0]
    tokenized = conversation_tokenize(tokenizer, high)
    ids = torch.tensor([tokenized.input_ids])
    mask = torch.tensor(tokenized.loss_mask[1:], dtype=torch.bool)

    def mean_logp(model: torch.nn.Module) -> float:
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, :-1]
        logps = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None]).squeeze(-1)
        return logps[mask].mean().item()

    base = AutoModelForCausalLM.from_pretrained(model_dir)
    before = mean_logp(base)
    adapted = PeftModel.from_pretrained(base, result.adapter_dir)
    assert mean_logp(adapted) > before + 0.1
    assert (result.adapter_dir / "adapter_config.json").is_file()
    assert (result.adapter_dir / "adapter_model.safetensors").is_file()


def test_training_is_deterministic_with_the_seed(model_dir: Path, tmp_path: Path) -> None:
    export = toy_art_export(tmp_path / "groups.jsonl")
    config = TrainingConfig(method="grpo", steps=4, learning_rate=3e-3, batch_size=2, kl_coef=0.05, seed=3)
    runs: list[list[dict[str, float]]] = [[], []]

    for index, reported in enumerate(runs):
        train(
            config,
            base_model_dir=model_dir,
            export_path=export,
            output_dir=tmp_path / f"a{index}",
            on_metrics=reported.append,
        )

    assert runs[0] == runs[1]
    assert len(runs[0]) == 5


def test_sft_loss_falls(model_dir: Path, tmp_path: Path) -> None:
    export = toy_sft_export(tmp_path / "sft.jsonl")
    config = TrainingConfig(method="sft", steps=30, learning_rate=1e-2, batch_size=4, validation_every=15)
    reported: list[dict[str, float]] = []

    train(
        config,
        base_model_dir=model_dir,
        export_path=export,
        output_dir=tmp_path / "adapter",
        on_metrics=reported.append,
    )

    steps = [m for m in reported if m["step"] > 0]
    validations = [m["validation_score"] for m in reported if "validation_score" in m]
    assert _mean([m["loss"] for m in steps[-5:]]) < 0.6 * _mean([m["loss"] for m in steps[:5]])
    assert len(validations) == 3
    assert validations[-1] > validations[0]
    assert all(m["tokens"] > 0 for m in steps)


def test_dpo_loss_falls_below_chance(model_dir: Path, tmp_path: Path) -> None:
    export = toy_dpo_export(tmp_path / "dpo.jsonl")
    config = TrainingConfig(method="dpo", steps=30, learning_rate=3e-3, batch_size=4, dpo_beta=0.1, validation_every=0)
    reported: list[dict[str, float]] = []

    train(
        config,
        base_model_dir=model_dir,
        export_path=export,
        output_dir=tmp_path / "adapter",
        on_metrics=reported.append,
    )

    steps = [m for m in reported if m["step"] > 0]
    validations = [m["validation_score"] for m in reported if "validation_score" in m]
    # The reference is the policy at step 1, so the first loss is log 2.
    assert steps[0]["loss"] == pytest.approx(math.log(2), abs=1e-4)
    assert _mean([m["loss"] for m in steps[-5:]]) < 0.5
    assert steps[-1]["reward_accuracy"] == 1.0
    assert validations[0] == pytest.approx(0.5, abs=1e-4)
    assert validations[-1] > 0.6


def test_a_custom_validation_is_reported_and_should_stop_ends_training_unsaved(model_dir: Path, tmp_path: Path) -> None:
    export = toy_sft_export(tmp_path / "sft.jsonl")
    config = TrainingConfig(method="sft", steps=50, learning_rate=1e-3, validation_every=2)
    reported: list[dict[str, float]] = []
    calls: list[str] = []

    def validation(model: object, tokenizer: object) -> float:
        calls.append(type(tokenizer).__name__)
        return float(len(calls))

    result = train(
        config,
        base_model_dir=model_dir,
        export_path=export,
        output_dir=tmp_path / "adapter",
        on_metrics=reported.append,
        validation=validation,
        should_stop=lambda: len(reported) >= 4,
    )

    assert result.stopped is True
    assert result.adapter_dir is None
    assert result.steps_done == 3
    assert [(m["step"], m.get("validation_score")) for m in reported] == [(0, 1.0), (1, None), (2, 2.0), (3, None)]
    assert not (tmp_path / "adapter").exists()


def test_an_export_without_reward_differences_cannot_be_trained(model_dir: Path, tmp_path: Path) -> None:
    group = toy_art_group("sky", "blue")
    for trajectory in group["trajectories"]:  # type: ignore[attr-defined]
        trajectory["reward"] = 1.0
    export = tmp_path / "groups.jsonl"
    export.write_text(json.dumps(group) + "\n")

    with pytest.raises(ExportError, match="1 groups skipped"):
        train(
            TrainingConfig(method="grpo", steps=1),
            base_model_dir=model_dir,
            export_path=export,
            output_dir=tmp_path / "a",
        )
