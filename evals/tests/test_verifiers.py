"""The deterministic verifiers: each one's pass and fail, Unicode and empty output, invalid JSON and bad
configs, tool-call order and argument rules, final state, custom verifiers and `evaluate_safely`."""

from __future__ import annotations

from typing import Any

import pytest

from evals.verifiers import (
    BUILT_INS,
    CustomVerifier,
    EmbeddingSimilarity,
    EvalItem,
    EvalOutput,
    EvaluationError,
    EvaluatorConfigError,
    ExactMatch,
    ExpectedToolCalls,
    FinalStateMatch,
    JsonSchemaMatch,
    NormalisedMatch,
    NumericTolerance,
    RegexMatch,
    Score,
    ToolCall,
    VerifierAlreadyRegistered,
    VerifierNotFound,
    VerifierRegistry,
    evaluate_safely,
    evaluator_from_config,
    normalise_text,
    verifier,
    verifier_get,
    verifiers_available,
)


def item(reference: str | None = None, **kwargs: Any) -> EvalItem:
    return EvalItem(reference_output=reference, **kwargs)


def output(text: str = "", **kwargs: Any) -> EvalOutput:
    return EvalOutput(text=text, **kwargs)


# --- Score --------------------------------------------------------------------------------------------


def test_score_refuses_values_outside_zero_to_one():
    with pytest.raises(ValueError, match=r"within 0\.\.1"):
        Score("x", 1, 1.5, True)
    with pytest.raises(ValueError, match=r"within 0\.\.1"):
        Score("x", 1, float("nan"), False)


def test_an_errored_score_has_no_value_and_does_not_pass():
    with pytest.raises(ValueError, match="score=None"):
        Score("x", 1, 0.0, False, error="boom")
    with pytest.raises(ValueError, match="score=None"):
        Score("x", 1, None, True, error="boom")
    assert Score("x", 1, None, False, error="boom").errored is True


def test_a_score_without_an_error_needs_a_value():
    with pytest.raises(ValueError, match="needs a value"):
        Score("x", 1, None, False)


# --- exact and normalised match -----------------------------------------------------------------------


def test_exact_match_passes_on_the_reference_ignoring_outer_whitespace():
    score = ExactMatch().evaluate(item("Paris"), output("Paris\n"))

    assert (score.evaluator, score.score, score.passed, score.error) == ("exact_match", 1.0, True, None)
    assert score.version == ExactMatch().version


def test_exact_match_fails_on_case_and_says_what_differed():
    score = ExactMatch().evaluate(item("Paris"), output("paris"))

    assert (score.score, score.passed) == (0.0, False)
    assert score.reason == "expected 'Paris', got 'paris'"


def test_exact_match_without_strip_counts_whitespace():
    assert ExactMatch(strip=False).evaluate(item("Paris"), output("Paris ")).passed is False


def test_exact_match_of_empty_output_against_empty_reference_passes():
    assert ExactMatch().evaluate(item(""), output("")).passed is True
    assert ExactMatch().evaluate(item("Paris"), output("")).passed is False


def test_an_item_without_a_reference_is_an_evaluation_error():
    with pytest.raises(EvaluationError, match="no reference output"):
        ExactMatch().evaluate(item(None), output("Paris"))


def test_normalise_text_folds_case_punctuation_whitespace_and_compatibility_forms():
    # Full-width letters and the "ﬁ" ligature are NFKC-equivalent to plain ASCII.
    assert normalise_text("  Ｈｅｌｌｏ,\tWORLD!!  ﬁne. ") == "hello world fine"
    assert normalise_text("Straße") == normalise_text("STRASSE")  # casefold, not lower


def test_normalise_text_keeps_numbers_whole_when_normalising_them():
    assert normalise_text("Total: 1,000.50 USD", normalise_numbers=True) == "total 1000.5 usd"
    assert normalise_text("3.0 apples", normalise_numbers=True) == normalise_text("3 apples", normalise_numbers=True)
    assert normalise_text("Total: 1,000.50") == "total 1 000 50"


def test_normalised_match_passes_on_case_punctuation_and_unicode_differences():
    score = NormalisedMatch().evaluate(item("The answer is: café!"), output("the ANSWER is cafe\u0301"))

    assert score.passed is True
    assert score.score == 1.0


def test_normalised_match_fails_on_different_words():
    score = NormalisedMatch().evaluate(item("The answer is 42"), output("The answer is 43"))

    assert (score.score, score.passed) == (0.0, False)
    assert score.reason == "normalised: expected 'the answer is 42', got 'the answer is 43'"


def test_normalised_match_with_number_normalisation():
    evaluator = NormalisedMatch(normalise_numbers=True)

    assert evaluator.evaluate(item("It costs 1000 dollars"), output("it costs 1,000.00 dollars.")).passed is True
    assert (
        NormalisedMatch().evaluate(item("It costs 1000 dollars"), output("it costs 1,000.00 dollars.")).passed is False
    )


def test_normalised_match_can_keep_case_and_punctuation():
    assert NormalisedMatch(case_sensitive=True).evaluate(item("Yes"), output("yes")).passed is False
    assert NormalisedMatch(ignore_punctuation=False).evaluate(item("yes"), output("yes!")).passed is False


# --- regex --------------------------------------------------------------------------------------------


def test_regex_search_finds_the_pattern_anywhere():
    score = RegexMatch(pattern=r"order #\d+").evaluate(item(), output("Your order #1234 has shipped"))

    assert (score.score, score.passed) == (1.0, True)
    assert score.reason == "search of /order #\\d+/ matched 'order #1234'"


def test_regex_fullmatch_needs_the_whole_output():
    evaluator = RegexMatch(pattern=r"\d+", mode="fullmatch")

    assert evaluator.evaluate(item(), output("1234")).passed is True
    assert evaluator.evaluate(item(), output("1234 units")).passed is False


def test_regex_match_anchors_at_the_start():
    evaluator = RegexMatch(pattern="yes", mode="match")

    assert evaluator.evaluate(item(), output("yes, done")).passed is True
    assert evaluator.evaluate(item(), output("oh yes")).passed is False


def test_regex_flags_by_name_or_letter():
    assert RegexMatch(pattern="^refund$", flags=("IGNORECASE", "m")).evaluate(item(), output("ok\nREFUND")).passed
    assert not RegexMatch(pattern="^refund$").evaluate(item(), output("ok\nREFUND")).passed


def test_regex_on_empty_output():
    assert RegexMatch(pattern="x").evaluate(item(), output("")).passed is False
    assert RegexMatch(pattern="x*", mode="fullmatch").evaluate(item(), output("")).passed is True


def test_regex_unicode():
    assert RegexMatch(pattern=r"^\w+$").evaluate(item(), output("日本語")).passed is True


def test_a_bad_regex_is_a_configuration_error_not_a_zero_score():
    with pytest.raises(EvaluatorConfigError, match="does not compile") as raised:
        RegexMatch(pattern="(unclosed")

    assert raised.value.field == "pattern"


def test_regex_unknown_flag_and_mode_name_their_field():
    with pytest.raises(EvaluatorConfigError) as flag:
        RegexMatch(pattern="x", flags=("UNICODEISH",))
    with pytest.raises(EvaluatorConfigError) as mode:
        RegexMatch(pattern="x", mode="find")  # type: ignore[arg-type]

    assert (flag.value.field, mode.value.field) == ("flags", "mode")


# --- JSON schema --------------------------------------------------------------------------------------

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
    "required": ["city", "days"],
    "additionalProperties": False,
}


def test_json_schema_passes_valid_output():
    score = JsonSchemaMatch(schema=SCHEMA).evaluate(item(), output('{"city": "Oslo", "days": 3}'))

    assert (score.score, score.passed, score.reason) == (1.0, True, "output is valid against the schema")


def test_json_schema_unwraps_a_code_fence():
    text = '```json\n{"city": "Oslo", "days": 3}\n```'

    assert JsonSchemaMatch(schema=SCHEMA).evaluate(item(), output(text)).passed is True
    assert JsonSchemaMatch(schema=SCHEMA, strip_code_fence=False).evaluate(item(), output(text)).passed is False


def test_json_schema_fails_with_the_paths_of_the_errors():
    score = JsonSchemaMatch(schema=SCHEMA).evaluate(item(), output('{"city": 7, "days": 0}'))

    assert (score.score, score.passed) == (0.0, False)
    assert score.reason == "2 schema error(s): city: 7 is not of type 'string'; days: 0 is less than the minimum of 1"


def test_invalid_json_fails_with_a_reason_and_does_not_raise():
    score = JsonSchemaMatch(schema=SCHEMA).evaluate(item(), output("{'city': 'Oslo'}"))

    assert (score.score, score.passed, score.error) == (0.0, False, None)
    assert score.reason.startswith("output is not JSON: ")


def test_empty_output_is_not_json():
    score = JsonSchemaMatch(schema=SCHEMA).evaluate(item(), output(""))

    assert score.passed is False
    assert score.reason.startswith("output is not JSON")


def test_an_invalid_schema_is_a_configuration_error():
    with pytest.raises(EvaluatorConfigError, match="not a valid JSON Schema") as raised:
        JsonSchemaMatch(schema={"type": "no-such-type"})

    assert raised.value.field == "schema"


# --- numeric tolerance --------------------------------------------------------------------------------


def test_numeric_tolerance_absolute():
    evaluator = NumericTolerance(absolute_tolerance=0.5)

    assert evaluator.evaluate(item("10"), output(" 10.4 ")).passed is True
    score = evaluator.evaluate(item("10"), output("10.6"))
    assert (score.score, score.passed) == (0.0, False)
    assert score.reason == "got 10.6, expected 10: difference 0.6 outside 0.5"


def test_numeric_tolerance_relative_scales_with_the_expected_value():
    evaluator = NumericTolerance(relative_tolerance=0.01)

    assert evaluator.evaluate(item("1,000"), output("1009")).passed is True
    assert evaluator.evaluate(item("1000"), output("1011")).passed is False


def test_numeric_tolerance_zero_tolerance_is_exact():
    assert NumericTolerance().evaluate(item("3"), output("3.0")).passed is True
    assert NumericTolerance().evaluate(item("3"), output("3.0001")).passed is False


def test_numeric_tolerance_extracts_the_first_or_last_number():
    text = "Step 1 gives 20, so the answer is 42."

    assert NumericTolerance(extract="last").evaluate(item("42"), output(text)).passed is True
    assert NumericTolerance(extract="first").evaluate(item("1"), output(text)).passed is True
    assert (
        NumericTolerance(extract="whole")
        .evaluate(item("42"), output(text))
        .reason.startswith("the output is not a number")
    )


def test_numeric_tolerance_negative_and_thousands():
    assert NumericTolerance(extract="last").evaluate(item("-1234.5"), output("Balance: -1,234.50")).passed is True


def test_numeric_tolerance_fails_without_a_number_in_the_output():
    score = NumericTolerance(extract="last").evaluate(item("42"), output("I don't know"))

    assert (score.passed, score.reason) == (False, 'no number in the output: "I don\'t know"')
    assert NumericTolerance().evaluate(item("42"), output("")).passed is False


def test_numeric_tolerance_configured_expected_overrides_the_reference():
    assert NumericTolerance(expected=7).evaluate(item(None), output("7")).passed is True


def test_a_reference_that_is_not_a_number_is_an_evaluation_error():
    with pytest.raises(EvaluationError, match="not a number"):
        NumericTolerance().evaluate(item("forty-two"), output("42"))


def test_numeric_tolerance_refuses_negative_tolerances():
    with pytest.raises(EvaluatorConfigError) as raised:
        NumericTolerance(relative_tolerance=-0.1)

    assert raised.value.field == "relative_tolerance"


# --- expected tool calls ------------------------------------------------------------------------------

LOOKUP = ToolCall("find_user", {"email": "a@example.com"})
CANCEL = ToolCall("cancel_order", {"order_id": "W1", "reason": "no longer needed"})
REFUND = ToolCall("refund", {"order_id": "W1", "amount": 20})


def tool_item(*calls: ToolCall) -> EvalItem:
    return EvalItem(expected_tool_calls=calls)


def tool_output(*calls: ToolCall) -> EvalOutput:
    return EvalOutput(tool_calls=calls)


def test_tool_calls_all_made_pass():
    score = ExpectedToolCalls().evaluate(tool_item(LOOKUP, CANCEL), tool_output(LOOKUP, CANCEL))

    assert (score.score, score.passed) == (1.0, True)
    assert score.reason == "2/2 expected calls matched (unordered, subset arguments)"


def test_tool_calls_score_is_the_fraction_matched():
    score = ExpectedToolCalls().evaluate(tool_item(LOOKUP, CANCEL, REFUND), tool_output(LOOKUP))

    assert score.score == pytest.approx(1 / 3)
    assert score.passed is False
    assert "missing: cancel_order(" in score.reason


def test_tool_call_arguments_as_a_subset():
    made = ToolCall("cancel_order", {"order_id": "W1", "reason": "no longer needed", "notify": True})

    assert ExpectedToolCalls().evaluate(tool_item(CANCEL), tool_output(made)).passed is True
    assert ExpectedToolCalls(arguments="exact").evaluate(tool_item(CANCEL), tool_output(made)).passed is False


def test_tool_call_subset_compares_nested_objects_as_subsets():
    expected = ToolCall("book", {"passenger": {"name": "Ada"}})
    made = ToolCall("book", {"passenger": {"name": "Ada", "seat": "3A"}})

    assert ExpectedToolCalls().evaluate(tool_item(expected), tool_output(made)).passed is True


def test_tool_call_argument_values_must_be_equal():
    made = ToolCall("refund", {"order_id": "W1", "amount": 25})

    assert ExpectedToolCalls().evaluate(tool_item(REFUND), tool_output(made)).passed is False


def test_tool_call_values_follow_json_semantics():
    # 20 and 20.0 are the same JSON number; true is not 1.
    assert (
        ExpectedToolCalls()
        .evaluate(tool_item(REFUND), tool_output(ToolCall("refund", {"order_id": "W1", "amount": 20.0})))
        .passed
    )
    flag = ToolCall("set", {"on": True})
    assert not ExpectedToolCalls().evaluate(tool_item(flag), tool_output(ToolCall("set", {"on": 1}))).passed


def test_tool_call_names_must_match():
    renamed = ToolCall("cancel_orders", dict(CANCEL.arguments))

    assert ExpectedToolCalls().evaluate(tool_item(CANCEL), tool_output(renamed)).score == 0.0


def test_ordered_tool_calls_fail_out_of_order_but_unordered_pass():
    expected, made = tool_item(LOOKUP, CANCEL), tool_output(CANCEL, LOOKUP)

    ordered = ExpectedToolCalls(order="ordered").evaluate(expected, made)
    assert (ordered.score, ordered.passed) == (0.5, False)
    assert ExpectedToolCalls(order="unordered").evaluate(expected, made).passed is True


def test_ordered_tool_calls_allow_other_calls_between_them():
    made = tool_output(LOOKUP, ToolCall("get_order", {"order_id": "W1"}), CANCEL)

    assert ExpectedToolCalls(order="ordered").evaluate(tool_item(LOOKUP, CANCEL), made).passed is True


def test_extra_calls_can_be_refused():
    made = tool_output(LOOKUP, REFUND, CANCEL)
    strict = ExpectedToolCalls(order="ordered", extra_calls_allowed=False)

    score = strict.evaluate(tool_item(LOOKUP, CANCEL), made)
    assert (score.score, score.passed) == (1.0, False)
    assert "1 extra call(s), not allowed: refund(" in score.reason
    assert strict.evaluate(tool_item(LOOKUP, CANCEL), tool_output(LOOKUP, CANCEL)).passed is True


def test_a_repeated_call_is_an_extra_call():
    score = ExpectedToolCalls(extra_calls_allowed=False).evaluate(tool_item(REFUND), tool_output(REFUND, REFUND))

    assert (score.score, score.passed) == (1.0, False)


def test_each_made_call_matches_at_most_one_expected_call():
    score = ExpectedToolCalls().evaluate(tool_item(REFUND, REFUND), tool_output(REFUND))

    assert score.score == 0.5


def test_unordered_matching_finds_the_best_assignment_not_the_first_fit():
    # The argument-free expectation would take the first call greedily and starve the specific one.
    general, specific = ToolCall("search", {}), ToolCall("search", {"query": "shoes"})
    made = tool_output(ToolCall("search", {"query": "shoes"}), ToolCall("search", {"query": "hats"}))

    assert ExpectedToolCalls().evaluate(tool_item(general, specific), made).passed is True


def test_ordered_matching_finds_the_longest_in_order_matching():
    general, specific = ToolCall("search", {}), ToolCall("search", {"query": "shoes"})
    made = tool_output(ToolCall("search", {"query": "shoes"}), ToolCall("search", {"query": "hats"}))

    # "search shoes" must come first, so only one of the two orders can both match.
    assert ExpectedToolCalls(order="ordered").evaluate(tool_item(specific, general), made).passed is True
    assert ExpectedToolCalls(order="ordered").evaluate(tool_item(general, specific), made).score == 0.5


def test_no_expected_calls():
    assert ExpectedToolCalls().evaluate(tool_item(), tool_output(LOOKUP)).passed is True
    strict = ExpectedToolCalls(extra_calls_allowed=False)
    assert strict.evaluate(tool_item(), tool_output()).passed is True
    score = strict.evaluate(tool_item(), tool_output(LOOKUP))
    assert (score.score, score.passed) == (1.0, False)


def test_an_item_without_expected_tool_calls_is_an_evaluation_error():
    with pytest.raises(EvaluationError, match="no expected tool calls"):
        ExpectedToolCalls().evaluate(EvalItem(), tool_output(LOOKUP))


# --- final state --------------------------------------------------------------------------------------


def state_item(state: dict[str, Any]) -> EvalItem:
    return EvalItem(expected_final_state=state)


def test_final_state_subset_passes_with_other_keys_present():
    actual = EvalOutput(final_state={"order": {"status": "cancelled", "id": "W1"}, "balance": 20})

    assert FinalStateMatch().evaluate(state_item({"order": {"status": "cancelled"}}), actual).passed is True


def test_final_state_reports_the_keys_that_differ():
    expected = {"status": "cancelled", "refunded": True}
    score = FinalStateMatch().evaluate(state_item(expected), EvalOutput(final_state={"status": "open"}))

    assert (score.score, score.passed) == (0.0, False)
    assert score.reason == "status: expected cancelled, got open; refunded: expected true, got missing"


def test_final_state_partial_match_scores_the_fraction():
    score = FinalStateMatch().evaluate(state_item({"a": 1, "b": 2}), EvalOutput(final_state={"a": 1, "b": 3}))

    assert (score.score, score.passed) == (0.5, False)


def test_final_state_exact_counts_unexpected_keys():
    evaluator = FinalStateMatch(mode="exact")
    score = evaluator.evaluate(state_item({"a": 1}), EvalOutput(final_state={"a": 1, "b": 2}))

    assert (score.score, score.passed) == (0.5, False)
    assert score.reason == "unexpected keys: b"
    assert (
        evaluator.evaluate(state_item({"a": {"x": 1}}), EvalOutput(final_state={"a": {"x": 1, "y": 2}})).passed is False
    )
    assert evaluator.evaluate(state_item({"a": 1}), EvalOutput(final_state={"a": 1})).passed is True


def test_final_state_missing_from_the_output_fails():
    score = FinalStateMatch().evaluate(state_item({"a": 1}), EvalOutput(text="done"))

    assert (score.passed, score.reason) == (False, "the output recorded no final state")


def test_an_item_without_an_expected_state_is_an_evaluation_error():
    with pytest.raises(EvaluationError, match="no expected final state"):
        FinalStateMatch().evaluate(EvalItem(), EvalOutput(final_state={}))


# --- embedding similarity -----------------------------------------------------------------------------


def test_embedding_similarity_passes_a_restatement():
    score = EmbeddingSimilarity(threshold=0.8).evaluate(
        item("How do I reset my password?"), output("how can I reset the password")
    )

    assert score.passed is True
    assert score.score == pytest.approx(1.0)


def test_embedding_similarity_fails_an_unrelated_answer():
    score = EmbeddingSimilarity(threshold=0.5).evaluate(
        item("Your refund of 20 dollars was issued to your card."), output("The weather in Oslo is sunny today.")
    )

    assert score.passed is False
    assert 0.0 <= score.score <= 0.5  # type: ignore[operator]
    assert score.reason.startswith("cosine similarity ")


def test_embedding_similarity_threshold_must_be_within_zero_and_one():
    with pytest.raises(EvaluatorConfigError) as raised:
        EmbeddingSimilarity(threshold=1.5)

    assert raised.value.field == "threshold"


# --- versions and configs -----------------------------------------------------------------------------


def test_a_built_in_version_changes_with_its_configuration():
    assert RegexMatch(pattern="a").version == RegexMatch(pattern="a").version
    assert RegexMatch(pattern="a").version != RegexMatch(pattern="b").version
    assert str(RegexMatch(pattern="a").version).startswith("1-")


def test_a_label_names_the_evaluator_without_changing_its_version():
    labelled = RegexMatch(pattern="a", label="mentions_a")

    assert labelled.name == "mentions_a"
    assert labelled.version == RegexMatch(pattern="a").version
    assert labelled.evaluate(item(), output("a")).evaluator == "mentions_a"


@pytest.mark.parametrize(
    "config",
    [
        {"type": "exact_match", "strip": False},
        {"type": "normalised_match", "normalise_numbers": True},
        {"type": "regex", "pattern": r"\d+", "mode": "fullmatch", "flags": ["IGNORECASE"]},
        {"type": "json_schema", "schema": SCHEMA, "strip_code_fence": True},
        {"type": "numeric_tolerance", "absolute_tolerance": 0.1, "relative_tolerance": 0.0, "extract": "last"},
        {"type": "tool_calls", "arguments": "exact", "order": "ordered", "extra_calls_allowed": False},
        {"type": "final_state", "mode": "exact", "label": "db_state"},
        {"type": "embedding_similarity", "threshold": 0.7},
    ],
)
def test_every_built_in_round_trips_through_its_config(config):
    evaluator = evaluator_from_config(config)
    rebuilt = evaluator_from_config(evaluator.config())  # type: ignore[attr-defined]

    assert evaluator.config()["type"] == config["type"]  # type: ignore[attr-defined]
    assert rebuilt == evaluator
    assert rebuilt.version == evaluator.version


def test_every_built_in_type_has_a_config_test():
    assert set(BUILT_INS) == {
        "exact_match",
        "normalised_match",
        "regex",
        "json_schema",
        "numeric_tolerance",
        "tool_calls",
        "final_state",
        "embedding_similarity",
    }


def test_a_config_builds_a_working_evaluator():
    evaluator = evaluator_from_config({"type": "regex", "pattern": "^ok$", "flags": ["i"], "mode": "fullmatch"})

    assert evaluator.evaluate(item(), output("OK")).passed is True


@pytest.mark.parametrize(
    ("config", "field", "message"),
    [
        ({}, "type", "type: is required"),
        ({"type": "regexp"}, "type", "type: must be one of exact_match, normalised_match, regex"),
        ([("type", "regex")], "type", "type: an evaluator config is an object, got list"),
        ({"type": "regex"}, "pattern", "pattern: must not be empty"),
        ({"type": "regex", "pattern": 7}, "pattern", "pattern: must be a string, got 7"),
        ({"type": "regex", "pattern": "[a-"}, "pattern", "pattern: does not compile"),
        ({"type": "regex", "pattern": "a", "flags": "i"}, "flags", "flags: must be a list of flag names"),
        ({"type": "regex", "pattern": "a", "flags": [1]}, "flags", "flags: unknown flag 1"),
        ({"type": "regex", "pattern": "a", "ignorecase": True}, "ignorecase", "ignorecase: is not a setting of regex"),
        ({"type": "exact_match", "strip": "yes"}, "strip", "strip: must be true or false, got 'yes'"),
        ({"type": "exact_match", "label": 3}, "label", "label: must be a string"),
        ({"type": "json_schema", "schema": "object"}, "schema", "schema: must be a JSON Schema object"),
        ({"type": "json_schema", "schema": {"minimum": "one"}}, "schema", "schema: is not a valid JSON Schema"),
        (
            {"type": "numeric_tolerance", "absolute_tolerance": "0.1"},
            "absolute_tolerance",
            "absolute_tolerance: must be a number",
        ),
        (
            {"type": "numeric_tolerance", "absolute_tolerance": True},
            "absolute_tolerance",
            "absolute_tolerance: must be a number",
        ),
        (
            {"type": "numeric_tolerance", "relative_tolerance": float("inf")},
            "relative_tolerance",
            "relative_tolerance: must be a finite",
        ),
        ({"type": "numeric_tolerance", "extract": "middle"}, "extract", "extract: must be one of whole, first, last"),
        ({"type": "numeric_tolerance", "expected": "42"}, "expected", "expected: must be a number"),
        ({"type": "tool_calls", "order": "sorted"}, "order", "order: must be one of ordered, unordered"),
        ({"type": "tool_calls", "arguments": "superset"}, "arguments", "arguments: must be one of subset, exact"),
        (
            {"type": "tool_calls", "extra_calls_allowed": 1},
            "extra_calls_allowed",
            "extra_calls_allowed: must be true or false",
        ),
        ({"type": "final_state", "mode": "superset"}, "mode", "mode: must be one of subset, exact"),
        ({"type": "embedding_similarity", "threshold": -0.1}, "threshold", "threshold: must be within 0..1"),
        ({"type": "custom"}, "name", "name: a custom verifier config needs the verifier's name"),
        ({"type": "custom", "name": "x", "pattern": "a"}, "pattern", "pattern: is not a setting of custom"),
        ({"type": "custom", "name": "x", "version": 1.5}, "version", "version: must be an int or a string"),
        (
            {"type": "custom", "name": "no_such_verifier_anywhere"},
            "name",
            "name: no verifier 'no_such_verifier_anywhere'",
        ),
    ],
)
def test_config_errors_name_the_field(config, field, message):
    with pytest.raises(EvaluatorConfigError) as raised:
        evaluator_from_config(config)

    assert raised.value.field == field
    assert str(raised.value).startswith(message)
    assert isinstance(raised.value, ValueError)


# --- custom verifiers ---------------------------------------------------------------------------------


def test_a_registered_bool_verifier_is_normalised_into_a_score():
    verifiers = VerifierRegistry()

    @verifiers.verifier("polite", version=2)
    def polite(item: EvalItem, output: EvalOutput) -> bool:
        return "please" in output.text

    evaluator = verifiers.get("polite")
    assert polite(item(), output("please")) is True  # the decorator returns the function itself
    assert evaluator.evaluate(item(), output("please wait")) == Score("polite", 2, 1.0, True)
    assert evaluator.evaluate(item(), output("wait")) == Score("polite", 2, 0.0, False)


def test_a_float_verifier_passes_at_its_threshold():
    verifiers = VerifierRegistry()
    verifiers.register("length", 1, lambda item, output: min(1.0, len(output.text) / 10), pass_threshold=0.5)
    evaluator = verifiers.get("length", 1)

    assert evaluator.evaluate(item(), output("abcde")) == Score("length", 1, 0.5, True)
    assert evaluator.evaluate(item(), output("abc")) == Score("length", 1, 0.3, False)


def test_a_float_verifier_passes_only_a_perfect_score_by_default():
    verifiers = VerifierRegistry()
    verifiers.register("half", 1, lambda item, output: 0.99)

    assert verifiers.get("half").evaluate(item(), output()).passed is False


def test_a_score_from_a_verifier_is_stamped_with_its_name_and_version():
    verifiers = VerifierRegistry()
    verifiers.register("scored", "2024-06", lambda item, output: Score("whatever", 0, 0.7, True, "looks right"))

    assert verifiers.get("scored").evaluate(item(), output()) == Score("scored", "2024-06", 0.7, True, "looks right")


def test_a_verifier_result_of_the_wrong_kind_raises_and_is_errored_safely():
    verifiers = VerifierRegistry()
    verifiers.register("too_big", 1, lambda item, output: 3)
    verifiers.register("text", 1, lambda item, output: "yes")  # type: ignore[arg-type,return-value]

    with pytest.raises(ValueError, match=r"outside 0\.\.1"):
        verifiers.get("too_big").evaluate(item(), output())
    score = evaluate_safely(verifiers.get("text"), item(), output())
    assert score == Score(
        "text", 1, None, False, error="TypeError: verifier 'text' returned str; expected a Score, bool or number"
    )


def test_registering_a_name_and_version_twice_raises():
    verifiers = VerifierRegistry()
    verifiers.register("dup", 1, lambda item, output: True)

    with pytest.raises(VerifierAlreadyRegistered, match="'dup' version 1 is already registered"):
        verifiers.register("dup", 1, lambda item, output: False)
    verifiers.register("dup", 2, lambda item, output: False)
    assert verifiers.available() == [("dup", 1), ("dup", 2)]


def test_get_without_a_version_returns_the_latest_registered():
    verifiers = VerifierRegistry()
    verifiers.register("v", 1, lambda item, output: True)
    verifiers.register("v", 2, lambda item, output: False)

    assert verifiers.get("v").version == 2
    assert verifiers.get("v", 1).version == 1
    with pytest.raises(VerifierNotFound):
        verifiers.get("v", 3)
    with pytest.raises(VerifierNotFound):
        verifiers.get("w")


def test_register_refuses_a_bad_name_version_or_threshold():
    verifiers = VerifierRegistry()

    with pytest.raises(ValueError, match="non-empty name"):
        verifiers.register("", 1, lambda item, output: True)
    with pytest.raises(ValueError, match="int or a string"):
        verifiers.register("x", True, lambda item, output: True)
    with pytest.raises(ValueError, match="pass_threshold"):
        verifiers.register("x", 1, lambda item, output: True, pass_threshold=2.0)
    assert verifiers.available() == []


def test_a_custom_verifier_is_found_from_a_config():
    verifiers = VerifierRegistry()
    verifiers.register("non_empty", 1, lambda item, output: bool(output.text.strip()))
    verifiers.register("non_empty", 2, lambda item, output: len(output.text.strip()) > 3)

    latest = evaluator_from_config({"type": "custom", "name": "non_empty"}, verifiers=verifiers)
    pinned = evaluator_from_config({"type": "custom", "name": "non_empty", "version": 1}, verifiers=verifiers)

    assert isinstance(latest, CustomVerifier)
    assert (latest.version, pinned.version) == (2, 1)
    assert pinned.evaluate(item(), output("ok")).passed is True
    assert latest.evaluate(item(), output("ok")).passed is False


def test_the_module_level_registry():
    @verifier("evals.tests.test_verifiers.mentions_refund", version=1)
    def mentions_refund(item: EvalItem, output: EvalOutput) -> bool:
        return "refund" in output.text.casefold()

    assert ("evals.tests.test_verifiers.mentions_refund", 1) in verifiers_available()
    evaluator = verifier_get("evals.tests.test_verifiers.mentions_refund")
    assert evaluator.evaluate(item(), output("Refund issued")).passed is True
    with pytest.raises(VerifierAlreadyRegistered):
        verifier("evals.tests.test_verifiers.mentions_refund", version=1)(mentions_refund)
    from_config = evaluator_from_config({"type": "custom", "name": "evals.tests.test_verifiers.mentions_refund"})
    assert from_config is evaluator


# --- evaluate_safely ----------------------------------------------------------------------------------


def test_evaluate_safely_passes_a_score_through():
    assert evaluate_safely(ExactMatch(), item("a"), output("a")) == ExactMatch().evaluate(item("a"), output("a"))


def test_evaluate_safely_turns_an_evaluation_error_into_an_errored_score_not_a_zero():
    score = evaluate_safely(ExactMatch(), item(None), output("a"))

    assert score == Score(
        "exact_match", ExactMatch().version, None, False, error="EvaluationError: the item has no reference output"
    )
    assert score.errored is True


def test_evaluate_safely_catches_any_exception_from_a_custom_verifier():
    verifiers = VerifierRegistry()

    @verifiers.verifier("broken", version=3)
    def broken(item: EvalItem, output: EvalOutput) -> bool:
        raise KeyError("expected_city")

    score = evaluate_safely(verifiers.get("broken"), item(), output())

    assert score == Score("broken", 3, None, False, error="KeyError: 'expected_city'")


def test_evaluate_safely_errors_an_evaluator_that_returns_something_else():
    class Sloppy:
        name = "sloppy"
        version = 1

        def evaluate(self, item: EvalItem, output: EvalOutput) -> Score:
            return True  # type: ignore[return-value]

    assert evaluate_safely(Sloppy(), item(), output()) == Score(
        "sloppy", 1, None, False, error="evaluator returned bool, not a Score"
    )
