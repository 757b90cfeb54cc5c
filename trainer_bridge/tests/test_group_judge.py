"""A curation rewarded by a group judge (RULER): one judge call per group, kept, so the export and later previews
read the rewards the preview was shown instead of asking the judge again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from evals import services as eval_services
from routing.tests.conftest import Gateway
from routing.tests.fakes import FakeGatewayLLM, say
from trainer_bridge import services
from trainer_bridge.models import GroupJudgement

pytestmark = pytest.mark.django_db

SCORES = (0.2, 0.9, 0.5, 0.1)


def _judge_reply() -> Any:
    ranked = [{"id": f"candidate-{n}", "score": score, "explanation": "e"} for n, score in enumerate(SCORES, 1)]
    return say(json.dumps({"reasoning": "compared", "scores": ranked}))


def _judge_calls(llm: FakeGatewayLLM) -> int:
    return sum("group_scores" in json.dumps(call.params.get("response_format") or {}) for call in llm.received)


def _judged_curation(gateway: Gateway, run: Any) -> Any:
    """The run's groups, rewarded by a RULER-style group judge on the `fast` target."""
    eval_services.evaluator_create(
        workspace=gateway.workspace, name="ruler", config={"type": "group_judge", "model": "fast"}
    )
    return services.curation_create(
        workspace=gateway.workspace,
        name="judged",
        query={"runs": [run.pk]},
        grouping="dataset_item",
        reward={"source": "group_judge", "evaluator": "ruler"},
        filters={"dedupe": False},
    )


def test_the_group_judge_is_asked_once_per_group_across_previews_and_the_export(
    gateway: Gateway,
    run: Any,
    fake: FakeGatewayLLM,
) -> None:
    curation = _judged_curation(gateway, run)
    fake.script("fast", *[_judge_reply() for _ in range(4)])
    before = _judge_calls(fake)

    shown = services.curation_preview(workspace=gateway.workspace, snapshot=services.curation_snapshot(curation))
    assert _judge_calls(fake) - before == 4  # one call per item's group of four answers
    assert shown.preview.groups == 4  # the judge tells apart even the items whose answers all passed
    assert GroupJudgement.objects.count() == 4

    again = services.curation_preview(workspace=gateway.workspace, snapshot=services.curation_snapshot(curation))
    export = services.export_create(curation=curation, format="art", dispatch=False)
    done = services.export_execute(export_id=export.pk)

    assert _judge_calls(fake) - before == 4
    assert again.as_dict()["rewards"] == shown.as_dict()["rewards"]
    assert done is not None
    for line in Path(done.path).read_text().splitlines():
        assert sorted(t["reward"] for t in json.loads(line)["trajectories"]) == sorted(SCORES)


def test_a_judge_that_errs_is_asked_again_next_time(
    gateway: Gateway,
    run: Any,
    fake: FakeGatewayLLM,
) -> None:
    curation = _judged_curation(gateway, run)
    fake.script("fast", *[say("not json") for _ in range(20)])  # more than the judge's retries use

    unread = services.curation_preview(workspace=gateway.workspace, snapshot=services.curation_snapshot(curation))

    assert unread.preview.groups == 0  # errored scores reward nothing
    assert not GroupJudgement.objects.exists()
    fake.scripts["fast"].clear()
    fake.script("fast", *[_judge_reply() for _ in range(4)])
    judged = services.curation_preview(workspace=gateway.workspace, snapshot=services.curation_snapshot(curation))
    assert judged.preview.groups == 4
    assert GroupJudgement.objects.count() == 4


def _ranking(*scores: float) -> Any:
    ranked = [{"id": f"candidate-{n}", "score": score, "explanation": "e"} for n, score in enumerate(scores, 1)]
    return say(json.dumps({"reasoning": "compared", "scores": ranked}))


def test_for_a_group_relative_export_the_judge_ranks_one_prompt_at_a_time(
    gateway: Gateway,
    fake: FakeGatewayLLM,
) -> None:
    """RULER scores a group's rollouts against each other: for ART it must see one prompt's rollouts, or the
    scores would rank the prompts. Before, it ranked the task's four answers of both system prompts at once."""
    from trainer_bridge.tests.test_exports import _ingest, _receipt

    plain, french = "You read receipts.", "You read receipts. Answer in French."
    _ingest(
        gateway.workspace,
        _receipt(plain, "Twelve euros.", 0.0),
        _receipt(french, "Douze euros.", 0.0),
        _receipt(plain, "No idea at all.", 0.0),
        _receipt(french, "Je ne sais pas.", 0.0),
    )
    eval_services.evaluator_create(
        workspace=gateway.workspace, name="ruler", config={"type": "group_judge", "model": "fast"}
    )
    curation = services.curation_create(
        workspace=gateway.workspace,
        name="judged-receipts",
        query={},
        grouping="task_id",
        reward={"source": "group_judge", "evaluator": "ruler"},
    )
    fake.script("fast", _ranking(0.9, 0.2), _ranking(0.7, 0.4))
    before = len(fake.received)

    export = services.export_create(curation=curation, format="art", dispatch=False)
    done = services.export_execute(export_id=export.pk)

    judged = [json.dumps(call.messages) for call in fake.received[before:]]
    assert len(judged) == 2
    for answers in judged:
        assert ("Twelve euros." in answers) == ("No idea at all." in answers)
        assert ("Twelve euros." in answers) != ("Douze euros." in answers)
    assert done is not None
    assert done.manifest["counts"]["groups"] == 2
    assert GroupJudgement.objects.count() == 2
