"""LLM judges against a scripted fake model: no provider, no database."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from evals.judges import (
    JUDGE_TYPES,
    GroupJudge,
    ModelUnavailable,
    PairwiseJudge,
    ReferenceFreeJudge,
    RubricJudge,
    is_group_evaluator,
    judge_calibration,
    judge_from_config,
)
from evals.verifiers import EvalItem, EvalOutput, EvaluatorConfigError, ToolCall

Reply = str | Exception | Callable[[list[dict[str, Any]]], str]


@dataclass
class FakeJudgeModel:
    """A `Complete` that plays scripted replies in order and records every request it got.

    A reply is text, an exception to raise, or a function of the messages (for replies that depend on
    what the judge was shown, such as a shuffled order).
    """

    replies: Sequence[Reply]
    calls: list[tuple[list[dict[str, Any]], dict[str, Any] | None]] = field(default_factory=list)
    _pending: list[Reply] = field(init=False)

    def __post_init__(self) -> None:
        self._pending = list(self.replies)

    def __call__(self, messages: list[dict[str, Any]], response_format: dict[str, Any] | None) -> str:
        self.calls.append((messages, response_format))
        if not self._pending:
            raise AssertionError("the fake judge model ran out of scripted replies")
        reply = self._pending.pop(0)
        if isinstance(reply, Exception):
            raise reply
        if callable(reply):
            return reply(messages)
        return reply

    def text_of_call(self, index: int) -> str:
        return "\n".join(str(message["content"]) for message in self.calls[index][0])

    def all_text(self) -> str:
        return "\n".join(self.text_of_call(index) for index in range(len(self.calls)))


def verdict(score: object, reasoning: str = "looks right") -> str:
    return json.dumps({"reasoning": reasoning, "score": score})


ITEM = EvalItem(
    input=[
        {"role": "system", "content": "You are the ride-support agent."},
        {"role": "user", "content": "I was charged twice for ride R-42."},
    ],
    reference_output="Refund the duplicate charge on R-42.",
)
OUTPUT = EvalOutput(
    text="I have refunded the duplicate charge.",
    tool_calls=(ToolCall("refund_create", {"ride_id": "R-42", "amount": 12.5}),),
)


def rubric_judge(model: FakeJudgeModel, **settings: Any) -> RubricJudge:
    return RubricJudge(complete=model, rubric="The agent refunds exactly the duplicate charge.", **settings)


# --- rubric judge -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scale", "raw", "expected", "passed"),
    [
        ("binary", 1, 1.0, True),
        ("binary", 0, 0.0, False),
        ("binary", True, 1.0, True),
        ("1-5", 1, 0.0, False),
        ("1-5", 2, 0.25, False),
        ("1-5", 3, 0.5, True),
        ("1-5", 5, 1.0, True),
        ("0-10", 7, 0.7, True),
        ("0-10", 4, 0.4, False),
    ],
)
def test_rubric_judge_normalises_the_scale(scale: str, raw: object, expected: float, passed: bool) -> None:
    model = FakeJudgeModel([verdict(raw)])
    score = rubric_judge(model, scale=scale, name="refund", version=2).evaluate(ITEM, OUTPUT)
    assert score.score == pytest.approx(expected)
    assert score.passed is passed
    assert (score.evaluator, score.version, score.error) == ("refund", 2, None)


def test_rubric_judge_keeps_the_reasoning_and_asks_for_structured_output() -> None:
    model = FakeJudgeModel([verdict(4, "It refunded R-42 once, as the rubric asks.")])
    score = rubric_judge(model).evaluate(ITEM, OUTPUT)
    assert score.reason == "It refunded R-42 once, as the rubric asks."
    response_format = model.calls[0][1]
    assert response_format is not None
    assert response_format["type"] == "json_schema"
    schema = response_format["json_schema"]["schema"]
    assert schema["required"] == ["reasoning", "score"]
    assert schema["properties"]["score"] == {"type": "integer", "minimum": 1, "maximum": 5}


@pytest.mark.parametrize(
    "reply",
    [
        '```json\n{"reasoning": "fine", "score": 5}\n```',
        'Here is my verdict:\n```\n{"reasoning": "fine", "score": 5}\n```\nThanks.',
        'My verdict is {"reasoning": "fine", "score": 5} as requested.',
    ],
)
def test_rubric_judge_accepts_json_in_a_fence_or_in_text(reply: str) -> None:
    score = rubric_judge(FakeJudgeModel([reply])).evaluate(ITEM, OUTPUT)
    assert (score.score, score.reason, score.error) == (1.0, "fine", None)


def test_an_unparsable_reply_is_retried_then_errored_not_scored_zero() -> None:
    model = FakeJudgeModel(["I think it is fine.", "Score: 4", "{not json"])
    score = rubric_judge(model).evaluate(ITEM, OUTPUT)
    assert len(model.calls) == 3
    assert model.calls[0] == model.calls[1] == model.calls[2]  # the same request each time
    assert score.score is None
    assert score.passed is False
    assert score.error is not None
    assert score.error.startswith("the judge's reply was not valid JSON after 3 attempts: ")


def test_an_invalid_reply_is_retried_until_a_valid_one() -> None:
    model = FakeJudgeModel([verdict(6), json.dumps({"score": 4}), verdict(4, "second try")])
    score = rubric_judge(model).evaluate(ITEM, OUTPUT)
    assert len(model.calls) == 3
    assert (score.score, score.reason) == (0.75, "second try")


def test_an_out_of_range_score_errors_after_max_attempts() -> None:
    model = FakeJudgeModel([verdict(11), verdict(-1)])
    score = rubric_judge(model, scale="0-10", max_attempts=2).evaluate(ITEM, OUTPUT)
    assert len(model.calls) == 2
    assert score.score is None
    assert (
        score.error == "the judge's reply had a score outside the scale after 2 attempts: -1 is not on the 0-10 scale"
    )


def test_model_unavailable_propagates_without_a_retry() -> None:
    model = FakeJudgeModel([ModelUnavailable("provider down"), verdict(5)])
    with pytest.raises(ModelUnavailable, match="provider down"):
        rubric_judge(model).evaluate(ITEM, OUTPUT)
    assert len(model.calls) == 1


def test_the_transcript_shows_the_input_output_and_tool_calls() -> None:
    model = FakeJudgeModel([verdict(5)])
    rubric_judge(model).evaluate(ITEM, OUTPUT)
    user = model.calls[0][0][1]["content"]
    assert "user: I was charged twice for ride R-42." in user
    assert "system: You are the ride-support agent." in user
    assert "I have refunded the duplicate charge." in user
    assert 'refund_create({"amount": 12.5, "ride_id": "R-42"})' in user
    assert "The agent refunds exactly the duplicate charge." in user


def test_a_task_string_is_shown_and_long_fields_are_truncated() -> None:
    model = FakeJudgeModel([verdict(5)])
    long_text = "start " + "x" * 50_000 + " end"
    rubric_judge(model).evaluate(EvalItem(input="Summarise the ticket."), EvalOutput(text=long_text))
    user = model.calls[0][0][1]["content"]
    assert "Summarise the ticket." in user
    assert "start " in user
    assert " end" in user
    assert "characters omitted" in user
    assert len(user) < 6_000


def test_the_reference_is_shown_when_used() -> None:
    model = FakeJudgeModel([verdict(5)])
    rubric_judge(model).evaluate(ITEM, OUTPUT)
    assert "Refund the duplicate charge on R-42." in model.text_of_call(0)


def test_the_reference_is_left_out_when_not_used_or_absent() -> None:
    model = FakeJudgeModel([verdict(5), verdict(5)])
    rubric_judge(model, use_reference=False).evaluate(ITEM, OUTPUT)
    rubric_judge(model).evaluate(EvalItem(input="Say hi."), OUTPUT)
    assert "Refund the duplicate charge on R-42." not in model.text_of_call(0)
    assert "<reference>" not in model.text_of_call(0)
    assert "<reference>" not in model.text_of_call(1)


# --- pairwise judge -----------------------------------------------------------------------------------

OUTPUT_A = EvalOutput(text="Answer from A: refunded R-42.")
OUTPUT_B = EvalOutput(text="Answer from B: please contact support.")


def pairwise(winner: str, reasoning: str = "because") -> str:
    return json.dumps({"reasoning": reasoning, "winner": winner})


def test_pairwise_swaps_positions_and_names_a_winner_when_both_orders_agree() -> None:
    model = FakeJudgeModel([pairwise("1", "A refunds"), pairwise("2", "A still refunds")])
    result = PairwiseJudge(complete=model).compare(ITEM, OUTPUT_A, OUTPUT_B)
    assert (result.winner, result.consistent, result.position_bias) == ("a", True, False)
    assert result.reasoning == ("A refunds", "A still refunds")
    first, second = model.text_of_call(0), model.text_of_call(1)
    assert first.index("Answer from A") < first.index("Answer from B")
    assert second.index("Answer from B") < second.index("Answer from A")


def test_pairwise_names_b_when_both_orders_prefer_b() -> None:
    model = FakeJudgeModel([pairwise("2"), pairwise("1")])
    result = PairwiseJudge(complete=model).compare(ITEM, OUTPUT_A, OUTPUT_B)
    assert (result.winner, result.consistent, result.position_bias) == ("b", True, False)


@pytest.mark.parametrize(("first", "second"), [("1", "1"), ("2", "2")])
def test_pairwise_flags_position_bias_when_each_order_prefers_the_same_slot(first: str, second: str) -> None:
    model = FakeJudgeModel([pairwise(first), pairwise(second)])
    result = PairwiseJudge(complete=model).compare(ITEM, OUTPUT_A, OUTPUT_B)
    assert (result.winner, result.consistent, result.position_bias) == ("tie", False, True)


def test_pairwise_disagreement_without_a_slot_preference_is_an_inconsistent_tie() -> None:
    model = FakeJudgeModel([pairwise("1"), pairwise("tie")])
    result = PairwiseJudge(complete=model).compare(ITEM, OUTPUT_A, OUTPUT_B)
    assert (result.winner, result.consistent, result.position_bias, result.error) == ("tie", False, False, None)


def test_pairwise_agreeing_tie_is_consistent() -> None:
    model = FakeJudgeModel([pairwise("tie"), pairwise("tie")])
    result = PairwiseJudge(complete=model).compare(ITEM, OUTPUT_A, OUTPUT_B)
    assert (result.winner, result.consistent, result.position_bias) == ("tie", True, False)


def test_pairwise_without_a_valid_reply_carries_the_error() -> None:
    model = FakeJudgeModel([pairwise("1"), pairwise("A"), pairwise("B"), "nope"])
    result = PairwiseJudge(complete=model).compare(ITEM, OUTPUT_A, OUTPUT_B)
    assert len(model.calls) == 4
    assert (result.winner, result.consistent) == ("tie", False)
    assert result.error is not None
    assert result.error.startswith("the judge's reply was not valid JSON after 3 attempts")


# --- group judge (RULER) ------------------------------------------------------------------------------

GROUP = [EvalOutput(text=f"rollout {name}") for name in ("alpha", "bravo", "charlie", "delta", "echo")]
GROUP_SCORES = {"alpha": 0.1, "bravo": 0.9, "charlie": 0.5, "delta": 0.0, "echo": 0.7}
_CANDIDATE = re.compile(r'<candidate id="(candidate-\d+)">\nrollout (\w+)')


def shown_candidates(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return _CANDIDATE.findall(messages[1]["content"])


def score_by_name(messages: list[dict[str, Any]]) -> str:
    scores = [
        {"id": id_, "score": GROUP_SCORES[name], "explanation": f"{name} judged"}
        for id_, name in shown_candidates(messages)
    ]
    return json.dumps({"reasoning": "compared them all", "scores": scores})


def test_group_judge_maps_shuffled_scores_back_to_the_outputs() -> None:
    model = FakeJudgeModel([score_by_name])
    scores = GroupJudge(complete=model, seed=7).evaluate_group(ITEM, GROUP)
    assert len(model.calls) == 1
    shown = shown_candidates(model.calls[0][0])
    assert [id_ for id_, _ in shown] == [f"candidate-{n}" for n in range(1, 6)]
    assert [name for _, name in shown] != ["alpha", "bravo", "charlie", "delta", "echo"]  # shuffled
    assert [score.score for score in scores] == [0.1, 0.9, 0.5, 0.0, 0.7]
    assert [score.passed for score in scores] == [False, True, True, False, True]
    assert [score.reason for score in scores] == [f"{name} judged" for name in GROUP_SCORES]


def test_group_judge_order_is_reproducible_for_a_seed_and_varies_with_it() -> None:
    def order(seed: int) -> list[str]:
        model = FakeJudgeModel([score_by_name])
        GroupJudge(complete=model, seed=seed).evaluate_group(ITEM, GROUP)
        return [name for _, name in shown_candidates(model.calls[0][0])]

    assert order(7) == order(7)
    assert len({tuple(order(seed)) for seed in range(6)}) > 1


def test_group_judge_retries_missing_and_duplicate_ids() -> None:
    missing = json.dumps({"reasoning": "", "scores": [{"id": "candidate-1", "score": 1, "explanation": ""}]})
    duplicate = json.dumps(
        {
            "reasoning": "",
            "scores": [
                {"id": "candidate-1", "score": 1, "explanation": ""},
                {"id": "candidate-1", "score": 0, "explanation": ""},
            ],
        }
    )
    model = FakeJudgeModel([missing, duplicate, score_by_name])
    scores = GroupJudge(complete=model).evaluate_group(ITEM, GROUP[:2])
    assert len(model.calls) == 3
    assert [score.score for score in scores] == [0.1, 0.9]


def test_group_judge_errors_every_output_after_invalid_replies() -> None:
    missing = json.dumps({"reasoning": "", "scores": [{"id": "candidate-2", "score": 1, "explanation": ""}]})
    model = FakeJudgeModel([missing, missing, missing])
    scores = GroupJudge(complete=model).evaluate_group(ITEM, GROUP[:2])
    assert [score.score for score in scores] == [None, None]
    assert [score.error for score in scores] == [
        "the judge's reply left out candidates after 3 attempts: candidate-1"
    ] * 2


def test_group_judge_refuses_a_score_outside_zero_to_one() -> None:
    out_of_range = json.dumps({"reasoning": "", "scores": [{"id": "candidate-1", "score": 4, "explanation": ""}]})
    model = FakeJudgeModel([out_of_range])
    scores = GroupJudge(complete=model, max_attempts=1).evaluate_group(ITEM, GROUP[:1])
    assert scores[0].error == "the judge's reply had a score outside 0..1 after 1 attempt: candidate-1: 4.0"


def test_group_judge_scores_a_group_of_one_and_skips_an_empty_group() -> None:
    model = FakeJudgeModel([score_by_name])
    judge = GroupJudge(complete=model, pass_threshold=0.95)
    [only] = judge.evaluate_group(ITEM, GROUP[1:2])
    assert (only.score, only.passed) == (0.9, False)
    assert judge.evaluate_group(ITEM, []) == []
    assert len(model.calls) == 1


# --- reference-free judge (Compute as Teacher) --------------------------------------------------------

TASK_MARKER = "TASK-MARKER-7781 what is the capital of Australia"
CAT_ITEM = EvalItem(input=TASK_MARKER, reference_output="SECRET-REFERENCE Canberra")
ROLLOUTS = [EvalOutput(text="It is Sydney."), EvalOutput(text="Canberra, the capital since 1913.")]
CRITERIA = ["Names Canberra", "Does not name Sydney", "Gives one city", "Mentions 1913"]


def synthesis(answer: str = "Canberra is the capital of Australia.", criteria: list[str] | None = None) -> str:
    return json.dumps({"reasoning": "reconciled", "reference_answer": answer, "criteria": criteria or CRITERIA})


def criteria_verdict(*met: bool) -> str:
    entries = [{"number": number, "met": value} for number, value in enumerate(met, start=1)]
    return json.dumps({"reasoning": "checked", "criteria": entries})


def test_reference_free_synthesiser_never_sees_the_task_and_the_judge_gets_the_estimate() -> None:
    synthesiser = FakeJudgeModel([synthesis()])
    judge_model = FakeJudgeModel(
        [criteria_verdict(False, False, True, False), criteria_verdict(True, True, True, False)]
    )
    scores = ReferenceFreeJudge(complete=judge_model, synthesise=synthesiser).evaluate_group(CAT_ITEM, ROLLOUTS)

    assert len(synthesiser.calls) == 1
    seen_by_synthesiser = synthesiser.all_text()
    assert "TASK-MARKER-7781" not in seen_by_synthesiser
    assert "SECRET-REFERENCE" not in seen_by_synthesiser
    assert "It is Sydney." in seen_by_synthesiser
    assert "Canberra, the capital since 1913." in seen_by_synthesiser

    assert len(judge_model.calls) == 2
    for index, rollout in enumerate(ROLLOUTS):
        seen_by_judge = judge_model.text_of_call(index)
        assert "Canberra is the capital of Australia." in seen_by_judge
        assert "4. Mentions 1913" in seen_by_judge
        assert rollout.text in seen_by_judge
        assert "SECRET-REFERENCE" not in seen_by_judge

    assert [score.score for score in scores] == [0.25, 0.75]
    assert [score.passed for score in scores] == [False, True]
    assert scores[1].reason == (
        "3 of 4 criteria met; unmet: 4. Mentions 1913; estimated reference: 'Canberra is the capital of Australia.'"
    )
    assert "unmet: 1. Names Canberra; 2. Does not name Sydney; 4. Mentions 1913" in scores[0].reason


def test_reference_free_errors_every_rollout_when_the_synthesiser_gives_no_valid_reply() -> None:
    synthesiser = FakeJudgeModel(["nonsense", synthesis(criteria=["only one", "two"]), "{}"])
    judge_model = FakeJudgeModel([])
    scores = ReferenceFreeJudge(complete=judge_model, synthesise=synthesiser).evaluate_group(CAT_ITEM, ROLLOUTS)
    assert len(synthesiser.calls) == 3
    assert judge_model.calls == []
    assert [score.score for score in scores] == [None, None]
    assert all(
        (score.error or "").startswith("the synthesiser's reply had no text 'reference_answer'") for score in scores
    )


def test_reference_free_retries_too_few_criteria() -> None:
    synthesiser = FakeJudgeModel([synthesis(criteria=["one", "two"]), synthesis()])
    judge_model = FakeJudgeModel([criteria_verdict(True, True, True, True)])
    [score] = ReferenceFreeJudge(complete=judge_model, synthesise=synthesiser).evaluate_group(CAT_ITEM, ROLLOUTS[1:])
    assert len(synthesiser.calls) == 2
    assert (score.score, score.passed) == (1.0, True)


def test_reference_free_errors_one_rollout_whose_verdict_is_incomplete() -> None:
    synthesiser = FakeJudgeModel([synthesis()])
    judge_model = FakeJudgeModel([criteria_verdict(True, True, True)] * 3 + [criteria_verdict(True, True, True, True)])
    scores = ReferenceFreeJudge(complete=judge_model, synthesise=synthesiser).evaluate_group(CAT_ITEM, ROLLOUTS)
    assert scores[0].error == "the judge's reply left out criteria after 3 attempts: 4"
    assert scores[1].score == 1.0


def test_reference_free_lets_model_unavailable_through_and_skips_an_empty_group() -> None:
    synthesiser = FakeJudgeModel([ModelUnavailable("synthesiser down")])
    judge = ReferenceFreeJudge(complete=FakeJudgeModel([]), synthesise=synthesiser)
    assert judge.evaluate_group(CAT_ITEM, []) == []
    with pytest.raises(ModelUnavailable):
        judge.evaluate_group(CAT_ITEM, ROLLOUTS)


# --- calibration --------------------------------------------------------------------------------------


def test_calibration_kappa_and_agreement_of_a_known_table() -> None:
    # Judge pass & human pass 20, judge pass & human fail 5, judge fail & human pass 10, both fail 15:
    # observed 35/50 = 0.7; chance 0.5·0.6 + 0.5·0.4 = 0.5; kappa (0.7 − 0.5) / (1 − 0.5) = 0.4.
    pairs = [(1.0, 1.0)] * 20 + [(1.0, 0.0)] * 5 + [(0.0, 1.0)] * 10 + [(0.0, 0.0)] * 15
    result = judge_calibration([judge for judge, _ in pairs], [human for _, human in pairs])
    assert result.n == 50
    assert result.agreement == pytest.approx(0.7)
    assert result.cohen_kappa == pytest.approx(0.4)
    assert result.mean_absolute_error == pytest.approx(0.3)


def test_calibration_spearman_with_ties_and_pearson() -> None:
    # Ranks (1, 2.5, 2.5, 4) and (1, 3, 2, 4): covariance 4.5, spreads 4.5 and 5, rho = sqrt(0.9).
    spearman = judge_calibration([0.1, 0.2, 0.2, 0.3], [0.1, 0.3, 0.2, 0.4]).spearman
    assert spearman == pytest.approx(math.sqrt(0.9))
    # (0, .5, 1) against (0, 1, 1): covariance 0.5, spreads 0.5 and 2/3, r = sqrt(3)/2.
    result = judge_calibration([0.0, 0.5, 1.0], [0.0, 1.0, 1.0])
    assert result.pearson == pytest.approx(math.sqrt(3) / 2)
    assert result.mean_absolute_error == pytest.approx(0.5 / 3)
    assert result.agreement == pytest.approx(1.0)  # 0.5 passes at the default threshold


def test_calibration_skips_none_pairs_and_uses_the_threshold() -> None:
    result = judge_calibration([0.6, None, 0.8, 0.2], [0.4, 1.0, None, 0.1], threshold=0.3)
    assert result.n == 2
    assert result.agreement == 1.0
    assert result.mean_absolute_error == pytest.approx(0.15)
    assert judge_calibration([0.6, 0.2], [0.4, 0.1], threshold=0.5).agreement == 0.5


def test_calibration_leaves_undefined_figures_none() -> None:
    assert judge_calibration([0.5], [0.5]).cohen_kappa is None
    assert judge_calibration([0.5], [0.5]).pearson is None
    assert judge_calibration([None], [0.5]).n == 0
    assert judge_calibration([None], [0.5]).agreement is None
    constant = judge_calibration([0.7, 0.7, 0.7], [0.1, 0.5, 0.9])
    assert (constant.pearson, constant.spearman) == (None, None)
    all_pass = judge_calibration([0.9, 0.8], [0.7, 0.6])
    assert (all_pass.agreement, all_pass.cohen_kappa) == (1.0, None)
    with pytest.raises(ValueError, match="2 judge scores but 1 human scores"):
        judge_calibration([0.1, 0.2], [0.1])


# --- construction from config -------------------------------------------------------------------------


@dataclass
class FakeModelDirectory:
    """`complete_for`: a FakeJudgeModel per alias, recording which aliases were asked for."""

    asked: list[str | None] = field(default_factory=list)
    models: dict[str | None, FakeJudgeModel] = field(default_factory=dict)

    def __call__(self, alias: str | None) -> FakeJudgeModel:
        self.asked.append(alias)
        return self.models.setdefault(alias, FakeJudgeModel([]))


def test_judge_from_config_builds_each_type_with_its_models() -> None:
    directory = FakeModelDirectory()
    rubric = judge_from_config(
        {"type": "llm_judge", "name": "relevance", "version": 2, "rubric": "Relevant?", "scale": "1-5", "model": "m1"},
        complete_for=directory,
    )
    assert isinstance(rubric, RubricJudge)
    assert (rubric.name, rubric.version, rubric.scale, rubric.pass_threshold) == ("relevance", 2, "1-5", 0.5)
    assert rubric.complete is directory.models["m1"]

    binary = judge_from_config({"type": "llm_judge", "rubric": "ok?", "scale": "binary"}, complete_for=directory)
    assert isinstance(binary, RubricJudge)
    assert binary.pass_threshold == 1.0

    pair = judge_from_config({"type": "pairwise_judge"}, complete_for=directory)
    group = judge_from_config({"type": "group_judge", "seed": 3, "pass_threshold": 0.6}, complete_for=directory)
    teacher = judge_from_config(
        {"type": "reference_free", "model": "judge-model", "synthesiser_model": "big-model"}, complete_for=directory
    )
    assert isinstance(pair, PairwiseJudge)
    assert isinstance(group, GroupJudge)
    assert (group.seed, group.pass_threshold) == (3, 0.6)
    assert isinstance(teacher, ReferenceFreeJudge)
    assert teacher.complete is directory.models["judge-model"]
    assert teacher.synthesise is directory.models["big-model"]
    assert directory.asked == ["m1", None, None, None, "judge-model", "big-model"]


def test_the_synthesiser_defaults_to_the_judge_model_alias() -> None:
    directory = FakeModelDirectory()
    teacher = judge_from_config({"type": "reference_free", "model": "m"}, complete_for=directory)
    assert isinstance(teacher, ReferenceFreeJudge)
    assert directory.asked == ["m", "m"]


def test_group_judges_are_told_apart() -> None:
    directory = FakeModelDirectory()
    built = {kind: judge_from_config({"type": kind, "rubric": "r"}, complete_for=directory) for kind in JUDGE_TYPES[:3]}
    built["reference_free"] = judge_from_config({"type": "reference_free"}, complete_for=directory)
    assert {kind: is_group_evaluator(judge) for kind, judge in built.items()} == {
        "llm_judge": False,
        "pairwise_judge": False,
        "group_judge": True,
        "reference_free": True,
    }


@pytest.mark.parametrize(
    ("config", "field_name"),
    [
        ({"type": "judge"}, "type"),
        ({"rubric": "r"}, "type"),
        ({"type": "llm_judge"}, "rubric"),
        ({"type": "llm_judge", "rubric": "  "}, "rubric"),
        ({"type": "llm_judge", "rubric": "r", "temperature": 0}, "temperature"),
        ({"type": "llm_judge", "rubric": "r", "scale": "1-10"}, "scale"),
        ({"type": "llm_judge", "rubric": "r", "pass_threshold": 1.5}, "pass_threshold"),
        ({"type": "llm_judge", "rubric": "r", "use_reference": "yes"}, "use_reference"),
        ({"type": "llm_judge", "rubric": "r", "version": True}, "version"),
        ({"type": "llm_judge", "rubric": "r", "version": 0}, "version"),
        ({"type": "llm_judge", "rubric": "r", "name": ""}, "name"),
        ({"type": "llm_judge", "rubric": "r", "model": 3}, "model"),
        ({"type": "llm_judge", "rubric": "r", "max_attempts": 0}, "max_attempts"),
        ({"type": "pairwise_judge", "scale": "1-5"}, "scale"),
        ({"type": "group_judge", "seed": "abc"}, "seed"),
        ({"type": "reference_free", "rubric": "r"}, "rubric"),
        ({"type": "reference_free", "synthesiser_model": 1}, "synthesiser_model"),
    ],
)
def test_config_errors_name_the_field(config: dict[str, Any], field_name: str) -> None:
    with pytest.raises(EvaluatorConfigError) as raised:
        judge_from_config(config, complete_for=FakeModelDirectory())
    assert raised.value.field == field_name
