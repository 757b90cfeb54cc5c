"""trainer_bridge.groups: task keys, grouping, the RL filters, the preview. Pure: no database."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from trainer_bridge import groups as g
from trainer_bridge.groups import FilterError, Filters, Group, Rollout


def rollout(
    trace_id: str,
    reward: float | None = None,
    *,
    request: str = "Where is my order?",
    answer: str = "It ships tomorrow.",
    calls: tuple[tuple[str, dict[str, Any]], ...] = (),
    **extra: object,
) -> Rollout:
    messages: list[dict[str, object]] = [{"role": "user", "content": request}]
    for number, (name, arguments) in enumerate(calls):
        call_id = f"{trace_id}-{number}"
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": f"result of {name}"})
    messages.append({"role": "assistant", "content": answer})
    return Rollout(trace_id=trace_id, messages=tuple(messages), reward=reward, **extra)  # type: ignore[arg-type]


def group(task_id: str, *rollouts: Rollout, split: g.Split = "train") -> Group:
    return Group(task_id=task_id, task_text="", rollouts=rollouts, split=split)


# --- Task keys and grouping --------------------------------------------------------------------------------


def test_task_key_prefers_dataset_item_then_task_id_then_request() -> None:
    messages = [{"role": "system", "content": "be nice"}, {"role": "user", "content": "Hello  THERE!"}]
    assert g.task_key(dataset_item_id="42", task_id="t-1", messages=messages) == "item:42"
    assert g.task_key(task_id="t-1", messages=messages) == "task:t-1"
    assert g.task_key(messages=messages) == "request:hello there"


@pytest.mark.parametrize(
    ("left", "right"),
    [
        ("Where is order #12345?", "where is   order 98765"),
        ("Refund invoice INV-2024-0042 please", "refund invoice inv-2023-0001, please!"),
        ("What’s the status?", "whats the status"),
    ],
)
def test_request_normalise_merges_the_same_request(left: str, right: str) -> None:
    assert g.request_normalise(left) == g.request_normalise(right)


@pytest.mark.parametrize(
    ("left", "right"),
    [("Book 2 seats", "Book 3 seats"), ("Meet on the 3rd floor", "Meet on the 4th floor"), ("cancel", "confirm")],
)
def test_request_normalise_keeps_quantities_apart(left: str, right: str) -> None:
    assert g.request_normalise(left) != g.request_normalise(right)


def test_request_normalise_of_list_content() -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "Order 55555 late"}]}]
    assert g.task_key(messages=messages) == "request:order # late"


def test_group_rollouts_groups_by_key_in_first_seen_order() -> None:
    rollouts = [
        rollout("a1", 1, request="Where is order 11111?"),
        rollout("b1", 0, request="Cancel my plan"),
        rollout("a2", 0, request="where is order 22222"),
        rollout("c1", 1, request="Cancel my plan", dataset_item_id="7"),
    ]
    grouped = list(g.group_rollouts(rollouts))
    assert [(item.task_id, [r.trace_id for r in item.rollouts]) for item in grouped] == [
        ("request:where is order #", ["a1", "a2"]),
        ("request:cancel my plan", ["b1"]),
        ("item:7", ["c1"]),
    ]
    assert grouped[0].task_text == "Where is order 11111?"
    assert all(item.split == "train" for item in grouped)


def test_group_rollouts_ordered_streams_and_refuses_a_task_seen_again() -> None:
    drawn: list[str] = []

    def source() -> Iterator[Rollout]:
        for trace_id, task in [("a1", "a"), ("a2", "a"), ("b1", "b"), ("a3", "a")]:
            drawn.append(trace_id)
            yield rollout(trace_id, 1, task_id=task)

    stream = g.group_rollouts(source(), ordered=True)
    first = next(stream)
    assert [r.trace_id for r in first.rollouts] == ["a1", "a2"]
    assert drawn == ["a1", "a2", "b1"]  # only one task ahead
    assert [r.trace_id for r in next(stream).rollouts] == ["b1"]
    with pytest.raises(ValueError, match="not ordered by task"):
        next(stream)


def test_rollout_refuses_a_non_finite_reward() -> None:
    with pytest.raises(ValueError, match="finite"):
        Rollout(trace_id="x", messages=(), reward=float("nan"))
    with pytest.raises(ValueError, match="number"):
        Rollout(trace_id="x", messages=(), reward=True)


# --- Filters ------------------------------------------------------------------------------------------------


def test_drop_unrewarded_removes_rollouts_and_emptied_groups() -> None:
    kept = list(g.drop_unrewarded([group("a", rollout("1", 1), rollout("2")), group("b", rollout("3"))]))
    assert [(item.task_id, [r.trace_id for r in item.rollouts]) for item in kept] == [("a", ["1"])]


def test_drop_equal_rewards() -> None:
    groups = [
        group("same", rollout("1", 1), rollout("2", 1.0)),
        group("noise", rollout("3", 0.5), rollout("4", 0.5 + 1e-12)),
        group("varied", rollout("5", 0), rollout("6", 1), rollout("7")),
        group("single", rollout("8", 1)),
        group("unrewarded-only-differs", rollout("9", 1), rollout("10")),
    ]
    assert [item.task_id for item in g.drop_equal_rewards(groups)] == ["varied"]


def test_size_bounds_drops_small_and_keeps_a_spread_of_large_groups() -> None:
    rewards = [0.3, 0.9, 0.1, 0.5, 0.7, 0.2, 0.8, 0.4, 0.6, 0.0]
    big = group("big", *(rollout(str(index), reward) for index, reward in enumerate(rewards)))
    small = group("small", rollout("s", 1))
    (kept,) = g.size_bounds([small, big], minimum=2, maximum=4)
    # Ranking best first: 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0; ranks 0, 3, 6, 9 → 0.9, 0.6, 0.3, 0.0,
    # kept in their original order.
    assert [r.reward for r in kept.rollouts] == [0.3, 0.9, 0.6, 0.0]
    assert [r.trace_id for r in g.reward_spread(big.rollouts, 1)] == ["1"]
    assert g.reward_spread(big.rollouts, 0) == ()


def test_size_bounds_spread_puts_unrewarded_last_and_ties_in_order() -> None:
    rollouts = (rollout("a", None), rollout("b", 1), rollout("c", 1), rollout("d", 0))
    # Ranking: b (1), c (1, after b), d (0), a (unrewarded).
    assert [r.trace_id for r in g.reward_spread(rollouts, 2)] == ["a", "b"]  # ranks 0 and 3
    assert [r.trace_id for r in g.reward_spread(rollouts, 3)] == ["a", "b", "d"]  # ranks 0, 2, 3


def test_dedupe_same_calls_and_answer() -> None:
    calls = (("lookup", {"order": 1}),)
    first = rollout("1", 1, calls=calls, answer="It ships tomorrow.")
    same = rollout("2", 0, calls=calls, answer="it ships   TOMORROW")
    other_args = rollout("3", 0, calls=(("lookup", {"order": 2}),), answer="It ships tomorrow.")
    (kept,) = g.dedupe([group("t", first, same, other_args)], threshold=1.0)
    assert [r.trace_id for r in kept.rollouts] == ["1", "3"]


def test_dedupe_by_shingle_similarity() -> None:
    long = "the parcel left the warehouse in lyon on monday and will reach your address on thursday morning"
    first = rollout("1", 1, answer=long)
    near = rollout("2", 1, answer=long + " afternoon")
    different = rollout("3", 1, answer="we cannot find any parcel under that number, please check it again")
    (kept,) = g.dedupe([group("t", first, near, different)], threshold=0.8)
    assert [r.trace_id for r in kept.rollouts] == ["1", "3"]
    (strict,) = g.dedupe([group("t", first, near, different)], threshold=1.0)
    assert [r.trace_id for r in strict.rollouts] == ["1", "2", "3"]


def test_jaccard_and_shingles() -> None:
    assert g.shingles("a b c d") == frozenset({("a", "b", "c"), ("b", "c", "d")})
    assert g.shingles("a b") == frozenset({("a", "b")})
    assert g.jaccard(frozenset(), frozenset()) == 1.0
    assert g.jaccard(frozenset({1, 2}), frozenset({2, 3})) == pytest.approx(1 / 3)


def test_balance_caps_each_family_by_a_stable_choice() -> None:
    def agent_group(task: str, agent: str) -> Group:
        return group(task, rollout(task, 1, metadata={"agent": agent}))

    groups = [agent_group(f"a{index}", "support") for index in range(6)] + [agent_group("b0", "billing")]
    equalised = g.balance(groups)
    assert len(equalised) == 2
    assert {item.rollouts[0].metadata["agent"] for item in equalised} == {"support", "billing"}
    capped = g.balance(groups, per_family=3)
    assert len(capped) == 4
    assert [item.task_id for item in g.balance(list(reversed(groups)), per_family=3)] == [
        item.task_id for item in reversed(capped)
    ]
    assert g.balance([]) == []


def test_validation_split_is_stable_and_by_task() -> None:
    groups = [group(f"task-{index}", rollout(str(index), 1)) for index in range(400)]
    first = {item.task_id: item.split for item in g.validation_split(groups, share=0.25, seed=3)}
    again = {item.task_id: item.split for item in g.validation_split(reversed(groups), share=0.25, seed=3)}
    assert first == again
    share = sum(split == "validation" for split in first.values()) / len(first)
    assert 0.18 < share < 0.32
    other_seed = {item.task_id: item.split for item in g.validation_split(groups, share=0.25, seed=4)}
    assert other_seed != first
    assert all(item.split == "train" for item in g.validation_split(groups, share=0.0))


def test_filters_from_dict_names_the_bad_field() -> None:
    assert Filters.from_dict({"min_group_size": 4, "max_group_size": 8}).max_group_size == 8
    cases: list[tuple[dict[str, Any], str]] = [
        ({"min_group_size": 0}, "min_group_size"),
        ({"min_group_size": "2"}, "min_group_size"),
        ({"max_group_size": 1, "min_group_size": 2}, "max_group_size"),
        ({"dedupe_threshold": 0}, "dedupe_threshold"),
        ({"validation_share": 1.0}, "validation_share"),
        ({"drop_equal_rewards": "yes"}, "drop_equal_rewards"),
        ({"seed": 1.5}, "seed"),
        ({"colour": "red"}, "colour"),
    ]
    for data, field in cases:
        with pytest.raises(FilterError) as caught:
            Filters.from_dict(data)
        assert caught.value.field == field, data


def test_curate_applies_the_filters_in_order() -> None:
    groups = [
        group("flat", rollout("f1", 1), rollout("f2", 1)),
        group("dupes", rollout("d1", 1, answer="yes"), rollout("d2", 1, answer="yes"), rollout("d3", 0, answer="no")),
        group("wide", *(rollout(f"w{index}", index / 10, answer=f"answer number {index}") for index in range(10))),
    ]
    curated = list(g.curate(groups, Filters(max_group_size=3, min_group_size=2)))
    assert [(item.task_id, [r.trace_id for r in item.rollouts]) for item in curated] == [
        ("dupes", ["d1", "d3"]),
        ("wide", ["w0", "w5", "w9"]),
    ]


# --- Preview ------------------------------------------------------------------------------------------------


def test_preview_figures() -> None:
    groups = [
        group(
            "a",
            rollout("1", 0.0, tokens=100, metadata={"signals": ["execution.loops.retry", "interaction.quit"]}),
            rollout("2", 1.0, tokens=50, metadata={"signals": [{"type": "execution.loops.retry"}]}),
        ),
        group("b", rollout("3", 0.5, tokens=10, correction="Fixed."), rollout("4", 0.5), split="validation"),
        group("c", rollout("5", None, tokens=1, metadata={"signals": {"interaction.quit": 2, "x": 0}})),
    ]
    summary = g.preview(groups)
    assert (summary.groups, summary.rollouts, summary.rewarded, summary.unrewarded) == (3, 5, 4, 1)
    assert summary.corrections == 1
    assert summary.pairable_groups == 2  # a: distinct rewards; b: a correction
    assert summary.splits == {"train": 2, "validation": 1}
    assert summary.group_sizes == {1: 1, 2: 2}
    assert summary.tokens == 161
    assert summary.signals == {"execution.loops.retry": 2, "interaction.quit": 2}
    rewards = summary.rewards
    assert (rewards.count, rewards.min, rewards.max, rewards.mean) == (4, 0.0, 1.0, 0.5)
    assert rewards.std == pytest.approx(0.125**0.5)  # population: sqrt((0.25 + 0.25 + 0 + 0) / 4)
    assert rewards.quantiles == {"p10": 0.0, "p25": 0.0, "p50": 0.5, "p75": 0.5, "p90": 1.0}
    assert summary.as_dict()["group_sizes"] == {"1": 1, "2": 2}


def test_preview_of_nothing() -> None:
    summary = g.preview([])
    assert (summary.groups, summary.rollouts, summary.rewards.count, summary.rewards.max) == (0, 0, 0, None)


def test_preview_pairs_only_rollouts_of_one_prompt() -> None:
    """A group's rewards can differ only between prompts (two prompt versions, two system prompts, two
    requests that normalise to one task): DPO has no pair there, and the preview says how many it leaves."""
    v1, v2 = {"prompt_versions": ["orders@1"]}, {"prompt_versions": ["orders@2"]}
    groups = [
        group("versions", rollout("1", 1.0, metadata=v1), rollout("2", 0.0, metadata=v2)),
        group("requests", rollout("3", 1.0, request="Order 12345?"), rollout("4", 0.0, request="Order 98765?")),
        group("one prompt", rollout("5", 1.0, metadata=v1), rollout("6", 0.0, metadata=v1), rollout("7", 0.5)),
        group("equal", rollout("8", 1.0, metadata=v1), rollout("9", 1.0, metadata=v2)),
    ]
    summary = g.preview(groups)
    assert summary.pairable_groups == 1
    assert summary.unpaired_by_prompt == 5  # 1, 2, 3, 4 and 7; equal rewards are no candidates
    assert summary.as_dict()["unpaired_by_prompt"] == 5


def test_rollout_prompt_is_the_prompt_versions_and_the_messages_before_the_first_answer() -> None:
    base = rollout("1", 1.0, metadata={"prompt_versions": ["a@1", "b@2"]})
    same = rollout("2", 0.0, answer="Something else.", metadata={"prompt_versions": ["b@2", "a@1"]})
    assert g.rollout_prompt(base) == g.rollout_prompt(same)
    assert g.rollout_prompt(base) != g.rollout_prompt(rollout("3", metadata={"prompt_versions": ["a@1"]}))
    shown = rollout("4", request="What is this?")
    image = {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}}
    asked = {"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}
    other = Rollout(trace_id="5", messages=(asked, *shown.messages[1:]))
    assert g.rollout_prompt(shown) != g.rollout_prompt(other)


# --- One prompt per group (the group-relative formats) ------------------------------------------------------

V1, V2 = {"prompt_versions": ["rides@1"]}, {"prompt_versions": ["rides@2"]}


def test_separate_prompts_makes_one_group_per_prompt_of_a_task() -> None:
    """Before, a task asked under two prompt versions was one group: a group-relative advantage then compared v1's
    rewards with v2's, which says which prompt scored better, not which response."""
    mixed = group(
        "item:1",
        rollout("a", 1.0, metadata=V1),
        rollout("b", 0.0, metadata=V2),
        rollout("c", 0.0, metadata=V1),
        rollout("d", 0.5, metadata=V2, request="Where is my order 12345?"),
        split="validation",
    )
    single = group("item:2", rollout("e", 1.0, metadata=V1), rollout("f", 0.0, metadata=V1))

    separated = list(g.separate_prompts([mixed, single]))

    assert [(item.task_id, [r.trace_id for r in item.rollouts], item.task_prompts) for item in separated] == [
        ("item:1", ["a", "c"], 3),
        ("item:1", ["b"], 3),
        ("item:1", ["d"], 3),  # the same version, another request: another prompt
        ("item:2", ["e", "f"], 1),
    ]
    assert [item.task_text for item in separated[:3]] == ["Where is my order?"] * 2 + ["Where is my order 12345?"]
    assert {item.split for item in separated[:3]} == {"validation"}  # a task's shares stay on one side
    assert separated[3] is single
    # Once separated, nothing changes: the shares keep how many prompts their task had.
    assert list(g.separate_prompts(separated)) == separated


def test_separated_groups_face_the_size_and_reward_filters_and_the_preview_counts_them() -> None:
    tasks = [
        # v1: rewards that differ; v2: a single rollout, which teaches nothing relative and goes.
        group(
            "mixed",
            rollout("1", 1.0, metadata=V1),
            rollout("2", 0.0, metadata=V1, answer="No."),
            rollout("3", 0.5, metadata=V2, answer="Soon."),
        ),
        # Each prompt's rewards are equal: the task's differed only between prompts, so nothing is left of it.
        group(
            "between prompts",
            rollout("4", 1.0, metadata=V1, answer="one"),
            rollout("5", 1.0, metadata=V1, answer="two"),
            rollout("6", 0.0, metadata=V2, answer="three"),
            rollout("7", 0.0, metadata=V2, answer="four"),
        ),
        group("one prompt", rollout("8", 1.0, metadata=V2), rollout("9", 0.0, metadata=V2, answer="No.")),
    ]

    as_tasks = g.preview(g.curate(tasks, Filters()))
    separated = list(g.curate(g.separate_prompts(tasks), Filters()))
    summary = g.preview(separated)

    assert (as_tasks.groups, as_tasks.mixed_prompt_groups, as_tasks.tasks_separated_by_prompt) == (3, 2, 0)
    assert [(item.task_id, [r.trace_id for r in item.rollouts]) for item in separated] == [
        ("mixed", ["1", "2"]),
        ("one prompt", ["8", "9"]),
    ]
    assert (summary.groups, summary.mixed_prompt_groups, summary.tasks_separated_by_prompt) == (2, 0, 1)
    assert summary.as_dict()["tasks_separated_by_prompt"] == 1


def test_the_preview_counts_a_task_once_however_many_of_its_shares_are_kept() -> None:
    shares = list(
        g.separate_prompts(
            [
                group("a", rollout("1", 1.0, metadata=V1), rollout("2", 0.0, metadata=V2)),
                group("b", rollout("3", 1.0, metadata=V1), rollout("4", 0.0, metadata=V2)),
            ]
        )
    )
    assert len(shares) == 4
    assert g.preview(shares).tasks_separated_by_prompt == 2


def test_separate_prompts_streams_one_task_at_a_time() -> None:
    drawn: list[str] = []

    def source() -> Iterator[Rollout]:
        for trace_id, task, metadata in [("a1", "a", V1), ("a2", "a", V2), ("b1", "b", V1), ("c1", "c", V1)]:
            drawn.append(trace_id)
            yield rollout(trace_id, 1, task_id=task, metadata=metadata)

    stream = g.separate_prompts(g.group_rollouts(source(), ordered=True))
    assert [r.trace_id for r in next(stream).rollouts] == ["a1"]
    assert drawn == ["a1", "a2", "b1"]  # only one task ahead, as group_rollouts alone
    assert [r.trace_id for r in next(stream).rollouts] == ["a2"]
    assert drawn == ["a1", "a2", "b1"]
    assert [r.trace_id for r in next(stream).rollouts] == ["b1"]


def test_a_group_refuses_a_task_prompts_count_below_one() -> None:
    with pytest.raises(ValueError, match="task_prompts"):
        Group(task_id="a", task_text="", rollouts=(), task_prompts=0)
