"""The management plane's writes: model targets (API and environment), router configuration, chains, tools
and hand-offs. Every refused write leaves the rows as they were."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from agent_registry.tests.factories import AgentFactory, UserFactory, prompt_with_versions
from config import crypto
from routing import exceptions, services
from routing.models import (
    AgentTool,
    ChainStep,
    Handoff,
    HandoffStatus,
    ModelTarget,
    RouterConfig,
    RoutingDecision,
    TargetSource,
)
from routing.tests.factories import ModelTargetFactory, RouterConfigFactory

pytestmark = pytest.mark.django_db


def _targets() -> list[tuple[Any, ...]]:
    return list(
        ModelTarget.objects.order_by("pk").values_list(
            "workspace_id", "alias", "model", "api_key_encrypted", "fallbacks", "source", "enabled", "timeout_seconds"
        )
    )


def _fields(error: Any) -> list[str]:
    return [item["field"] for item in error.value.extra["errors"]]


# --- Model targets ----------------------------------------------------------------------------------


def test_a_target_is_created_with_its_key_encrypted(workspace):
    target = services.model_target_create(
        workspace=workspace,
        alias="fast",
        model="openai/gpt-4o-mini",
        api_key="sk-secret",
        tier="single_call",
        timeout_seconds=12,
    )

    stored = ModelTarget.objects.get(pk=target.pk)
    assert (stored.alias, stored.model, stored.tier, stored.timeout_seconds) == (
        "fast",
        "openai/gpt-4o-mini",
        "single_call",
        12.0,
    )
    assert stored.source == TargetSource.API
    assert "sk-secret" not in stored.api_key_encrypted
    assert crypto.decrypt(stored.api_key_encrypted) == "sk-secret"


def test_an_alias_is_unique_in_its_workspace_only(workspace, other_workspace):
    ModelTargetFactory.create(workspace=workspace, alias="fast")
    ModelTargetFactory.create(workspace=other_workspace, alias="other")
    before = _targets()

    with pytest.raises(exceptions.ModelTargetAliasTaken) as error:
        services.model_target_create(workspace=workspace, alias="fast", model="openai/gpt-4o")

    assert error.value.status == 409
    assert _targets() == before
    services.model_target_create(workspace=other_workspace, alias="fast", model="openai/gpt-4o")


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"model": "  "}, "model"),
        ({"alias": "not a slug"}, "alias"),
        ({"api_base": "not-a-url"}, "api_base"),
        ({"api_base": "ftp://models.example/v1"}, "api_base"),
        ({"api_base": "http://vllm:99999/v1"}, "api_base"),
        ({"api_base": "http://my host:8000/v1"}, "api_base"),
        ({"api_base": "http://" + "a" * 500}, "api_base"),
        ({"tier": "quantum"}, "tier"),
        ({"timeout_seconds": 0}, "timeout_seconds"),
        ({"max_retries": -1}, "max_retries"),
        ({"fallbacks": ["nowhere"]}, "fallbacks"),
        ({"fallbacks": ["fast"]}, "fallbacks"),
    ],
)
def test_an_invalid_target_is_refused_by_field(workspace, changes, field):
    arguments = {"workspace": workspace, "alias": "fast", "model": "openai/gpt-4o", **changes}

    with pytest.raises(exceptions.ModelTargetInvalid) as error:
        services.model_target_create(**arguments)

    assert error.value.status == 422
    assert field in _fields(error)
    assert _targets() == []


@pytest.mark.parametrize(
    "api_base", ["http://ollama:11434", "http://vllm:8000/v1", "https://models.example/v1", "http://[::1]:8000/v1"]
)
def test_an_api_base_may_name_a_bare_host_as_a_compose_service_does(workspace, api_base):
    target = services.model_target_create(workspace=workspace, alias="local", model="openai/qwen", api_base=api_base)

    assert ModelTarget.objects.get(pk=target.pk).api_base == api_base


def test_fallbacks_name_targets_of_the_same_workspace(workspace, other_workspace):
    ModelTargetFactory.create(workspace=other_workspace, alias="theirs")
    local = ModelTargetFactory.create(workspace=workspace, alias="local")

    with pytest.raises(exceptions.ModelTargetInvalid):
        services.model_target_create(workspace=workspace, alias="fast", model="m", fallbacks=["theirs"])
    target = services.model_target_create(workspace=workspace, alias="fast", model="m", fallbacks=[local.alias])

    assert target.fallbacks == ["local"]


def test_an_update_keeps_the_key_unless_given_and_never_touches_health(workspace):
    target = services.model_target_create(
        workspace=workspace, alias="fast", model="openai/gpt-4o-mini", api_key="sk-one"
    )
    ModelTarget.objects.filter(pk=target.pk).update(consecutive_failures=2, last_error="timeout")
    stored_key = ModelTarget.objects.get(pk=target.pk).api_key_encrypted

    updated = services.model_target_update(target=target, model="openai/gpt-4o", api_key=None, max_retries=4)

    assert (updated.model, updated.max_retries, updated.api_key_encrypted) == ("openai/gpt-4o", 4, stored_key)
    assert ModelTarget.objects.get(pk=target.pk).consecutive_failures == 2
    assert ModelTarget.objects.get(pk=target.pk).last_error == "timeout"
    services.model_target_update(target=updated, api_key="sk-two")
    assert crypto.decrypt(ModelTarget.objects.get(pk=target.pk).api_key_encrypted) == "sk-two"
    services.model_target_update(target=updated, api_key="")
    assert ModelTarget.objects.get(pk=target.pk).api_key_encrypted == ""


def test_an_update_refuses_a_new_alias_and_unknown_fields(workspace):
    target = ModelTargetFactory.create(workspace=workspace, alias="fast")
    before = _targets()

    with pytest.raises(exceptions.ModelTargetInvalid):
        services.model_target_update(target=target, alias="faster")
    with pytest.raises(exceptions.ModelTargetInvalid) as error:
        services.model_target_update(target=target, consecutive_failures=0)

    assert _fields(error) == ["consecutive_failures"]
    assert _targets() == before


def test_environment_targets_are_read_only(workspace):
    target = ModelTargetFactory.create(workspace=workspace, alias="fast", source=TargetSource.ENVIRONMENT)
    before = _targets()

    with pytest.raises(exceptions.ModelTargetReadOnly) as update_error:
        services.model_target_update(target=target, model="x")
    with pytest.raises(exceptions.ModelTargetReadOnly):
        services.model_target_delete(target=target)

    assert update_error.value.status == 409
    assert _targets() == before


def test_a_target_in_use_is_not_deleted(workspace):
    agent = AgentFactory.create(workspace=workspace)
    strong = ModelTargetFactory.create(workspace=workspace, alias="strong")
    ModelTargetFactory.create(workspace=workspace, alias="fast", fallbacks=["strong"])
    step_target = ModelTargetFactory.create(workspace=workspace, alias="stepper")
    services.chain_steps_set(agent=agent, steps=[{"name": "draft", "instructions": "Draft", "model_target": "stepper"}])
    before = _targets()

    with pytest.raises(exceptions.ModelTargetInUse, match="fallback of fast"):
        services.model_target_delete(target=strong)
    with pytest.raises(exceptions.ModelTargetInUse, match="chain step"):
        services.model_target_delete(target=step_target)

    assert _targets() == before


def test_deleting_a_target_clears_it_from_router_configurations(workspace):
    target = ModelTargetFactory.create(workspace=workspace, alias="fast")
    config = RouterConfigFactory.create(agent=AgentFactory.create(workspace=workspace), single_call_target=target)

    services.model_target_delete(target=target)

    assert not ModelTarget.objects.filter(pk=target.pk).exists()
    assert RouterConfig.objects.get(pk=config.pk).single_call_target is None


# --- KEEL_MODEL_TARGETS -----------------------------------------------------------------------------

SPEC = json.dumps(
    [
        {
            "alias": "fast",
            "model": "openai/gpt-4o-mini",
            "api_key": "sk-env",
            "tier": "single_call",
            "fallbacks": ["local"],
        },
        {"alias": "local", "model": "openai/qwen", "api_base": "http://127.0.0.1:8001/v1", "timeout_seconds": 60},
    ]
)


def test_the_environment_declares_targets_idempotently(workspace):
    first = services.model_targets_sync_from_env(workspace=workspace, spec=SPEC)
    again = services.model_targets_sync_from_env(workspace=workspace, spec=SPEC)

    assert (first.created, first.updated, first.retired) == (["fast", "local"], [], [])
    assert (again.created, again.updated, again.unchanged) == ([], [], ["fast", "local"])
    fast = ModelTarget.objects.get(workspace=workspace, alias="fast")
    assert (fast.source, fast.fallbacks, fast.tier) == (TargetSource.ENVIRONMENT, ["local"], "single_call")
    assert crypto.decrypt(fast.api_key_encrypted) == "sk-env"
    assert ModelTarget.objects.get(workspace=workspace, alias="local").timeout_seconds == 60.0


def test_a_target_left_out_of_the_environment_is_disabled_and_a_dashboard_one_is_taken_over(workspace):
    services.model_targets_sync_from_env(workspace=workspace, spec=SPEC)
    ModelTargetFactory.create(workspace=workspace, alias="mine", model="openai/gpt-4o")
    ModelTarget.objects.filter(alias="local").update(consecutive_failures=3)
    spec = json.dumps([{"alias": "local", "model": "openai/qwen2"}, {"alias": "mine", "model": "openai/o3"}])

    result = services.model_targets_sync_from_env(workspace=workspace, spec=spec)

    assert (result.created, result.updated, result.retired) == ([], ["local", "mine"], ["fast"])
    states = dict(ModelTarget.objects.values_list("alias", "enabled"))
    assert states == {"fast": False, "local": True, "mine": True}
    assert ModelTarget.objects.get(alias="mine").source == TargetSource.ENVIRONMENT
    assert ModelTarget.objects.get(alias="local").consecutive_failures == 3


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ("not json", "KEEL_MODEL_TARGETS"),
        ('{"alias": "x"}', "KEEL_MODEL_TARGETS"),
        ('[{"model": "m"}]', "KEEL_MODEL_TARGETS[0].alias"),
        ('[{"alias": "a", "model": "m"}, {"alias": "a", "model": "n"}]', "KEEL_MODEL_TARGETS[1].alias"),
        ('[{"alias": "a"}]', "KEEL_MODEL_TARGETS[0].model"),
        ('[{"alias": "a", "model": "m", "colour": "red"}]', "KEEL_MODEL_TARGETS[0].colour"),
        ('[{"alias": "a", "model": "m", "fallbacks": ["b"]}]', "KEEL_MODEL_TARGETS[0].fallbacks"),
    ],
)
def test_a_bad_declaration_changes_nothing(workspace, spec, field):
    services.model_targets_sync_from_env(workspace=workspace, spec=SPEC)
    before = _targets()

    with pytest.raises(exceptions.ModelTargetSpecInvalid) as error:
        services.model_targets_sync_from_env(workspace=workspace, spec=spec)

    assert field in _fields(error)
    assert _targets() == before


def test_the_command_syncs_every_workspace_or_one(workspace, other_workspace, settings, capsys):
    settings.KEEL_MODEL_TARGETS = SPEC

    call_command("modeltargets_sync", "--workspace", other_workspace.slug)
    assert set(ModelTarget.objects.values_list("workspace__slug", flat=True)) == {other_workspace.slug}
    call_command("modeltargets_sync")

    assert ModelTarget.objects.filter(workspace=workspace, source=TargetSource.ENVIRONMENT).count() == 2
    assert "acme: created fast, local" in capsys.readouterr().out
    settings.KEEL_MODEL_TARGETS = "[1]"
    with pytest.raises(CommandError, match=r"KEEL_MODEL_TARGETS\[0\]"):
        call_command("modeltargets_sync")
    settings.KEEL_MODEL_TARGETS = SPEC
    with pytest.raises(CommandError, match="no workspace"):
        call_command("modeltargets_sync", "--workspace", "nope")


# --- Router configuration ---------------------------------------------------------------------------


def test_a_router_configuration_is_created_once_and_updated_in_part(workspace):
    agent = AgentFactory.create(workspace=workspace)
    fast = ModelTargetFactory.create(workspace=workspace, alias="fast")
    rules = [{"name": "refunds", "kind": "keywords", "value": "refund, chargeback", "to_tier": "agentic"}]

    first = services.router_config_get_or_create(agent=agent)
    config = services.router_config_update(
        agent=agent, single_call_target="fast", rules=rules, shadow_rate=0.25, cache_enabled=True
    )
    services.router_config_update(agent=agent, cache_threshold=0.9)

    stored = RouterConfig.objects.get(agent=agent)
    assert first.pk == config.pk == stored.pk
    assert stored.single_call_target == fast
    assert stored.rules == [{**rules[0], "reason": ""}]
    assert (stored.shadow_rate, stored.cache_enabled, stored.cache_threshold) == (0.25, True, 0.9)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"shadow_rate": 1.5}, "shadow_rate"),
        ({"shadow_rate": -0.1}, "shadow_rate"),
        ({"cache_threshold": 0}, "cache_threshold"),
        ({"cache_threshold": 1.01}, "cache_threshold"),
        ({"single_call_target": "nowhere"}, "single_call_target"),
        ({"rules": [{"name": "r", "kind": "pattern", "value": "(", "to_tier": "chain"}]}, "rules"),
        ({"rules": [{"name": "r", "kind": "keywords", "value": "a", "to_tier": "moon"}]}, "rules"),
        ({"rules": [{"name": "", "kind": "keywords", "value": "a", "to_tier": "chain"}]}, "rules[0].name"),
        ({"neighbours": 5, "min_neighbours": 8}, "min_neighbours"),
        ({"cost_weight": -1}, "cost_weight"),
        ({"intents": {"refund": "money back"}}, "intents.refund"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_an_invalid_router_configuration_is_refused(workspace, changes, field):
    agent = AgentFactory.create(workspace=workspace)
    RouterConfigFactory.create(agent=agent, shadow_rate=0.1)

    with pytest.raises(exceptions.RouterConfigInvalid) as error:
        services.router_config_update(agent=agent, **changes)

    assert field in _fields(error)
    stored = RouterConfig.objects.get(agent=agent)
    assert (stored.shadow_rate, stored.rules, stored.single_call_target) == (0.1, [], None)


def test_a_target_of_another_workspace_cannot_serve_an_agent(workspace, other_workspace):
    agent = AgentFactory.create(workspace=workspace)
    theirs = ModelTargetFactory.create(workspace=other_workspace, alias="theirs")

    with pytest.raises(exceptions.RouterConfigInvalid):
        services.router_config_update(agent=agent, agentic_target=theirs)
    with pytest.raises(exceptions.RouterConfigInvalid):
        services.router_config_update(agent=agent, agentic_target="theirs")

    assert not RouterConfig.objects.filter(agent=agent).exists()


# --- Chains -----------------------------------------------------------------------------------------


def test_a_chain_is_replaced_whole(workspace):
    agent = AgentFactory.create(workspace=workspace)
    prompt = prompt_with_versions(agent=agent, name="steps/extract", templates=["Extract", "Extract better"])
    version = prompt.versions.get(version=2)
    ModelTargetFactory.create(workspace=workspace, alias="fast")
    services.chain_steps_set(agent=agent, steps=[{"name": "old", "instructions": "Old"}])
    schema = {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}

    steps = services.chain_steps_set(
        agent=agent,
        steps=[
            {"name": "extract", "prompt_version": version.pk, "output_schema": schema},
            {"name": "answer", "instructions": "Answer with the order.", "model_target": "fast"},
        ],
    )

    stored = list(ChainStep.objects.filter(agent=agent).order_by("position"))
    assert [(step.position, step.name) for step in stored] == [(1, "extract"), (2, "answer")]
    assert [step.pk for step in steps] == [step.pk for step in stored]
    assert stored[0].prompt_version == version
    assert stored[0].output_schema == schema
    assert stored[1].model_target is not None
    assert stored[1].model_target.alias == "fast"
    services.chain_steps_set(agent=agent, steps=[])
    assert not ChainStep.objects.filter(agent=agent).exists()


@pytest.mark.parametrize(
    ("step", "field"),
    [
        ({"name": "Bad Name", "instructions": "x"}, "steps[1].name"),
        ({"name": "first", "instructions": "x"}, "steps[1].name"),
        ({"name": "second"}, "steps[1].instructions"),
        ({"name": "second", "instructions": "x", "model_target": "nowhere"}, "steps[1].model_target"),
        ({"name": "second", "instructions": "x", "output_schema": {"type": "blob"}}, "steps[1].output_schema"),
        ({"name": "second", "instructions": "x", "output_schema": ["a"]}, "steps[1].output_schema"),
        ({"name": "second", "prompt_version": 999_999}, "steps[1].prompt_version"),
    ],
)
def test_an_invalid_chain_leaves_the_old_one(workspace, step, field):
    agent = AgentFactory.create(workspace=workspace)
    services.chain_steps_set(agent=agent, steps=[{"name": "kept", "instructions": "Keep me"}])

    with pytest.raises(exceptions.ChainInvalid) as error:
        services.chain_steps_set(agent=agent, steps=[{"name": "first", "instructions": "x"}, step])

    assert field in _fields(error)
    assert list(ChainStep.objects.filter(agent=agent).values_list("name", flat=True)) == ["kept"]


def test_a_chain_step_cannot_use_another_agents_prompt(workspace, other_workspace):
    agent = AgentFactory.create(workspace=workspace)
    sibling = AgentFactory.create(workspace=workspace)
    stranger = AgentFactory.create(workspace=other_workspace)
    for other in (sibling, stranger):
        version = prompt_with_versions(agent=other, name=f"{other.slug}/p").versions.get()

        with pytest.raises(exceptions.ChainInvalid):
            services.chain_steps_set(agent=agent, steps=[{"name": "s", "prompt_version": version.pk}])

    assert not ChainStep.objects.exists()


# --- Tools ------------------------------------------------------------------------------------------

PARAMETERS = {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}


def test_a_tool_is_created_updated_and_deleted(workspace):
    agent = AgentFactory.create(workspace=workspace)

    tool = services.agent_tool_create(
        agent=agent,
        name="lookup_order",
        description="Find an order",
        parameters=PARAMETERS,
        endpoint_url="https://tools.example.com/lookup",
        endpoint_secret="hush",
    )
    assert crypto.decrypt(AgentTool.objects.get(pk=tool.pk).endpoint_secret_encrypted) == "hush"
    services.agent_tool_update(tool=tool, description="Find one order", endpoint_secret=None)
    stored = AgentTool.objects.get(pk=tool.pk)
    assert (stored.description, crypto.decrypt(stored.endpoint_secret_encrypted)) == ("Find one order", "hush")
    services.agent_tool_update(tool=tool, endpoint_url="")
    assert AgentTool.objects.get(pk=tool.pk).endpoint_secret_encrypted == ""
    services.agent_tool_delete(tool=tool)
    assert not AgentTool.objects.exists()


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://127.0.0.1:5432/", "127.0.0.1 is loopback"),
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 is"),
        ("http://10.0.0.7/admin", "10.0.0.7 is private"),
        ("file:///etc/passwd", "must be an http(s) URL"),
    ],
)
def test_a_tool_endpoint_keel_may_not_send_to_is_refused_when_saved(workspace, url, says):
    agent = AgentFactory.create(workspace=workspace)

    with pytest.raises(exceptions.AgentToolInvalid) as refused:
        services.agent_tool_create(agent=agent, name="lookup_order", endpoint_url=url)

    (error,) = refused.value.extra["errors"]
    assert error["field"] == "endpoint_url"
    assert says in error["message"]
    assert not AgentTool.objects.exists()


def test_an_operator_may_permit_private_tool_endpoints_but_never_the_metadata_service(workspace, settings):
    settings.KEEL_OUTBOUND_ALLOW_PRIVATE = True
    agent = AgentFactory.create(workspace=workspace)

    tool = services.agent_tool_create(agent=agent, name="lookup_order", endpoint_url="http://10.0.0.7/lookup")

    assert tool.endpoint_url == "http://10.0.0.7/lookup"
    with pytest.raises(exceptions.AgentToolInvalid):
        services.agent_tool_update(tool=tool, endpoint_url="http://169.254.169.254/latest/meta-data/")
    assert AgentTool.objects.get(pk=tool.pk).endpoint_url == "http://10.0.0.7/lookup"


def test_a_tool_without_parameters_takes_no_arguments(workspace):
    tool = services.agent_tool_create(agent=AgentFactory.create(workspace=workspace), name="now")

    assert tool.parameters == {"type": "object", "properties": {}}


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"name": "has space"}, "name"),
        ({"name": "x" * 65}, "name"),
        ({"parameters": {"type": "string"}}, "parameters"),
        ({"parameters": {"type": "object", "properties": 3}}, "parameters"),
        ({"endpoint_url": "ftp//nope"}, "endpoint_url"),
        ({"endpoint_secret": "hush"}, "endpoint_secret"),
        ({"timeout_seconds": 0}, "timeout_seconds"),
    ],
)
def test_an_invalid_tool_is_refused(workspace, changes, field):
    agent = AgentFactory.create(workspace=workspace)

    with pytest.raises(exceptions.AgentToolInvalid) as error:
        services.agent_tool_create(agent=agent, **{"name": "lookup", **changes})

    assert field in _fields(error)
    assert not AgentTool.objects.exists()


def test_a_tool_name_is_unique_per_agent(workspace):
    agent = AgentFactory.create(workspace=workspace)
    services.agent_tool_create(agent=agent, name="lookup")
    other = services.agent_tool_create(agent=agent, name="refund")
    services.agent_tool_create(agent=AgentFactory.create(workspace=workspace), name="lookup")

    with pytest.raises(exceptions.AgentToolNameTaken):
        services.agent_tool_create(agent=agent, name="lookup")
    with pytest.raises(exceptions.AgentToolNameTaken):
        services.agent_tool_update(tool=other, name="lookup")

    assert sorted(AgentTool.objects.filter(agent=agent).values_list("name", flat=True)) == ["lookup", "refund"]


# --- Hand-offs --------------------------------------------------------------------------------------


def _handoff(workspace: Any) -> Handoff:
    agent = AgentFactory.create(workspace=workspace)
    decision = RoutingDecision.objects.create(
        workspace=workspace,
        agent=agent,
        trace_id="a" * 32,
        request_text="I want a person",
        tier="human",
        method="rule",
        reason="asked for a person",
    )
    return Handoff.objects.create(
        workspace=workspace, agent=agent, decision=decision, trace_id="a" * 32, reason="asked for a person"
    )


def test_a_handoff_is_claimed_then_resolved(workspace):
    handoff = _handoff(workspace)
    ada = UserFactory.create(username="ada")

    claimed = services.handoff_claim(handoff=handoff, user=ada)
    again = services.handoff_claim(handoff=handoff, user=ada)
    resolved = services.handoff_resolve(handoff=handoff, user=ada, resolution="  Refunded the ride.  ")

    assert (claimed.status, again.status, claimed.assigned_to) == (HandoffStatus.CLAIMED, HandoffStatus.CLAIMED, ada)
    stored = Handoff.objects.get(pk=handoff.pk)
    assert (stored.status, stored.resolution, stored.assigned_to) == (HandoffStatus.RESOLVED, "Refunded the ride.", ada)
    assert resolved.resolved_at is not None
    assert timezone.now() - resolved.resolved_at < timedelta(minutes=1)


def test_a_handoff_claimed_by_someone_else_or_resolved_is_a_conflict(workspace):
    handoff = _handoff(workspace)
    ada, bob = UserFactory.create(username="ada"), UserFactory.create(username="bob")
    services.handoff_claim(handoff=handoff, user=ada)

    with pytest.raises(exceptions.HandoffConflict, match="claimed by ada"):
        services.handoff_claim(handoff=handoff, user=bob)
    services.handoff_resolve(handoff=handoff, user=bob, resolution="Called back.")
    with pytest.raises(exceptions.HandoffConflict) as twice:
        services.handoff_resolve(handoff=handoff, user=bob, resolution="Again.")
    with pytest.raises(exceptions.HandoffConflict):
        services.handoff_claim(handoff=handoff, user=bob)

    assert twice.value.status == 409
    stored = Handoff.objects.get(pk=handoff.pk)
    assert (stored.status, stored.resolution, stored.assigned_to) == (HandoffStatus.RESOLVED, "Called back.", ada)


def test_a_resolution_says_what_was_done(workspace):
    handoff = _handoff(workspace)

    with pytest.raises(exceptions.HandoffInvalid):
        services.handoff_resolve(handoff=handoff, user=None, resolution="   ")

    assert Handoff.objects.get(pk=handoff.pk).status == HandoffStatus.OPEN


def test_a_stored_key_is_not_sent_to_a_new_endpoint_unless_entered_again(workspace: Any) -> None:
    target = services.model_target_create(
        workspace=workspace, alias="main", model="openai/gpt-4o-mini", api_key="sk-kept"
    )

    elsewhere: list[dict[str, Any]] = [{"api_base": "https://attacker.example/v1"}, {"model": "anthropic/claude-3"}]
    for fields in elsewhere:
        with pytest.raises(exceptions.ModelTargetInvalid) as refused:
            services.model_target_update(target=target, **fields)
        assert refused.value.extra["errors"][0]["field"] == "api_key"
        target.refresh_from_db()
        assert (target.api_base, target.model) == ("", "openai/gpt-4o-mini")

    services.model_target_update(target=target, model="openai/gpt-4o")  # same provider, same endpoint
    proxied = services.model_target_update(target=target, api_base="https://proxy.example/v1", api_key="sk-new")
    assert crypto.decrypt(proxied.api_key_encrypted) == "sk-new"


def test_a_tools_secret_is_not_sent_to_a_new_endpoint_unless_entered_again(workspace: Any) -> None:
    agent = AgentFactory.create(workspace=workspace)
    tool = services.agent_tool_create(
        agent=agent, name="refund", endpoint_url="https://tools.example/refund", endpoint_secret="s3cret"
    )

    with pytest.raises(exceptions.AgentToolInvalid) as refused:
        services.agent_tool_update(tool=tool, endpoint_url="https://attacker.example/hook")
    assert refused.value.extra["errors"][0]["field"] == "endpoint_secret"
    tool.refresh_from_db()
    assert tool.endpoint_url == "https://tools.example/refund"

    moved = services.agent_tool_update(tool=tool, endpoint_url="https://tools.example/v2", endpoint_secret="s3cret")
    assert moved.endpoint_url == "https://tools.example/v2"
