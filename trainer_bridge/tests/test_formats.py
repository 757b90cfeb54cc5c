"""trainer_bridge.formats: each writer read back as JSON and by its consumer's own structures, the refusals
before writing, laziness and the manifest's checksum. Pure: no database, nothing downloaded."""

from __future__ import annotations

import base64
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


def prompted(
    trace_id: str, reward: float, answer: str, *, version: str = "orders@1", request: str = "Where is order 7?"
) -> Rollout:
    return Rollout(
        trace_id=trace_id,
        messages=(
            {"role": "system", "content": f"You help with orders ({version})."},
            {"role": "user", "content": request},
            {"role": "assistant", "content": answer},
        ),
        reward=reward,
        metadata={"prompt_versions": [version]},
    )


def test_dpo_pairs_only_rollouts_of_one_prompt(tmp_path: Path) -> None:
    """Before, a group's best and worst rollouts were paired whatever prompt each ran under: the row's prompt
    was the best one's, and the rejected answer had answered another system prompt or another order."""
    groups = [
        # One task asked under two prompt versions: nothing to pair.
        Group(
            task_id="task:a",
            task_text="Where is order 7?",
            rollouts=(prompted("a1", 1.0, "Monday."), prompted("a2", 0.0, "No idea.", version="orders@2")),
        ),
        # Two order numbers are one task (request_normalise), not one prompt: only the 12345s pair.
        Group(
            task_id="request:where is order #",
            task_text="Where is order 12345?",
            rollouts=(
                prompted("b1", 1.0, "Monday.", request="Where is order 12345?"),
                prompted("b2", 0.5, "Soon.", request="Where is order 98765?"),
                prompted("b3", 0.0, "No idea.", request="Where is order 12345?"),
            ),
        ),
    ]
    summary = preview(groups)
    assert (summary.pairable_groups, summary.unpaired_by_prompt) == (1, 3)

    out = io.BytesIO()
    counts = trl.dpo_write(groups, out)
    (row,) = lines(out)
    assert row["prompt"] == [
        {"role": "system", "content": "You help with orders (orders@1)."},
        {"role": "user", "content": "Where is order 12345?"},
    ]
    assert (row["chosen"][0]["content"], row["rejected"][0]["content"]) == ("Monday.", "No idea.")
    assert (counts.lines, counts.groups, counts.rollouts, counts.skipped, counts.unpaired_by_prompt) == (1, 1, 2, 3, 3)

    path = tmp_path / "pairs.jsonl"
    with path.open("wb") as sink:
        manifest = export_write(groups, sink, format_name="trl_dpo", curation={}, created_at=datetime.now(UTC))
    described = json.loads(manifest.as_json())
    assert described["counts"]["unpaired_by_prompt"] == 3
    assert described["notes"] == [
        "3 rewarded rollouts were left unpaired: in their group, every rollout rewarded differently ran under "
        "another prompt (prompt version, system prompt or user input), and a preference pair needs one prompt"
    ]


def test_the_group_relative_formats_are_art_and_nemo_gym() -> None:
    assert {name for name, export_format in FORMATS.items() if export_format.group_relative} == {"art", "nemo_gym"}


def _two_prompt_task() -> list[Group]:
    """One task asked under orders@1 (twice) and orders@2 (twice, one with another order number)."""
    return [
        Group(
            task_id="task:a",
            task_text="Where is order 7?",
            rollouts=(
                prompted("a1", 1.0, "Monday."),
                prompted("a2", 0.0, "No idea.", version="orders@2"),
                prompted("a3", 0.0, "Later."),
                prompted("a4", 1.0, "Tuesday.", version="orders@2", request="Where is order 8?"),
            ),
        )
    ]


def test_art_groups_hold_the_rollouts_of_one_prompt(tmp_path: Path) -> None:
    """Before, ART's group held both versions' rollouts: each trajectory's advantage was its reward against the mean
    of the two prompts' rewards."""
    path = tmp_path / "groups.jsonl"
    with path.open("wb") as sink:
        manifest = export_write(_two_prompt_task(), sink, format_name="art", curation={}, created_at=datetime.now(UTC))
    written = [json.loads(line) for line in path.read_bytes().splitlines()]

    assert [[t["metadata"]["trace_id"] for t in line["trajectories"]] for line in written] == [
        ["a1", "a3"],
        ["a2"],
        ["a4"],
    ]
    for line in written:
        prompts = {json.dumps(t["messages_and_choices"][:2]) for t in line["trajectories"]}
        assert len(prompts) == 1
        assert line["metadata"]["task_id"] == "task:a"
    assert [line["metadata"]["task_text"] for line in written] == ["Where is order 7?"] * 2 + ["Where is order 8?"]
    assert (manifest.counts.groups, manifest.counts.rollouts, manifest.counts.tasks_separated_by_prompt) == (3, 4, 1)
    (note,) = manifest.notes
    assert note.startswith("1 tasks were asked under more than one prompt")


def test_gym_tasks_hold_the_rollouts_of_one_prompt() -> None:
    out = io.BytesIO()
    counts = gym.write(_two_prompt_task(), out)
    read = evals_gym.rollouts_read(out.getvalue())

    by_task: dict[int, list[str]] = {}
    for item in read:
        by_task.setdefault(item.task_index, []).append(item.metadata["trace_id"])
    assert by_task == {0: ["a1", "a3"], 1: ["a2"], 2: ["a4"]}
    assert {item.metadata["task_id"] for item in read} == {"task:a"}
    assert (counts.groups, counts.tasks_separated_by_prompt) == (3, 1)


@pytest.mark.parametrize("name", ["trl_dpo", "trl_sft", "trl_kto", "openai"])
def test_the_other_formats_keep_the_task_group(name: str) -> None:
    counts = FORMATS[name].write(_two_prompt_task(), io.BytesIO(), threshold=1.0)
    assert counts.tasks_separated_by_prompt == 0
    assert counts.groups <= 1


def test_dpo_of_prompts_that_never_agree_is_refused() -> None:
    mixed = [
        Group(task_id="a", task_text="", rollouts=(prompted("1", 1.0, "x"), prompted("2", 0.0, "y", version="v2")))
    ]
    with pytest.raises(FormatCannotRepresent, match="DPO needs pairs"):
        trl.dpo_check(preview(mixed))
    assert trl.dpo_write(mixed, io.BytesIO()).lines == 0


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


# --- Images ---------------------------------------------------------------------------------------------

# A 1x1 PNG, as an agent sends a screenshot.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
PNG_URL = "data:image/png;base64," + base64.b64encode(PNG).decode("ascii")
REMOTE_URL = "https://images.example.test/receipt.png"


def image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def looking(trace_id: str, reward: float, answer: str, *, extra: tuple[dict[str, Any], ...] = ()) -> Rollout:
    return Rollout(
        trace_id=trace_id,
        messages=(
            {"role": "system", "content": "You read receipts."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is the total on these?"},
                    image_part(PNG_URL),
                    image_part(REMOTE_URL),
                    *extra,
                ],
            },
            {"role": "assistant", "content": answer},
        ),
        reward=reward,
    )


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the export reached for the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_trl_sft_rows_carry_images_as_trl_vision_rows(tmp_path: Path, no_network: None) -> None:
    """Before, the image parts were dropped and only the text was written."""
    from trl.data_utils import prepare_multimodal_messages

    bad = (
        image_part("data:image/png;base64,not base64!"),
        image_part("data:text/plain;base64," + base64.b64encode(b"hello").decode()),
        image_part("file:///home/agent/shot.png"),
    )
    groups = [Group(task_id="r", task_text="", rollouts=(looking("r1", 1.0, "12 euros.", extra=bad),))]
    out = io.BytesIO()
    counts = trl.sft_write(groups, out)
    (row,) = lines(out)

    assert row["messages"] == [
        {"role": "system", "content": [{"type": "text", "text": "You read receipts."}]},
        {
            "role": "user",
            "content": [{"type": "text", "text": "What is the total on these?"}, {"type": "image"}, {"type": "image"}],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "12 euros."}]},
    ]
    decoded, remote = row["images"]
    assert remote == REMOTE_URL  # kept, not fetched
    header, _, payload = decoded.partition(",")
    assert header == "data:image/png;base64"
    assert base64.b64decode(payload) == PNG
    assert (counts.images, counts.image_urls, counts.images_dropped) == (1, 1, 3)
    # TRL's collator fills the placeholders with the column's images, one for one.
    filled = prepare_multimodal_messages(row["messages"], images=row["images"])
    assert [part.get("image") for part in filled[1]["content"]] == [None, decoded, REMOTE_URL]
    dataset = load_jsonl(tmp_path, out.getvalue())
    assert dataset[0]["images"] == [decoded, REMOTE_URL]

    path = tmp_path / "export.jsonl"
    with path.open("wb") as sink:
        manifest = export_write(groups, sink, format_name="trl_sft", curation={}, created_at=datetime.now(UTC))
    assert manifest.notes == (
        "1 images from data: URLs were decoded, checked and written in the rows",
        "1 images are http(s) URLs, kept as URLs and not downloaded: whoever loads the rows fetches them "
        "(transformers' image processors do when TRL trains)",
        "3 image parts were left out: not an image data: URL or an http(s) URL, or in a completion, where TRL "
        "takes no image",
    )


def test_trl_rows_without_images_keep_text_contents(tmp_path: Path) -> None:
    out = io.BytesIO()
    trl.sft_write(sample_groups(), out)
    for row in lines(out):
        assert "images" not in row
        assert all(isinstance(message["content"], str) for message in row["messages"])


def test_trl_dpo_and_kto_take_images_in_the_prompt_only(no_network: None) -> None:
    from trl.data_utils import prepare_multimodal_messages

    answer_with_image = Rollout(
        trace_id="k2",
        messages=(
            *looking("k2", 0.0, "").messages[:2],
            {"role": "assistant", "content": [{"type": "text", "text": "Like this?"}, image_part(PNG_URL)]},
        ),
        reward=0.0,
    )
    groups = [Group(task_id="r", task_text="", rollouts=(looking("k1", 1.0, "12 euros."), answer_with_image))]
    out = io.BytesIO()
    counts = trl.dpo_write(groups, out)
    (row,) = lines(out)
    assert row["images"] == [PNG_URL, REMOTE_URL]
    assert row["rejected"] == [{"role": "assistant", "content": [{"type": "text", "text": "Like this?"}]}]
    assert (counts.images, counts.image_urls, counts.images_dropped) == (1, 1, 1)
    # As TRL's DPO collator prepares a row: images into the prompt, none into the completions.
    prepare_multimodal_messages(row["prompt"], images=row["images"])
    prepare_multimodal_messages(row["rejected"])

    out = io.BytesIO()
    trl.kto_write(groups, out, threshold=0.5)
    rows = lines(out)
    assert [row["images"] for row in rows] == [[PNG_URL, REMOTE_URL]] * 2
    assert [row["label"] for row in rows] == [True, False]
    assert rows[1]["completion"][0]["content"] == [{"type": "text", "text": "Like this?"}]


def test_openai_examples_keep_image_parts() -> None:
    groups = [Group(task_id="r", task_text="", rollouts=(looking("o1", 1.0, "12 euros."),))]
    out = io.BytesIO()
    openai_ft.write(groups, out)
    (example,) = lines(out)
    user = example["messages"][1]
    MESSAGE.validate_python(user)
    assert user["content"][1:] == [image_part(PNG_URL), image_part(REMOTE_URL)]


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
    assert described["counts"] == {
        "lines": 2,
        "groups": 2,
        "rollouts": 3,
        "skipped": 1,
        "unpaired_by_prompt": 0,
        "tasks_separated_by_prompt": 0,
        "images": 0,
        "image_urls": 0,
        "images_dropped": 0,
    }
    assert described["notes"] == []
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
