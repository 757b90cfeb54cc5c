"""Curations and exports end to end: an eval run's k answers per item become groups with the run's scores as
rewards, the preview counts them, and each format's file is written by the export task with its manifest;
refusals write nothing, a cancelled export leaves no file, a restarted one starts its file over."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from routing.tests.conftest import Gateway
from trainer_bridge import services
from trainer_bridge.models import Export, JobStatus

pytestmark = pytest.mark.django_db


def _curation(gateway: Gateway, run: Any, **filters: Any) -> Any:
    return services.curation_create(
        workspace=gateway.workspace,
        name="from-run",
        query={"runs": [run.pk]},
        grouping="dataset_item",
        reward={"source": "run_score", "evaluator": "says_ok"},
        filters=filters,
    )


def _export(curation: Any, format: str) -> Export:
    export = services.export_create(curation=curation, format=format, dispatch=False)
    done = services.export_execute(export_id=export.pk)
    assert done is not None
    return done


def test_the_preview_counts_groups_with_signal_for_a_group_relative_update(gateway: Gateway, run: Any) -> None:
    curation = _curation(gateway, run)

    found = services.curation_preview(workspace=gateway.workspace, snapshot=services.curation_snapshot(curation))

    assert found.trajectories == 16
    # The all-right and all-wrong items carry no signal for a group-relative update and are dropped.
    assert found.preview.groups == 2
    # Identical answers to one item are near-identical trajectories: one of each is kept...
    assert found.preview.rollouts == 4
    summary = found.as_dict()
    assert summary["rewards"]["min"] == 0.0
    assert summary["rewards"]["max"] == 1.0
    # ...unless dedupe is off.
    services.curation_update(curation=curation, filters={"dedupe": False})
    again = services.curation_preview(workspace=gateway.workspace, snapshot=services.curation_snapshot(curation))
    assert again.preview.rollouts == 8


def test_an_art_export_writes_each_group_and_a_manifest_with_the_files_checksum(gateway: Gateway, run: Any) -> None:
    export = _export(_curation(gateway, run), "art")

    assert export.status == JobStatus.SUCCEEDED
    content = Path(export.path).read_bytes()
    assert export.sha256 == hashlib.sha256(content).hexdigest()
    assert export.bytes == len(content)
    lines = [json.loads(line) for line in content.splitlines()]
    assert len(lines) == 2
    # A group's task is its dataset item by dataset, version and position (the same in every database).
    assert sorted(group["metadata"]["task_id"] for group in lines) == ["item:regressions/v1/0", "item:regressions/v1/2"]
    for group in lines:
        rewards = sorted(trajectory["reward"] for trajectory in group["trajectories"])
        assert rewards == [0.0, 1.0]
        assert all(t["messages_and_choices"][-1]["role"] == "assistant" for t in group["trajectories"])
    assert export.manifest["counts"]["groups"] == 2
    assert export.manifest["curation"]["name"] == "from-run"
    assert export.groups_done == 2


@pytest.mark.parametrize("format", ["trl_sft", "trl_dpo", "trl_kto", "openai", "nemo_gym"])
def test_every_format_exports_the_same_curation(gateway: Gateway, run: Any, format: str) -> None:
    export = _export(_curation(gateway, run), format)

    assert export.status == JobStatus.SUCCEEDED, export.error
    lines = Path(export.path).read_bytes().splitlines()
    assert lines
    assert all(json.loads(line) for line in lines)


def test_a_format_that_cannot_represent_the_curation_is_refused_before_any_file(
    gateway: Gateway, run: Any, media: Path
) -> None:
    # Nothing is rewarded, and groups are kept anyway: DPO has no pair to make.
    everything_equal = services.curation_create(
        workspace=gateway.workspace,
        name="all-equal",
        query={"runs": [run.pk]},
        grouping="dataset_item",
        reward={"source": "trajectory"},  # no trajectory reports a reward: nothing is rewarded
        filters={"drop_unrewarded": False, "drop_equal_rewards": False},
    )

    with pytest.raises(services.ExportRefused) as refused:
        services.export_create(curation=everything_equal, format="trl_dpo", dispatch=False)

    assert refused.value.extra["errors"][0]["field"] == "format"
    assert not Export.objects.exists()
    assert not (media / "media" / "exports").exists() or not any((media / "media" / "exports").iterdir())


def test_an_empty_curation_is_refused(gateway: Gateway, run: Any) -> None:
    empty = services.curation_create(
        workspace=gateway.workspace,
        name="nothing",
        query={"tags": ["no-such-tag"]},
        reward={"source": "run_score", "evaluator": "says_ok"},
    )
    with pytest.raises(services.ExportRefused) as refused:
        services.export_create(curation=empty, format="art", dispatch=False)
    assert "selects no groups" in refused.value.detail
    assert not Export.objects.exists()


def test_a_cancelled_export_writes_no_file(gateway: Gateway, run: Any) -> None:
    export = services.export_create(curation=_curation(gateway, run), format="art", dispatch=False)
    services.export_cancel(export=export)

    assert services.export_execute(export_id=export.pk) is None
    export.refresh_from_db()
    assert export.status == JobStatus.CANCELLED
    assert export.path == ""
    with pytest.raises(services.ExportNotReady):
        services.export_file(export=export)


def test_an_export_whose_worker_died_starts_its_file_over(gateway: Gateway, run: Any) -> None:
    export = services.export_create(curation=_curation(gateway, run), format="art", dispatch=False)
    # A worker claimed it, wrote half a line and was killed.
    Export.objects.filter(pk=export.pk).update(status=JobStatus.RUNNING, claimed_at=timezone.now())
    partial = services.export_dir() / f"export-{export.pk}-art.partial"
    partial.write_bytes(b'{"trajectories": [{"messa')
    assert services.export_execute(export_id=export.pk) is None  # the lease still holds
    Export.objects.filter(pk=export.pk).update(
        claimed_at=timezone.now() - timedelta(seconds=services.EXPORT_LEASE_SECONDS + 1)
    )
    assert export.pk in services.exports_sweep()

    done = services.export_execute(export_id=export.pk)

    assert done is not None
    assert done.status == JobStatus.SUCCEEDED
    assert not partial.exists()
    lines = Path(done.path).read_bytes().splitlines()
    assert [len(json.loads(line)["trajectories"]) for line in lines] == [2, 2]


def test_a_bad_curation_names_the_field(gateway: Gateway) -> None:
    with pytest.raises(services.CurationInvalid) as caught:
        services.curation_create(
            workspace=gateway.workspace,
            name="bad",
            query={"colour": "red"},
            reward={"source": "score"},
            filters={"min_group_size": 0},
        )
    fields = [error["field"] for error in caught.value.extra["errors"]]
    assert "query.colour" in fields
    assert "reward.name" in fields


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"scores": [{"name": "helpful", "min": "high"}]}, "query.scores"),
        ({"scores": [{"name": "helpful", "max": [1]}]}, "query.scores"),
        ({"prompt_versions": [{"prompt": "support/system", "version": "two"}]}, "query.prompt_versions"),
        ({"review": {"failure_modes": "wrong_tool"}}, "query.review"),
        ({"review": {"informative": "false"}}, "query.review"),
    ],
)
def test_a_query_value_of_the_wrong_type_is_refused_before_it_reaches_the_database(
    gateway: Gateway, query: dict[str, Any], field: str
) -> None:
    # These went through to the ORM: a 500 on preview and export, or a string read as a list of characters.
    with pytest.raises(services.CurationInvalid) as caught:
        services.curation_validate(query=query, grouping="auto", reward={"source": "trajectory"}, filters={})

    assert [error["field"] for error in caught.value.extra["errors"]] == [field]
