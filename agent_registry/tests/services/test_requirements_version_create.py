import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from agent_registry import exceptions, requirements, services
from agent_registry.models import Agent, RequirementsVersion
from agent_registry.tests.factories import AgentFactory, UserFactory, requirements_answers

pytestmark = pytest.mark.django_db


def test_the_first_save_is_version_1_and_becomes_current(workspace):
    agent = AgentFactory.create(workspace=workspace)
    user = UserFactory.create()

    version = services.requirements_version_create(
        agent=agent, answers=requirements_answers(), message="first", created_by=user
    )

    stored = RequirementsVersion.objects.get()
    assert stored == version
    assert (stored.agent, stored.version, stored.message, stored.created_by) == (agent, 1, "first", user)
    assert Agent.objects.get(pk=agent.pk).current_requirements == version
    assert agent.current_requirements == version


def test_answers_are_stored_validated_and_normalised(workspace):
    agent = AgentFactory.create(workspace=workspace)
    answers = requirements_answers(**{"routing.enabled_tiers": ["human", "single_call", "chain"]})

    version = services.requirements_version_create(agent=agent, answers=answers)

    expected = requirements.Requirements.model_validate(answers).to_json()
    assert RequirementsVersion.objects.get(pk=version.pk).answers == expected
    assert expected["routing"]["enabled_tiers"] == ["single_call", "chain", "human"]
    assert expected["error_surface"]["actions"][0]["requires_approval"] is False


def test_each_save_takes_the_next_version_and_moves_the_pointer(workspace, other_workspace):
    agent = AgentFactory.create(workspace=workspace)
    elsewhere = AgentFactory.create(workspace=other_workspace)
    services.requirements_version_create(agent=elsewhere, answers=requirements_answers())

    services.requirements_version_create(agent=agent, answers=requirements_answers())
    second = services.requirements_version_create(agent=agent, answers=requirements_answers(**{"io_gap.steps_p95": 4}))

    assert list(agent.requirements_versions.values_list("version", flat=True)) == [2, 1]
    assert Agent.objects.get(pk=agent.pk).current_requirements == second
    assert list(elsewhere.requirements_versions.values_list("version", flat=True)) == [1]


def test_invalid_answers_save_nothing_and_name_each_field(workspace):
    agent = AgentFactory.create(workspace=workspace)
    current = services.requirements_version_create(agent=agent, answers=requirements_answers())
    answers = requirements_answers(**{"io_gap.steps_p95": 1, "constraints.governance": "vibes"})

    with pytest.raises(exceptions.RequirementsInvalid) as raised:
        services.requirements_version_create(agent=agent, answers=answers)

    assert raised.value.extra["errors"] == [
        {"field": "io_gap.steps_p95", "message": "Value error, steps_p95 must be at least steps_median"},
        {
            "field": "constraints.governance",
            "message": "Input should be 'output_monitoring', 'policy_compliance_auditing' or 'full_audit_trail'",
        },
    ]
    assert raised.value.detail.startswith("invalid requirements: io_gap.steps_p95: Value error, steps_p95")
    assert list(RequirementsVersion.objects.all()) == [current]
    assert Agent.objects.get(pk=agent.pk).current_requirements == current


def test_infeasible_answers_are_saved_with_their_findings(workspace):
    # Feasibility findings advise; only invalid answers are refused.
    agent = AgentFactory.create(workspace=workspace)

    version = services.requirements_version_create(
        agent=agent, answers=requirements_answers(**{"evaluation.trajectory_metrics": []})
    )

    assert version.version == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_saves_take_distinct_versions(workspace):
    agent = AgentFactory.create(workspace=workspace)
    start = threading.Barrier(8)

    def save(steps_p95: int) -> RequirementsVersion:
        try:
            start.wait(timeout=10)
            return services.requirements_version_create(
                agent=agent, answers=requirements_answers(**{"io_gap.steps_p95": steps_p95})
            )
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=8) as pool:
        # result() re-raises here whatever a thread raised.
        saved = [future.result() for future in [pool.submit(save, steps) for steps in range(5, 13)]]

    assert sorted(version.version for version in saved) == [1, 2, 3, 4, 5, 6, 7, 8]
    versions = list(RequirementsVersion.objects.filter(agent=agent).order_by("version"))
    assert [version.version for version in versions] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert sorted(version.answers["io_gap"]["steps_p95"] for version in versions) == list(range(5, 13))
    assert Agent.objects.get(pk=agent.pk).current_requirements == versions[-1]
