"""NeMo Gym rollouts, a pure module: a written file reads back equal, a plain Gym file groups its tasks by
input, the report's pass@k is the unbiased estimator per task, tool calls travel as function_call items,
a bad file names every line and field and returns nothing, and the writer streams."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import pytest

from evals import gym
from evals.gym import (
    Rollout,
    RolloutsInvalid,
    output_items_build,
    rollout_passed,
    rollouts_lines,
    rollouts_read,
    rollouts_report,
    rollouts_write,
)
from evals.metrics import ItemResult, pass_at_k, run_report


def question(text: str) -> list[dict[str, object]]:
    return [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": text}]


def written(rollouts: list[Rollout]) -> bytes:
    out = io.BytesIO()
    rollouts_write(rollouts, out)
    return out.getvalue()


def table(passes: dict[int, list[bool]]) -> list[Rollout]:
    """Rollouts with binary rewards: task index -> whether each sample passed."""
    return [
        Rollout(
            task_index=task,
            sample=sample,
            input=question(f"q{task}"),
            output_text="a",
            reward=float(passed),
            passed=passed,
        )
        for task, outcomes in passes.items()
        for sample, passed in enumerate(outcomes)
    ]


# --- Writing and reading back ------------------------------------------------------------------------------


def test_a_written_run_reads_back_equal() -> None:
    rollouts = [
        Rollout(
            task_index=0,
            sample=0,
            input=question("2 + 2?"),
            output_text="4",
            reward=1.0,
            passed=True,
            metadata={"tags": {"language": "en"}, "trace_id": "ab" * 16, "scores": {"exact": 1.0}},
        ),
        Rollout(task_index=0, sample=1, input=question("2 + 2?"), output_text="5", reward=0.0, passed=False),
        Rollout(task_index=1, sample=0, input="Say hi", output_text="hi ✓", reward=0.5, passed=None),
        Rollout(task_index=1, sample=1, input="Say hi", output_text="", reward=None, metadata={"error": "timeout"}),
    ]

    content = written(rollouts)
    read = rollouts_read(content, threshold=2.0)  # a threshold no reward reaches: `passed` comes from the file

    assert read[:2] == rollouts[:2]
    assert read[3] == rollouts[3]
    # Not stated in the file: the threshold decides.
    assert read[2] == Rollout(task_index=1, sample=0, input="Say hi", output_text="hi ✓", reward=0.5, passed=False)
    assert rollouts_read(content, threshold=0.5)[2].passed is True


def test_each_line_has_nemo_gyms_shape_and_keels_fields_under_one_key() -> None:
    rollout = Rollout(task_index=3, sample=2, input=question("x"), output_text="y", reward=1.0, passed=True)

    (line,) = list(rollouts_lines([rollout]))

    assert line.endswith(b"\n")
    assert json.loads(line) == {
        "responses_create_params": {"input": question("x")},
        "response": {
            "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "y"}]}]
        },
        "reward": 1.0,
        "_ng_task_index": 3,
        "_ng_rollout_index": 2,
        "keel": {"task_index": 3, "sample": 2, "passed": True, "metadata": {}},
    }


def test_an_errored_rollout_is_written_with_a_null_reward_not_a_zero() -> None:
    line = json.loads(written([Rollout(task_index=0, sample=0, input="q", reward=None)]))

    assert line["reward"] is None
    assert rollouts_read(json.dumps(line).encode())[0].errored


def test_a_text_stream_gets_the_same_lines() -> None:
    rollouts = table({0: [True, False]})
    out = io.StringIO()

    count = rollouts_write(rollouts, out)

    assert count == 2
    assert out.getvalue().encode("utf-8") == written(rollouts)


def test_the_writer_draws_one_rollout_at_a_time() -> None:
    drawn: list[int] = []

    class Recorder(io.BytesIO):
        """Notes how many rollouts had been drawn when each line arrived."""

        def __init__(self) -> None:
            super().__init__()
            self.drawn_at_write: list[int] = []

        def write(self, data: object) -> int:
            self.drawn_at_write.append(len(drawn))
            return super().write(data)  # type: ignore[arg-type]

    def rollouts() -> Iterator[Rollout]:
        for index in range(5):
            drawn.append(index)
            yield Rollout(task_index=index, sample=0, input="q", output_text="a", reward=1.0)

    out = Recorder()
    assert rollouts_write(rollouts(), out) == 5

    # Line i is written right after rollout i is drawn, before the next one is asked for.
    assert out.drawn_at_write == [1, 2, 3, 4, 5]
    assert len(rollouts_read(out.getvalue())) == 5


def test_rollouts_lines_is_lazy() -> None:
    def long_run() -> Iterator[Rollout]:
        for sample in range(1000):
            yield Rollout(task_index=0, sample=sample, input="q", output_text="a", reward=1.0)
        raise AssertionError("the whole run was drawn for three lines")

    lines = rollouts_lines(long_run())

    assert [json.loads(next(lines))["keel"]["sample"] for _ in range(3)] == [0, 1, 2]


def test_reading_accepts_chunks_that_split_lines_anywhere() -> None:
    rollouts = table({0: [True, False], 1: [True]})
    content = written(rollouts)

    chunks = [content[index : index + 7] for index in range(0, len(content), 7)]

    assert rollouts_read(iter(chunks)) == rollouts


# --- Tool calls ----------------------------------------------------------------------------------------


def test_tool_calls_are_written_as_function_call_items_and_read_back() -> None:
    items = output_items_build(
        "Refunding now.", [{"name": "refund", "arguments": {"ride_id": "r1", "amount": 12.5}, "id": "call_a"}]
    )
    rollout = Rollout(task_index=0, sample=0, input=question("refund"), output_items=items, reward=1.0, passed=True)

    line = json.loads(written([rollout]))
    read = rollouts_read(written([rollout]))[0]

    assert line["response"]["output"][1] == {
        "type": "function_call",
        "call_id": "call_a",
        "name": "refund",
        "arguments": '{"amount": 12.5, "ride_id": "r1"}',
    }
    assert read == rollout
    assert read.output_text == "Refunding now."
    assert read.tool_calls == [{"name": "refund", "arguments": {"amount": 12.5, "ride_id": "r1"}}]


def test_output_text_must_agree_with_the_output_items() -> None:
    with pytest.raises(ValueError, match="output_text"):
        Rollout(task_index=0, sample=0, input="q", output_text="other", output_items=output_items_build("text"))


# --- Plain NeMo Gym files ------------------------------------------------------------------------------


def gym_line(text: str, answer: str, reward: object, **extra: object) -> str:
    return json.dumps(
        {
            "responses_create_params": {"input": [{"role": "user", "content": text}], "temperature": 1.0},
            "response": {
                "id": "resp_1",
                "output": [
                    {"type": "reasoning", "summary": []},
                    {
                        "type": "message",
                        "role": "assistant",
                        "status": "completed",
                        "content": [{"type": "output_text", "text": answer, "annotations": []}],
                    },
                ],
                "usage": {"input_tokens": 10, "output_tokens": 2},
            },
            "reward": reward,
            **extra,
        }
    )


def test_a_plain_gym_file_groups_tasks_by_identical_input() -> None:
    content = "\n".join(
        [
            gym_line("capital of France?", "Paris", 1.0, accuracy=1.0),
            gym_line("2 + 2?", "5", False),
            "",
            gym_line("capital of France?", "Lyon", 0.0, accuracy=0.0),
            gym_line("2 + 2?", "4", True),
            gym_line("capital of France?", "Paris", 1),
        ]
    ).encode()

    read = rollouts_read(content)

    assert [(rollout.task_index, rollout.sample) for rollout in read] == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2)]
    assert [rollout.reward for rollout in read] == [1.0, 0.0, 0.0, 1.0, 1.0]
    assert [rollout.passed for rollout in read] == [True, False, False, True, True]
    assert [rollout.output_text for rollout in read] == ["Paris", "5", "Lyon", "4", "Paris"]
    assert read[0].input == [{"role": "user", "content": "capital of France?"}]
    assert read[0].metadata == {"accuracy": 1.0}


def test_a_plain_gym_file_names_tasks_by_its_task_fields_when_present() -> None:
    content = "\n".join(
        [
            gym_line("same prompt", "a", 1.0, task_id="t-9"),
            gym_line("same prompt", "b", 0.0, task_id="t-4"),
            gym_line("other prompt", "c", 1.0, task_id="t-9"),
        ]
    ).encode()

    read = rollouts_read(content)

    assert [(rollout.task_index, rollout.sample) for rollout in read] == [(0, 0), (1, 0), (0, 1)]
    assert read[1].metadata == {"task_id": "t-4"}


def test_a_plain_file_may_give_its_output_as_a_string() -> None:
    content = json.dumps({"responses_create_params": {"input": "hi"}, "response": "hello", "reward": 0.25})

    (read,) = rollouts_read(content.encode(), threshold=0.2)

    assert (read.input, read.output_text, read.reward, read.passed) == ("hi", "hello", 0.25, True)


# --- Bad files -----------------------------------------------------------------------------------------


def test_bad_lines_name_their_line_and_field_and_nothing_is_returned() -> None:
    good = gym_line("q", "a", 1.0)
    content = "\n".join(
        [
            good,
            gym_line("q", "a", "high"),
            "{not json",
            "",
            json.dumps({"responses_create_params": {"input": 3}, "response": {"output": []}, "reward": 1}),
            json.dumps({"responses_create_params": {"input": "q"}, "response": {"output": []}}),
            gym_line("q", "a", None),
            "[1, 2]",
            good,
        ]
    ).encode()

    with pytest.raises(RolloutsInvalid) as caught:
        rollouts_read(content)

    assert [(problem.line, problem.field) for problem in caught.value.problems] == [
        (2, "reward"),
        (3, "rollout"),
        (5, "responses_create_params.input"),
        (6, "reward"),
        (7, "reward"),
        (8, "rollout"),
    ]
    assert caught.value.problems[0].message == "must be a finite number"
    assert caught.value.problems[3].message == "is required"


def test_keel_fields_are_checked_and_a_repeated_sample_is_refused() -> None:
    lines = [json.loads(line) for line in written(table({0: [True, True]})).splitlines()]
    lines[1]["keel"]["sample"] = 0
    repeated = "\n".join(json.dumps(line) for line in lines).encode()
    lines[1]["keel"] = {"task_index": -1, "sample": 1, "passed": "yes", "metadata": []}
    malformed = "\n".join(json.dumps(line) for line in lines).encode()

    with pytest.raises(RolloutsInvalid) as caught_repeated:
        rollouts_read(repeated)
    with pytest.raises(RolloutsInvalid) as caught_malformed:
        rollouts_read(malformed)

    assert [(problem.line, problem.field) for problem in caught_repeated.value.problems] == [(2, "keel.sample")]
    assert [(problem.line, problem.field) for problem in caught_malformed.value.problems] == [
        (2, "keel.task_index"),
        (2, "keel.passed"),
        (2, "keel.metadata"),
    ]


def test_a_file_mixing_keel_and_plain_rollouts_is_refused() -> None:
    content = written(table({0: [True]})) + gym_line("q", "a", 1.0).encode()

    with pytest.raises(RolloutsInvalid) as caught:
        rollouts_read(content)

    assert [(problem.line, problem.field) for problem in caught.value.problems] == [(2, "keel")]


def test_an_empty_file_and_a_file_over_the_limit_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(RolloutsInvalid) as caught_empty:
        rollouts_read(b"\n \n")
    monkeypatch.setattr(gym, "MAX_ROLLOUTS", 2)
    with pytest.raises(RolloutsInvalid) as caught_large:
        rollouts_read(written(table({0: [True, True, True]})))

    assert [(problem.line, problem.field) for problem in caught_empty.value.problems] == [(1, "file")]
    assert [(problem.line, problem.field) for problem in caught_large.value.problems] == [(3, "file")]
    assert rollouts_read(written(table({0: [True, True]})))  # at the limit is fine


def test_invalid_utf8_names_its_line() -> None:
    content = gym_line("q", "a", 1.0).encode() + b"\n\xff\xfe\n"

    with pytest.raises(RolloutsInvalid) as caught:
        rollouts_read(content)

    assert [(problem.line, problem.field) for problem in caught.value.problems] == [(2, "rollout")]


# --- The report ----------------------------------------------------------------------------------------


def test_the_report_gives_the_unbiased_pass_at_k_per_task() -> None:
    # Task 0: n=4, c=1. Task 1: n=4, c=0. Task 2: n=4, c=4.
    rollouts = table({0: [False, True, False, False], 1: [False] * 4, 2: [True] * 4})

    report = rollouts_report(rollouts, ks=(1, 2, 4))

    assert pass_at_k(4, 1, 1) == 0.25
    assert pass_at_k(4, 1, 4) == 1.0
    assert report.items[0].pass_at_k == {1: 0.25, 2: pass_at_k(4, 1, 2), 4: 1.0}
    assert report.items[0].pass_at_k[2] == pytest.approx(0.5)
    assert report.pass_at_k == {
        1: pytest.approx((0.25 + 0.0 + 1.0) / 3),
        2: pytest.approx((0.5 + 0.0 + 1.0) / 3),
        4: pytest.approx((1.0 + 0.0 + 1.0) / 3),
    }


def test_an_exported_then_imported_run_reports_the_same_figures() -> None:
    rewards: list[list[float | None]] = [[0.9, 0.2, None], [0.7, 0.71, 0.1], [0.0, 0.0, 0.3], [1.0, None, 0.5]]
    rollouts = [
        Rollout(
            task_index=task,
            sample=sample,
            input=question(f"q{task}"),
            output_text="a",
            reward=reward,
            passed=None if reward is None else reward >= 0.7,
            metadata={"tags": {"language": "en" if task % 2 else "de"}},
        )
        for task, task_rewards in enumerate(rewards)
        for sample, reward in enumerate(task_rewards)
    ]
    direct = run_report(
        [
            ItemResult.from_pairs(
                str(task),
                [(rollout.reward, rollout_passed(rollout)) for rollout in rollouts if rollout.task_index == task],
                {"language": "en" if task % 2 else "de"},
            )
            for task in range(4)
        ],
        (1, 2, 3),
    )

    imported = rollouts_report(rollouts_read(written(rollouts)), ks=(1, 2, 3))

    assert imported.to_json() == direct.to_json()
    assert imported.subgroups["language"].group("de") is not None
    assert imported.overall.errored_samples == 2


def test_the_threshold_decides_pass_when_the_file_does_not_say() -> None:
    content = "\n".join(gym_line("q", "a", reward) for reward in (0.2, 0.6, 0.9)).encode()
    rollouts = rollouts_read(content, threshold=0.5)
    unstated = [
        Rollout(task_index=0, sample=index, input="q", output_text="a", reward=reward)
        for index, reward in enumerate((0.2, 0.6, 0.9))
    ]

    assert [rollout.passed for rollout in rollouts] == [False, True, True]
    assert rollouts_report(rollouts).overall.pass_rate == pytest.approx(2 / 3)
    assert rollouts_report(unstated).overall.pass_rate == 0.0
    assert rollouts_report(unstated, threshold=0.5).overall.pass_rate == pytest.approx(2 / 3)


def test_a_plain_files_task_field_can_be_the_subgroup() -> None:
    content = "\n".join(
        [
            gym_line("a", "x", 1.0, category="math"),
            gym_line("b", "x", 0.0, category="code"),
            gym_line("b", "x", 0.0, category="code"),
        ]
    ).encode()

    report = rollouts_report(rollouts_read(content), subgroup_key="category")

    assert [group.name for group in report.subgroups["category"].groups] == ["code", "math"]
    assert report.worst_group is not None
    assert (report.worst_group.name, report.worst_group.value) == ("code", 0.0)
