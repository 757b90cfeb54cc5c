"""The demo workspace: two agents modelled on the framework's worked examples (shared/seeds,
"Requirements and Problem Framing"): a shopping assistant like Amazon's Rufus and a ride-support bot
like Uber's. Everything goes through the services, so the demo shows what Keel itself produces
(versions, feasibility findings, label moves). Seeding is idempotent: a second run changes nothing.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from agent_registry import services
from agent_registry.models import Agent, AgentStatus, Prompt, Role, User, Workspace

DEMO_WORKSPACE = "demo"
DEMO_USERNAME = "demo"
DEMO_PASSWORD = "keel-demo"  # printed by `make run`; a local demo login, not a secret


SHOPPING_V2: dict[str, Any] = {
    "error_surface": {
        "decision_authority": "advisory",
        "error_cost": {
            "worse_direction": "symmetric",
            "description": "A bad recommendation costs the shopper a glance; a missed one costs a sale. "
            "Neither lasts: the shopper refines the query.",
            "ratio": 1,
        },
        "recoverability": "instant",
        "actions": [
            {
                "name": "search_catalog",
                "description": "Search the product catalog",
                "mode": "execute",
                "stakes": "low",
            },
            {
                "name": "get_reviews",
                "description": "Fetch review summaries",
                "mode": "execute",
                "stakes": "low",
            },
            {
                "name": "lookup_purchase_history",
                "description": "The shopper's own past orders, by product ID",
                "mode": "execute",
                "stakes": "low",
            },
            {
                "name": "add_to_cart",
                "description": "Suggest adding an item; the shopper clicks",
                "mode": "recommend",
                "stakes": "low",
                "side_effects": True,
            },
        ],
        "notes": "The human is always the final gate on any consequential action.",
    },
    "io_gap": {
        "steps_median": 1,
        "steps_p95": 2,
        "steps_predictable": True,
        "output_verifiable_from_input": True,
        "atomic_operations": ["classification", "generation"],
        "notes": "“Running shoes for flat feet under $100”: the answer is in the catalog; one retrieval closes it.",
    },
    "constraints": {
        "latency": {
            "latency_class": "inline",
            "hard_ceiling_ms": 1500,
            "notes": "The shopper is mid-browse and staring at the screen.",
        },
        "cost": {
            "per_request_ceiling_usd": "0.01",
            "comparison_point": "an agentic answer at $0.50 a query",
            "comparison_cost_usd": "0.50",
            "single_call_cost_usd": "0.004",
            "expected_daily_requests": 2000000,
        },
        "privacy": {
            "may_see": "Catalog, reviews, the shopper's own order history as product IDs.",
            "may_infer": "Shopping intent only.",
            "may_store": "Nothing beyond the session.",
            "may_transmit": "Product IDs to catalog tools.",
            "pii_handling": "no_pii",
        },
        "governance": "output_monitoring",
    },
    "pareto": {
        "quality_vs_speed": 85,
        "autonomy_vs_control": 85,
        "generality_vs_reliability": 85,
        "primary_axis": "quality_speed",
        "rationale": "Speed wins: a decent answer in 500 ms beats a better one in 5 s, and the shopper "
        "provides the extra deliberation for free.",
    },
    "evaluation": {
        "output_metrics": [
            {"name": "click_through_rate", "description": "Recommendations clicked", "target": 0.12},
            {"name": "add_to_cart_rate", "description": "Sessions that add an item", "target": 0.04},
            {"name": "faithfulness", "description": "Claims grounded in catalog and reviews", "target": 0.95},
            {"name": "relevance", "description": "Judge-rated relevance to the query", "target": 0.8},
        ],
        "trajectory_metrics": [],
    },
    "routing": {
        "mode": "single_level",
        "enabled_tiers": ["single_call"],
        "default_tier": "single_call",
        "signal": "rules",
        "escalation_rules": [],
        "notes": "Shopping queries almost never benefit from more deliberation.",
    },
}


def _with(answers: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A copy of `answers` with dotted paths replaced."""
    changed = copy.deepcopy(answers)
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        node = changed
        for key in parents:
            node = node[key]
        node[leaf] = value
    return changed


# The first draft tried an agentic tier for "complex shopping decisions"; the latency wall ruled it out.
SHOPPING_V1 = _with(
    SHOPPING_V2,
    **{
        "routing.mode": "adaptive",
        "routing.enabled_tiers": ["single_call", "agentic"],
        "routing.escalation_rules": [
            {
                "trigger": "keywords",
                "value": "compare, versus, vs",
                "to_tier": "agentic",
                "reason": "comparisons",
            }
        ],
        "pareto.quality_vs_speed": 60,
    },
)


RIDE_SUPPORT_V2: dict[str, Any] = {
    "error_surface": {
        "decision_authority": "bounded_autonomy",
        "error_cost": {
            "worse_direction": "false_positive",
            "description": "Granting a refund that was not owed is exploitable at scale (refund gaming); "
            "denying a legitimate one costs a re-contact and some trust.",
            "ratio": 3,
        },
        "recoverability": "days",
        "actions": [
            {
                "name": "lookup_trip",
                "description": "Trip record by trip ID",
                "mode": "execute",
                "stakes": "low",
            },
            {
                "name": "lookup_payment",
                "description": "Charges and refunds of a trip",
                "mode": "execute",
                "stakes": "low",
            },
            {
                "name": "search_policy",
                "description": "Refund and cancellation policy",
                "mode": "execute",
                "stakes": "low",
            },
            {
                "name": "issue_refund",
                "description": "Refund a trip; autonomous under $20 with a clear cancellation record",
                "mode": "execute",
                "stakes": "moderate",
                "side_effects": True,
                "autonomy_limit_usd": "20",
            },
            {
                "name": "modify_account",
                "description": "Change account settings or status",
                "mode": "execute",
                "stakes": "high",
                "side_effects": True,
                "requires_approval": True,
            },
            {
                "name": "escalate_to_human",
                "description": "Hand the case to a support agent",
                "mode": "execute",
                "stakes": "low",
                "side_effects": True,
            },
        ],
        "notes": "Advisory for information, bounded autonomy for simple refunds, humans for ambiguity, "
        "high-value disputes and safety.",
    },
    "io_gap": {
        "steps_median": 4,
        "steps_p95": 7,
        "steps_predictable": False,
        "output_verifiable_from_input": False,
        "atomic_operations": ["extraction", "classification", "generation", "decision_action"],
        "notes": "“I was double-charged”: extract claim → trip → payment → policy → action. "
        "“My driver made me feel unsafe”: open-ended, mandatory escalation.",
    },
    "constraints": {
        "latency": {
            "latency_class": "conversational",
            "hard_ceiling_ms": 150000,
            "notes": "2-30 s is fine; past 2-3 minutes the rider abandons and calls support anyway.",
        },
        "cost": {
            "per_request_ceiling_usd": "2.00",
            "per_resolution_ceiling_usd": "2.00",
            "comparison_point": "a human support agent ($5-15 an interaction)",
            "comparison_cost_usd": "5.00",
            "single_call_cost_usd": "0.02",
            "expected_daily_requests": 40000,
        },
        "privacy": {
            "may_see": "Trip IDs, fares and statuses; never raw GPS coordinates.",
            "may_infer": "Nothing about health or relationships from trip patterns.",
            "may_store": "Case notes without locations.",
            "may_transmit": "Trip ID and amount to the payments tool only.",
            "pii_handling": "pseudonymize",
        },
        "governance": "policy_compliance_auditing",
    },
    "pareto": {
        "quality_vs_speed": 25,
        "autonomy_vs_control": 50,
        "generality_vs_reliability": 40,
        "primary_axis": "quality_speed",
        "rationale": "Wrong resolutions cost more than slow ones; autonomous reasoning, controlled action "
        "boundary; scoped generality with hard escalation paths.",
    },
    "evaluation": {
        "output_metrics": [
            {"name": "resolution_rate", "description": "Cases closed without a human", "target": 0.7},
            {"name": "csat", "description": "Rider satisfaction, 1-5", "target": 4.2},
            {
                "name": "recontact_rate",
                "description": "Riders who contact again in 7 days",
                "target": 0.1,
                "comparator": "<=",
            },
        ],
        "trajectory_metrics": [
            {"name": "policy_compliance_rate", "description": "Actions that followed policy", "target": 0.99},
            {
                "name": "action_appropriateness",
                "description": "Judge-rated fit of the action",
                "target": 0.95,
            },
            {"name": "escalation_accuracy", "description": "Escalated exactly when required", "target": 0.9},
        ],
        "notes": "Invest in trajectory logging from day one.",
    },
    "routing": {
        "mode": "adaptive",
        "enabled_tiers": ["single_call", "chain", "human"],
        "default_tier": "single_call",
        "signal": "classifier",
        "escalation_rules": [
            {
                "trigger": "keywords",
                "value": "unsafe, assault, harassed, accident, injured, threatened",
                "to_tier": "human",
                "reason": "safety incidents always go to a person",
            },
            {"trigger": "amount_over", "value": "100", "to_tier": "human", "reason": "high-value disputes"},
            {
                "trigger": "intent",
                "value": "fare_dispute",
                "to_tier": "chain",
                "reason": "policy lookup chain",
            },
            {
                "trigger": "intent",
                "value": "cancellation",
                "to_tier": "chain",
                "reason": "policy lookup chain",
            },
            {
                "trigger": "signal",
                "value": "misalignment",
                "to_tier": "human",
                "reason": "the rider keeps correcting",
            },
        ],
        "notes": "The routing classifier is a first-class component with its own evaluation cycle.",
    },
}

# The first draft let refunds up to $50 through and committed to output metrics only.
RIDE_SUPPORT_V1 = _with(
    RIDE_SUPPORT_V2,
    **{
        "evaluation.trajectory_metrics": [],
        "error_surface.actions": [
            {**action, "autonomy_limit_usd": "50"} if action["name"] == "issue_refund" else action
            for action in RIDE_SUPPORT_V2["error_surface"]["actions"]
        ],
    },
)


@dataclass(frozen=True)
class PromptSeed:
    name: str
    type: str
    versions: tuple[tuple[Any, dict[str, Any], str], ...]  # (template, config, commit message)
    labels: dict[str, int]  # label → version, applied in order after all versions exist
    description: str = ""
    tags: tuple[str, ...] = ()


SHOPPING_PROMPTS = (
    PromptSeed(
        name="shopping-assistant/system",
        type="chat",
        description="System prompt and turn template of the shopping assistant.",
        tags=("shopping",),
        versions=(
            (
                [
                    {
                        "role": "system",
                        "content": "You are a shopping assistant for {{store}}. Recommend products "
                        "from the catalog results only. Be brief.",
                    },
                    {"type": "placeholder", "name": "history"},
                    {"role": "user", "content": "{{query}}"},
                ],
                {"model": "gpt-4o-mini", "temperature": 0.3, "max_tokens": 300},
                "First version",
            ),
            (
                [
                    {
                        "role": "system",
                        "content": "You are a shopping assistant for {{store}}. Recommend at most "
                        "three products from the catalog results, each with one line on why it fits. Never invent "
                        "a product, price or review. If nothing fits, say so and suggest a refinement.",
                    },
                    {"type": "placeholder", "name": "history"},
                    {"role": "user", "content": "{{query}}"},
                ],
                {"model": "gpt-4o-mini", "temperature": 0.2, "max_tokens": 250},
                "Ground every claim in the catalog; cap at three items",
            ),
        ),
        labels={"production": 1, "staging": 2},
    ),
)

# Applied after the shopping prompts' labels: the deploy of v2 to production.
SHOPPING_DEPLOYS = (("shopping-assistant/system", "production", 2),)

RIDE_PROMPTS = (
    PromptSeed(
        name="ride-support/system",
        type="chat",
        description="System prompt of the ride-support bot.",
        tags=("support",),
        versions=(
            (
                [
                    {
                        "role": "system",
                        "content": "You are {{company}}'s ride support assistant. Look up the trip "
                        "and payment before answering. Refund only per policy.",
                    },
                    {"type": "placeholder", "name": "history"},
                    {"role": "user", "content": "{{message}}"},
                ],
                {"model": "gpt-4o", "temperature": 0.1},
                "First version",
            ),
            (
                [
                    {
                        "role": "system",
                        "content": "You are {{company}}'s ride support assistant.\n"
                        "1. Extract the claim and the trip.\n2. Look up the trip and its payments.\n"
                        "3. Match the case to the refund policy.\n4. Refund on your own only under $20 with a "
                        "clear cancellation record; otherwise escalate.\nAny safety concern: escalate at once, "
                        "do not troubleshoot.",
                    },
                    {"type": "placeholder", "name": "history"},
                    {"role": "user", "content": "{{message}}"},
                ],
                {"model": "gpt-4o", "temperature": 0.1, "max_tokens": 600},
                "Spell out the refund limit and the safety escalation",
            ),
        ),
        labels={"production": 2, "staging": 2},
    ),
    PromptSeed(
        name="ride-support/refund-policy",
        type="text",
        description="Policy excerpt the chain's policy step injects.",
        tags=("support", "policy"),
        versions=(
            (
                "Refunds: a trip cancelled by the driver, or charged twice, is refunded in full. Refunds up to "
                "{{autonomy_limit}} may be issued without review when the cancellation record is clear.",
                {},
                "Policy as of {{policy_date}}",
            ),
        ),
        labels={"production": 1},
    ),
)


def _user(username: str, password: str, **fields: Any) -> User:
    user = User.objects.filter(username=username).first()
    if user is None:
        user = User.objects.create_user(username=username, password=password, **fields)
    return user


def _agent(
    workspace: Workspace,
    owner: User,
    slug: str,
    name: str,
    description: str,
    history: tuple[tuple[dict[str, Any], str], ...],
) -> Agent:
    agent = Agent.objects.filter(workspace=workspace, slug=slug).first()
    if agent is None:
        agent = services.agent_create(
            workspace=workspace,
            slug=slug,
            name=name,
            description=description,
            owner=owner,
            status=AgentStatus.ACTIVE,
            created_by=owner,
        )
    if not agent.requirements_versions.exists():
        for version_answers, message in history:
            services.requirements_version_create(
                agent=agent, answers=version_answers, message=message, created_by=owner
            )
    return agent


def _prompts(agent: Agent, owner: User, seeds: tuple[PromptSeed, ...]) -> None:
    for seed in seeds:
        if Prompt.objects.filter(workspace_id=agent.workspace_id, name=seed.name).exists():
            continue
        (first_template, first_config, first_message), *rest = seed.versions
        first = services.prompt_create(
            agent=agent,
            name=seed.name,
            type=seed.type,
            template=first_template,
            config=first_config,
            description=seed.description,
            tags=seed.tags,
            commit_message=first_message,
            created_by=owner,
        )
        versions = {1: first}
        for number, (template, config, message) in enumerate(rest, start=2):
            versions[number] = services.prompt_version_create(
                prompt=first.prompt,
                template=template,
                config=config,
                commit_message=message,
                created_by=owner,
            )
        for label, number in seed.labels.items():
            services.prompt_label_move(prompt=first.prompt, label=label, version=versions[number], moved_by=owner)


@transaction.atomic
def demo_seed() -> Workspace:
    """Create the demo workspace, its login and its two agents, unless they exist."""
    owner = _user(DEMO_USERNAME, DEMO_PASSWORD, is_staff=True, is_superuser=True, first_name="Demo")
    workspace = Workspace.objects.filter(slug=DEMO_WORKSPACE).first()
    if workspace is None:
        workspace = services.workspace_create(slug=DEMO_WORKSPACE, name="Demo workspace", owner=owner)
    services.membership_set(workspace=workspace, user=owner, role=Role.OWNER)
    viewer = _user("demo-viewer", DEMO_PASSWORD, first_name="Viewer")
    services.membership_set(workspace=workspace, user=viewer, role=Role.VIEWER, set_by=owner)

    shopping = _agent(
        workspace,
        owner,
        "shopping-assistant",
        "Shopping assistant",
        "Answers shopping queries with product recommendations from the catalog (modelled on Rufus).",
        (
            (SHOPPING_V1, "First draft"),
            (SHOPPING_V2, "Drop the agentic tier: the inline latency wall rules it out"),
        ),
    )
    ride = _agent(
        workspace,
        owner,
        "ride-support",
        "Ride support bot",
        "Resolves ride and payment complaints; refunds small amounts on its own, escalates the rest "
        "(modelled on Uber's support bot).",
        (
            (RIDE_SUPPORT_V1, "First draft"),
            (RIDE_SUPPORT_V2, "Refund limit down to $20; commit to trajectory metrics"),
        ),
    )
    if not Prompt.objects.filter(workspace=workspace, name=SHOPPING_PROMPTS[0].name).exists():
        _prompts(shopping, owner, SHOPPING_PROMPTS)
        for name, label, number in SHOPPING_DEPLOYS:
            prompt = Prompt.objects.get(workspace=workspace, name=name)
            services.prompt_label_move(
                prompt=prompt, label=label, version=prompt.versions.get(version=number), moved_by=owner
            )
    _prompts(ride, owner, RIDE_PROMPTS)

    from tracing import demo as tracing_demo  # tracing builds on the registry; import it here, not at the top

    tracing_demo.demo_traces_seed(workspace)
    tracing_demo.demo_triage_seed(workspace)
    from routing import demo as routing_demo  # the gateway builds on tracing; import it here too

    routing_demo.demo_routing_seed(workspace)
    from guardrails import demo as guardrails_demo  # guardrails build on the gateway; import it here too

    guardrails_demo.demo_guardrails_seed(workspace)
    from evals import demo as evals_demo  # datasets are built from the trajectories above

    evals_demo.demo_evals_seed(workspace)
    from trainer_bridge import demo as trainer_demo  # curations are made of the eval runs above

    trainer_demo.demo_trainer_seed(workspace)
    # Last, on the gateway's demo model target: nothing above reads the replays' trajectories.
    tracing_demo.demo_replays_seed(workspace)
    return workspace
