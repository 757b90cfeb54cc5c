"""trainer_bridge.formats: each writer read back as JSON and by its consumer's own structures, the refusals
before writing, laziness and the manifest's checksum. Pure: no database, nothing downloaded."""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam
from pydantic import TypeAdapter

from evals import gym as evals_gym
from trainer_bridge.formats import FORMATS, FormatCannotRepresent, UnknownFormat, art, format_get, gym, openai_ft, trl
from trainer_bridge.formats.manifest import HashingWriter, export_write, keel_version
from trainer_bridge.groups import Group, Rollout, preview

TOOLS = (
    {
        "type": "function",
        "function": {
            "name": "order_lookup",
            "description": "Find an order",
            "parameters": {"type": "object", "properties": {"order": {"type": "integer"}}, "required": ["order"]},
        },
    },
)


def trajectory(
    trace_id: str, reward: float | None, answer: str, *, order: int = 7, correction: str | None = None
) -> Rollout:
    return Rollout(
        trace_id=trace_id,
        messages=(
            {"role": "system", "content": "You help with orders."},
            {"role": "user", "content": "Where is order 7?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"{trace_id}-c1",
                        "type": "function",
                        "function": {"name": "order_lookup", "arguments": json.dumps({"order": order})},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": f"{trace_id}-c1", "content": "shipped monday"},
            {"role": "assistant", "content": answer},
        ),
        tools=TOOLS,
        reward=reward,
        metrics={"steps": 2, "latency_s": 1.5, "label": "x"},  # type: ignore[dict-item]
        metadata={"agent": "support", "signals": ["execution.loops.retry"], "prompt_version": 3},
        correction=correction,
        tokens=120,
    )


def sample_groups() -> list[Group]:
    return [
        Group(
            task_id="item:1",
            task_text="Where is order 7?",
            rollouts=(
                trajectory("t1", 1.0, "It shipped on Monday."),
                trajectory("t2", 0.0, "I do not know.", order=8),
                trajectory("t3", None, "Unscored."),
            ),
        ),
        Group(
            task_id="item:2",
            task_text="Where is order 7?",
            rollouts=(trajectory("t4", 0.5, "Soon.", correction="It shipped on Monday; it arrives Thursday."),),
            split="validation",
        ),
    ]


def lines(buffer: io.BytesIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in buffer.getvalue().decode("utf-8").splitlines()]


MESSAGE = TypeAdapter(ChatCompletionMessageParam)
TOOL = TypeAdapter(ChatCompletionToolParam)


# --- ART ------------------------------------------------------------------------------------------------


def test_art_lines_are_trajectory_groups() -> None:
    out = io.BytesIO()
    counts = art.write(sample_groups(), out)
    assert (counts.lines, counts.groups, counts.rollouts, counts.skipped) == (2, 2, 3, 1)
    first, second = lines(out)
    # The fields of ART's TrajectoryGroup and Trajectory (openpipe-art 0.5.x).
    assert set(first) == {"trajectories", "exceptions", "metadata", "metrics", "logs"}
    assert first["metadata"] == {"task_id": "item:1", "task_text": "Where is order 7?", "split": "train"}
    assert second["metadata"]["split"] == "validation"
    assert [item["reward"] for item in first["trajectories"]] == [1.0, 0.0]
    trajectory_line = first["trajectories"][0]
    assert set(trajectory_line) == {
        "messages_and_choices",
        "tools",
        "additional_histories",
        "reward",
        "metrics",
        "metadata",
        "logs",
    }
    assert trajectory_line["metrics"] == {"steps": 2, "latency_s": 1.5}
    metadata = trajectory_line["metadata"]
    assert (metadata["trace_id"], metadata["task_id"], metadata["prompt_version"]) == ("t1", "item:1", 3)
    assert metadata["signals"] == '["execution.loops.retry"]'
    assert all(value is None or isinstance(value, str | int | float | bool) for value in metadata.values())
    assert second["trajectories"][0]["metadata"]["correction"].startswith("It shipped")
    for message in trajectory_line["messages_and_choices"]:
        # ART reads a dict with "message" back as a Choice (a sampled completion); recorded turns are messages.
        assert "message" not in message
        MESSAGE.validate_python(message)
    assistant = trajectory_line["messages_and_choices"][2]
    assert assistant["tool_calls"][0]["function"] == {"name": "order_lookup", "arguments": '{"order": 7}'}
    assert trajectory_line["messages_and_choices"][3] == {
        "role": "tool",
        "tool_call_id": "t1-c1",
        "content": "shipped monday",
    }
    for tool in trajectory_line["tools"]:
        TOOL.validate_python(tool)


def test_art_check_refuses_groups_without_rewards() -> None:
    unrewarded = [Group(task_id="a", task_text="", rollouts=(trajectory("t", None, "x"),))]
    with pytest.raises(FormatCannotRepresent, match="no rollout has one"):
        art.check(preview(unrewarded))
    with pytest.raises(FormatCannotRepresent, match="left none"):
        art.check(preview([]))
    art.check(preview(sample_groups()))


# --- TRL ------------------------------------------------------------------------------------------------

CHAT_TEMPLATE = (
    "{%- if tools %}<tools> {{ tools | tojson }} </tools>\n{% endif %}"
    "{%- for message in messages %}<{{ message.role }}> "
    "{% if message.content is string %}{{ message.content }}{% endif %}"
    "{% for call in message.tool_calls or [] %} <call> {{ call.function.name }} "
    "{{ call.function.arguments | tojson }} </call>{% endfor %} </{{ message.role }}>\n{% endfor %}"
    "{%- if add_generation_prompt %}<assistant>{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """A word-level tokenizer with a chat template that renders tools and tool calls, built offline."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel(vocab={"[UNK]": 0, "[PAD]": 1, "<eos>": 2}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="[UNK]",
        pad_token="[PAD]",
        eos_token="<eos>",
        chat_template=CHAT_TEMPLATE,
    )


def load_jsonl(tmp_path: Path, data: bytes) -> Any:
    import datasets

    path = tmp_path / "rows.jsonl"
    path.write_bytes(data)
    return datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "cache"))


def test_trl_sft_rows_read_back_with_datasets_and_trl(tmp_path: Path, tokenizer: Any) -> None:
    from trl.data_utils import is_conversational, maybe_apply_chat_template

    out = io.BytesIO()
    counts = trl.sft_write(sample_groups(), out, threshold=1.0)
    # t1 (reward 1.0) and t4 (corrected); t2 below the threshold and t3 unrewarded are left out.
    assert (counts.lines, counts.groups, counts.rollouts, counts.skipped) == (2, 2, 2, 2)
    dataset = load_jsonl(tmp_path, out.getvalue())
    assert dataset.column_names == ["messages", "tools", "split"]
    first, corrected = dataset[0], dataset[1]
    assert is_conversational(first)
    assert first["messages"][2]["tool_calls"][0]["function"]["arguments"] == {"order": 7}
    assert first["messages"][3]["name"] == "order_lookup"
    assert corrected["messages"][-1] == {"role": "assistant", "content": "It shipped on Monday; it arrives Thursday."}
    rendered = maybe_apply_chat_template(first, tokenizer, tools=json.loads(first["tools"]))["text"]
    assert '<call> order_lookup {"order": 7} </call>' in rendered
    assert '"name": "order_lookup"' in rendered.split("</tools>")[0]
    assert rendered.rstrip().endswith("<assistant> It shipped on Monday. </assistant>")


def test_trl_dpo_pairs_read_back_with_trl(tmp_path: Path, tokenizer: Any) -> None:
    from trl.data_utils import is_conversational, maybe_apply_chat_template

    out = io.BytesIO()
    counts = trl.dpo_write(sample_groups(), out)
    assert (counts.lines, counts.groups) == (2, 2)
    dataset = load_jsonl(tmp_path, out.getvalue())
    assert sorted(dataset.column_names) == ["chosen", "prompt", "rejected", "split", "tools"]
    best_worst, correction = dataset[0], dataset[1]
    assert is_conversational(best_worst)
    assert [message["role"] for message in best_worst["prompt"]] == ["system", "user"]
    assert best_worst["chosen"][-1]["content"] == "It shipped on Monday."
    assert best_worst["rejected"][-1]["content"] == "I do not know."
    assert best_worst["rejected"][0]["tool_calls"][0]["function"]["arguments"] == {"order": 8}
    assert correction["prompt"][-1]["role"] == "tool"
    assert correction["chosen"] == [{"role": "assistant", "content": "It shipped on Monday; it arrives Thursday."}]
    assert correction["rejected"][0]["content"] == "Soon."
    rendered = maybe_apply_chat_template(best_worst, tokenizer, tools=json.loads(best_worst["tools"]))
    assert rendered["prompt"].endswith("<assistant>")
    assert rendered["chosen"].rstrip().endswith("It shipped on Monday. </assistant>")
    assert '{"order": 8}' in rendered["rejected"]
    assert '{"order": 8}' not in rendered["chosen"]


def test_trl_kto_labels_read_back(tmp_path: Path, tokenizer: Any) -> None:
    from trl.data_utils import maybe_apply_chat_template

    out = io.BytesIO()
    counts = trl.kto_write(sample_groups(), out, threshold=0.5)
    dataset = load_jsonl(tmp_path, out.getvalue())
    # t1 (1.0 ≥ 0.5) true, t2 false, t3 unrewarded skipped; t4 gives its correction true and its answer false.
    assert dataset["label"] == [True, False, True, False]
    assert (counts.lines, counts.rollouts, counts.skipped) == (4, 3, 1)
    assert dataset[2]["completion"] == [{"role": "assistant", "content": "It shipped on Monday; it arrives Thursday."}]
    rendered: dict[str, Any] = maybe_apply_chat_template(dataset[0], tokenizer, tools=json.loads(dataset[0]["tools"]))
    assert rendered["label"] is True
    assert rendered["completion"].rstrip().endswith("It shipped on Monday. </assistant>")


@pytest.mark.parametrize("name", ["trl_sft", "trl_dpo", "trl_kto"])
def test_trl_rows_of_held_out_tasks_say_so_and_are_not_trained_on(tmp_path: Path, name: str) -> None:
    """Before, a TRL row had no split: the validation tasks of a curation were in the file as training rows,
    and Keel's own worker (and anyone loading the file with TRL) trained on them."""
    from trainer_bridge import training

    out = io.BytesIO()
    format_get(name).write(sample_groups(), out, threshold=0.5)
    # item:1 is a train group; item:2 (t4, corrected) a validation one.
    splits = [row["split"] for row in lines(out)]
    expected = {"trl_sft": ["train", "validation"], "trl_dpo": ["train", "validation"]}
    assert splits == expected.get(name, ["train", "train", "validation", "validation"])
    path = tmp_path / "rows.jsonl"
    path.write_bytes(out.getvalue())
    if name == "trl_sft":
        assert [split for _, split in training.sft_rows_read(path)] == ["train", "validation"]
    if name == "trl_dpo":
        assert [pair.split for pair in training.dpo_pairs_read(path)] == ["train", "validation"]
    dataset = load_jsonl(tmp_path, out.getvalue()).filter(lambda row: row["split"] == "train")
    assert len(dataset) == splits.count("train")


def test_dpo_without_pairs_is_refused_before_anything_is_written() -> None:
    flat = [
        Group(task_id="a", task_text="", rollouts=(trajectory("1", 1.0, "x"), trajectory("2", 1.0, "y"))),
        Group(task_id="b", task_text="", rollouts=(trajectory("3", 0.0, "z"),)),
    ]
    export_format = format_get("trl_dpo")
    out = io.BytesIO()

    def export() -> None:
        # The service's order: check the preview, then write.
        export_format.check(preview(flat))
        export_format.write(flat, out)

    with pytest.raises(FormatCannotRepresent, match="DPO needs pairs"):
        export()
    assert out.getvalue() == b""
    # The writer agrees: the same groups give no line.
    assert trl.dpo_write(flat, out).lines == 0


def test_sft_kto_and_openai_checks() -> None:
    low = preview([Group(task_id="a", task_text="", rollouts=(trajectory("1", 0.4, "x"),))])
    with pytest.raises(FormatCannotRepresent, match=r"best reward is 0\.4"):
        trl.sft_check(low, threshold=0.5)
    with pytest.raises(FormatCannotRepresent, match=r"best reward is 0\.4"):
        openai_ft.check(low, threshold=0.5)
    trl.sft_check(low, threshold=0.4)
    trl.kto_check(low)
    with pytest.raises(FormatCannotRepresent, match="KTO"):
        trl.kto_check(preview([Group(task_id="a", task_text="", rollouts=(trajectory("1", None, "x"),))]))
    with pytest.raises(FormatCannotRepresent, match="NeMo Gym"):
        gym.check(preview([]))


# --- OpenAI ---------------------------------------------------------------------------------------------


def test_openai_examples() -> None:
    out = io.BytesIO()
    counts = openai_ft.write(sample_groups(), out, threshold=1.0)
    assert (counts.lines, counts.rollouts, counts.skipped) == (2, 2, 2)
    rewarded, corrected = lines(out)
    assert set(rewarded) == {"messages", "tools"}  # one call per turn: no parallel_tool_calls
    for example in (rewarded, corrected):
        for message in example["messages"]:
            MESSAGE.validate_python(message)
        for tool in example["tools"]:
            TOOL.validate_python(tool)
    call = rewarded["messages"][2]["tool_calls"][0]
    assert call == {
        "id": "t1-c1",
        "type": "function",
        "function": {"name": "order_lookup", "arguments": '{"order": 7}'},
    }
    assert all("weight" not in message for message in rewarded["messages"])
    assistants = [message for message in corrected["messages"] if message["role"] == "assistant"]
    assert [message.get("weight") for message in assistants] == [0, None]
    assert assistants[-1]["content"] == "It shipped on Monday; it arrives Thursday."


def test_openai_parallel_calls_and_missing_ids() -> None:
    rollout = Rollout(
        trace_id="p",
        reward=1.0,
        messages=(
            {"role": "user", "content": "two orders"},
            {
                "role": "assistant",
                "tool_calls": [
                    {"function": {"name": "order_lookup", "arguments": {"order": 1}}},
                    {"function": {"name": "order_lookup", "arguments": {"order": 2}}},
                ],
            },
            {"role": "tool", "content": "one"},
            {"role": "tool", "content": "two"},
            {"role": "assistant", "content": "both shipped"},
        ),
    )
    out = io.BytesIO()
    openai_ft.write([Group(task_id="p", task_text="", rollouts=(rollout,))], out)
    (example,) = lines(out)
    assert example["parallel_tool_calls"] is True
    assert "tools" not in example
    calls = example["messages"][1]["tool_calls"]
    assert [call["id"] for call in calls] == ["call_1_0", "call_1_1"]
    assert [call["function"]["arguments"] for call in calls] == ['{"order": 1}', '{"order": 2}']
    assert [message["tool_call_id"] for message in example["messages"][2:4]] == ["call_1_0", "call_1_1"]


# --- NeMo Gym -------------------------------------------------------------------------------------------


def test_gym_rollouts_read_back_with_evals_gym() -> None:
    out = io.BytesIO()
    counts = gym.write(sample_groups(), out)
    assert (counts.lines, counts.groups, counts.rollouts, counts.skipped) == (4, 2, 4, 0)
    raw = lines(out)
    assert [(row["_ng_task_index"], row["_ng_rollout_index"], row["reward"]) for row in raw] == [
        (0, 0, 1.0),
        (0, 1, 0.0),
        (0, 2, None),
        (1, 0, 0.5),
    ]
    assert raw[0]["responses_create_params"]["input"][-1] == {"role": "user", "content": "Where is order 7?"}
    assert [item["type"] for item in raw[0]["response"]["output"]] == [
        "function_call",
        "function_call_output",
        "message",
    ]
    read = evals_gym.rollouts_read(out.getvalue())
    assert [rollout.output_text for rollout in read] == [
        "It shipped on Monday.",
        "I do not know.",
        "Unscored.",
        "Soon.",
    ]
    assert read[1].tool_calls == [{"name": "order_lookup", "arguments": {"order": 8}}]
    assert read[3].metadata["split"] == "validation"
    assert read[3].metadata["correction"].startswith("It shipped")
    assert read[0].metadata["trace_id"] == "t1"


# --- Streaming, manifest, registry ----------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_writers_draw_one_group_at_a_time(name: str) -> None:
    drawn: list[int] = []
    written_before: list[int] = []
    out = io.BytesIO()

    def source() -> Iterator[Group]:
        for index in range(3):
            written_before.append(len(out.getvalue()))
            drawn.append(index)
            yield Group(
                task_id=f"t{index}",
                task_text="",
                rollouts=(
                    trajectory(f"{index}a", 1.0, "right", correction="right indeed"),
                    trajectory(f"{index}b", 0.0, "wrong"),
                ),
            )

    FORMATS[name].write(source(), out, threshold=1.0)
    assert drawn == [0, 1, 2]
    # Each group was written before the next was drawn.
    assert written_before[0] == 0
    assert 0 < written_before[1] < written_before[2] < len(out.getvalue())


def test_export_write_manifest_checksum_matches_the_bytes(tmp_path: Path) -> None:
    path = tmp_path / "export.jsonl"
    created = datetime(2026, 9, 1, 12, 0, tzinfo=UTC)
    with path.open("wb") as out:
        manifest = export_write(
            sample_groups(), out, format_name="art", curation={"min_group_size": 2}, created_at=created
        )
    data = path.read_bytes()
    assert manifest.sha256 == hashlib.sha256(data).hexdigest()
    assert manifest.size == len(data) > 0
    assert (manifest.format, manifest.counts.lines, manifest.keel_version) == ("art", 2, keel_version())
    described = json.loads(manifest.as_json())
    assert described["created_at"] == "2026-09-01T12:00:00+00:00"
    assert described["counts"] == {"lines": 2, "groups": 2, "rollouts": 3, "skipped": 1}
    assert described["curation"] == {"min_group_size": 2}


def test_hashing_writer_forwards_and_hashes() -> None:
    out = io.BytesIO()
    sink = HashingWriter(out)
    sink.write(b"abc")
    sink.write(memoryview(b"def"))
    assert out.getvalue() == b"abcdef"
    assert (sink.sha256, sink.size) == (hashlib.sha256(b"abcdef").hexdigest(), 6)


def test_keel_version_is_the_installed_distribution() -> None:
    from importlib.metadata import version

    assert keel_version() == version("keel")


def test_format_get_unknown() -> None:
    with pytest.raises(UnknownFormat, match="known: art"):
        format_get("parquet")
