"""Curations and exports end to end: an eval run's k answers per item become groups with the run's scores as
rewards, the preview counts them, and each format's file is written by the export task with its manifest;
refusals write nothing, a cancelled export leaves no file, a restarted one starts its file over."""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from django.utils import timezone

from agent_registry import services as registry_services
from agent_registry.models import Workspace
from routing.tests.conftest import Gateway
from tracing import services as tracing_services
from tracing.models import IngestBatch, Trajectory
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
        # Each trajectory's figures, as stored, for the trainer's logs (ART logs a trajectory's metrics).
        for trajectory in group["trajectories"]:
            stored = Trajectory.objects.get(trace_id=trajectory["metadata"]["trace_id"])
            assert trajectory["metrics"]["steps"] == stored.step_count > 0
            assert trajectory["metrics"]["tokens"] == stored.total_tokens
            # The fake gateway model has no price: no cost is logged rather than $0.
            assert (stored.cost_usd, stored.unpriced_call_count > 0) == (None, True)
            assert "cost_usd" not in trajectory["metrics"]
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


def _held_out_curation(gateway: Gateway, run: Any) -> Any:
    """All four items as groups, with a seed whose validation split holds some of them and not all."""
    curation = _curation(gateway, run, dedupe=False, drop_equal_rewards=False, validation_share=0.5)
    for seed in range(100):
        services.curation_update(curation=curation, filters={**curation.filters, "seed": seed})
        splits = services.curation_preview(
            workspace=gateway.workspace, snapshot=services.curation_snapshot(curation)
        ).preview.splits
        if splits["train"] and splits["validation"]:
            return curation
    raise AssertionError("no seed splits four tasks into two non-empty sets")


def test_openai_refuses_a_file_of_both_splits_and_exports_each_split_as_its_own_file(
    gateway: Gateway, run: Any, media: Path
) -> None:
    """Before, an OpenAI export of a curation with a validation share held the validation tasks as training
    examples, and no export could hold one split only (OpenAI's validation_file)."""
    curation = _held_out_curation(gateway, run)
    splits = services.curation_preview(
        workspace=gateway.workspace, snapshot=services.curation_snapshot(curation)
    ).preview.splits

    with pytest.raises(services.ExportRefused) as refused:
        services.export_create(curation=curation, format="openai", dispatch=False)
    assert refused.value.extra["errors"][0]["field"] == "format"
    assert "separate files" in refused.value.detail
    assert not Export.objects.exists()

    written = {}
    for split in ("train", "validation"):
        export = services.export_create(curation=curation, format="openai", split=split, dispatch=False)
        assert export.groups_total == splits[split]
        done = services.export_execute(export_id=export.pk)
        assert done is not None
        assert done.status == JobStatus.SUCCEEDED, done.error
        assert done.manifest["curation"]["split"] == split
        written[split] = Path(done.path).read_bytes()
    # Each item's answers are all "ok" or all "no" and only "ok" passes; item by item, what a file holds is its
    # own split's passing answers, so the two files share no example and together hold each passing one once.
    sft_all = _export(curation, "trl_sft")
    rows = [json.loads(line) for line in Path(sft_all.path).read_bytes().splitlines()]
    for split in ("train", "validation"):
        examples = [json.loads(line)["messages"] for line in written[split].splitlines()]
        expected = [row["messages"] for row in rows if row["split"] == split]
        assert [[m["content"] for m in e if m["role"] == "assistant"] for e in examples] == [
            [m["content"] for m in e if m["role"] == "assistant"] for e in expected
        ]
    assert sum(len(content.splitlines()) for content in written.values()) == len(rows)


def test_an_export_of_one_split_holds_only_its_groups(gateway: Gateway, run: Any) -> None:
    curation = _held_out_curation(gateway, run)
    for split in ("train", "validation"):
        done = _export_split(curation, "art", split)
        lines = [json.loads(line) for line in Path(done.path).read_bytes().splitlines()]
        assert lines
        assert {line["metadata"]["split"] for line in lines} == {split}


def test_an_unknown_split_is_refused(gateway: Gateway, run: Any) -> None:
    with pytest.raises(services.ExportRefused) as refused:
        services.export_create(curation=_curation(gateway, run), format="art", split="test", dispatch=False)
    assert refused.value.extra["errors"] == [{"field": "split", "message": "unknown split"}]
    assert not Export.objects.exists()


def _export_split(curation: Any, format: str, split: str) -> Export:
    export = services.export_create(curation=curation, format=format, split=split, dispatch=False)
    done = services.export_execute(export_id=export.pk)
    assert done is not None
    assert done.status == JobStatus.SUCCEEDED, done.error
    return done


def test_the_api_exports_one_split_and_refuses_a_bad_one(gateway: Gateway, run: Any, api_client_for: Any) -> None:
    curation = _held_out_curation(gateway, run)
    client = api_client_for(gateway.workspace, scopes=("read", "write"))
    url = f"/api/v1/curations/{curation.name}/exports"

    bad = client.post(url, data={"format": "art", "split": "test"}, content_type="application/json")
    both = client.post(url, data={"format": "openai"}, content_type="application/json")
    assert (bad.status_code, both.status_code) == (422, 422)
    assert both.json()["code"] == "export_refused"
    assert bad.json()["code"] == "validation_error"
    assert "split" in bad.json()["detail"]
    assert not Export.objects.exists()

    with mock.patch("trainer_bridge.tasks.export_execute.delay"):
        accepted = client.post(url, data={"format": "openai", "split": "train"}, content_type="application/json")
    assert accepted.status_code == 202, accepted.content
    assert Export.objects.get(pk=accepted.json()["id"]).curation_snapshot["split"] == "train"


# --- Trajectories ingested as JSON: prompts and images ----------------------------------------------------

PNG_URL = (
    "data:image/png;base64,"
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
REMOTE_URL = "https://images.example.test/receipt.png"


def _receipt(system: str, answer: str, reward: float, content: Any = "What is the total?") -> dict[str, Any]:
    return {
        "name": "receipt",
        "task_id": "receipt-1",
        "reward": reward,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": content},
            {"role": "assistant", "content": answer},
        ],
    }


def _ingest(workspace: Workspace, *documents: dict[str, Any]) -> None:
    key, _ = registry_services.apikey_create(
        workspace=workspace, name=f"agent-{uuid.uuid4().hex[:8]}", scopes=["ingest"]
    )
    tracing_services.ingest_trajectories_accept(api_key=key, payload={"trajectories": list(documents)})
    for batch_id in IngestBatch.objects.filter(status="pending").values_list("pk", flat=True):
        tracing_services.span_batch_process(batch_id=batch_id)


def _receipts(workspace: Workspace) -> Any:
    return services.curation_create(
        workspace=workspace, name="receipts", query={}, grouping="task_id", reward={"source": "trajectory"}
    )


def test_a_dpo_export_pairs_only_trajectories_of_one_system_prompt(workspace: Workspace) -> None:
    _ingest(
        workspace,
        _receipt("You read receipts.", "Twelve euros.", 1.0),
        _receipt("You read receipts. Answer in French.", "Je ne sais pas.", 0.0),
    )
    curation = _receipts(workspace)

    with pytest.raises(services.ExportRefused, match="DPO needs pairs"):
        services.export_create(curation=curation, format="trl_dpo", dispatch=False)
    assert not Export.objects.exists()

    _ingest(workspace, _receipt("You read receipts.", "No idea at all.", 0.0))
    export = _export(curation, "trl_dpo")

    assert export.status == JobStatus.SUCCEEDED
    (row,) = [json.loads(line) for line in Path(export.path).read_bytes().splitlines()]
    assert row["prompt"][0] == {"role": "system", "content": "You read receipts."}
    assert (row["chosen"][0]["content"], row["rejected"][0]["content"]) == ("Twelve euros.", "No idea at all.")
    assert export.curation_snapshot["preview"]["unpaired_by_prompt"] == 1
    assert export.manifest["counts"]["unpaired_by_prompt"] == 1
    assert export.manifest["notes"][0].startswith("1 rewarded rollouts were left unpaired")


def test_a_trl_export_keeps_the_images_an_agent_was_shown(workspace: Workspace) -> None:
    looked: list[dict[str, Any]] = [{"type": "text", "text": "What is the total?"}]
    looked += [{"type": "image_url", "image_url": {"url": url}} for url in (PNG_URL, REMOTE_URL)]
    _ingest(
        workspace,
        _receipt("You read receipts.", "Twelve euros.", 1.0, content=looked),
        _receipt("You read receipts.", "No idea.", 0.0, content=looked),
    )

    export = _export(_receipts(workspace), "trl_sft")

    (row,) = [json.loads(line) for line in Path(export.path).read_bytes().splitlines()]
    assert row["messages"][1]["content"] == [
        {"type": "text", "text": "What is the total?"},
        {"type": "image"},
        {"type": "image"},
    ]
    assert row["images"] == [PNG_URL, REMOTE_URL]
    counts = export.manifest["counts"]
    assert (counts["images"], counts["image_urls"], counts["images_dropped"]) == (1, 1, 0)
    assert any("not downloaded" in note for note in export.manifest["notes"])


def test_an_art_export_makes_each_prompt_of_a_task_a_group_and_says_how_many_tasks(workspace: Workspace) -> None:
    """Before, the receipt task was one ART group of both system prompts: each trajectory's advantage was its reward
    against the mean of the two prompts' rewards. Now each prompt's trajectories are a group, filtered as any."""
    plain, french, brief = "You read receipts.", "You read receipts. Answer in French.", "You read receipts. Be brief."
    _ingest(
        workspace,
        _receipt(plain, "Twelve euros.", 1.0),
        _receipt(french, "Douze euros.", 1.0),
        _receipt(plain, "No idea at all.", 0.0),
        _receipt(french, "Je ne sais pas.", 0.5),
        _receipt(brief, "12.", 1.0),  # a prompt with one trajectory: a group of one, which the size filter drops
    )
    curation = _receipts(workspace)

    as_tasks = services.curation_preview(workspace=workspace, snapshot=services.curation_snapshot(curation))
    art = _export(curation, "art")
    dpo = _export(curation, "trl_dpo")

    assert (as_tasks.preview.groups, as_tasks.preview.mixed_prompt_groups) == (1, 1)
    assert art.status == JobStatus.SUCCEEDED, art.error
    assert art.curation_snapshot["separate_prompts"] is True
    shown = art.curation_snapshot["preview"]
    assert (shown["groups"], shown["rollouts"], shown["tasks_separated_by_prompt"], shown["mixed_prompt_groups"]) == (
        2,
        4,
        1,
        0,
    )
    assert art.groups_total == 2
    written = [json.loads(line) for line in Path(art.path).read_bytes().splitlines()]
    by_system: dict[str, list[float]] = {}
    for line in written:
        (system,) = {t["messages_and_choices"][0]["content"] for t in line["trajectories"]}  # one prompt a group
        by_system[system] = sorted(t["reward"] for t in line["trajectories"])
    assert by_system == {plain: [0.0, 1.0], french: [0.5, 1.0]}
    assert {line["metadata"]["task_id"] for line in written} == {"task:receipt-1"}
    assert (art.manifest["counts"]["groups"], art.manifest["counts"]["tasks_separated_by_prompt"]) == (2, 1)
    assert art.manifest["curation"]["separate_prompts"] is True
    assert art.manifest["notes"][0].startswith("1 tasks were asked under more than one prompt")
    # DPO pairs within a prompt by itself: its groups stay the task's.
    assert dpo.curation_snapshot["separate_prompts"] is False
    assert (dpo.curation_snapshot["preview"]["groups"], dpo.curation_snapshot["preview"]["mixed_prompt_groups"]) == (
        1,
        1,
    )
    assert dpo.manifest["counts"]["tasks_separated_by_prompt"] == 0


def test_an_export_with_no_group_left_once_separated_by_prompt_is_refused(workspace: Workspace) -> None:
    """Each prompt's rewards are equal, so the task's rewards differ only between prompts: nothing to learn."""
    _ingest(
        workspace,
        _receipt("You read receipts.", "Twelve euros.", 1.0),
        _receipt("You read receipts.", "It is twelve euros.", 1.0),
        _receipt("You read receipts. Answer in French.", "Je ne sais pas.", 0.0),
        _receipt("You read receipts. Answer in French.", "Aucune idée.", 0.0),
    )
    curation = _receipts(workspace)

    with pytest.raises(services.ExportRefused, match="one group per prompt of each task"):
        services.export_create(curation=curation, format="art", dispatch=False)
    assert not Export.objects.exists()
    assert _export(curation, "trl_kto").status == JobStatus.SUCCEEDED
