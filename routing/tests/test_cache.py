"""The semantic cache against the real PostgreSQL with pgvector: scope, threshold, expiry, hits and
their review, invalidation and sweep, the threshold report, and request embeddings through a fake
litellm provider."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.db import connection
from django.utils import timezone
from litellm.llms.custom_llm import CustomLLM
from litellm.types.utils import EmbeddingResponse

from agent_registry.tests.factories import AgentFactory, UserFactory, WorkspaceFactory, prompt_with_versions
from config import crypto
from routing import cache, services
from routing.embedding import embed_offline, project
from routing.models import CacheEntry, CacheHit, TierChoice
from routing.tests.factories import (
    SYSTEM_PROMPT,
    CacheEntryFactory,
    CacheHitFactory,
    ModelTargetFactory,
    RouterConfigFactory,
    RoutingDecisionFactory,
)
from tracing.tests.replay_fakes import network_forbid

REQUEST = "How do I reset the password of my account?"
PARAPHRASE = "how can I reset my account password"
UNRELATED = "What are your opening hours on Sunday?"
HASH = cache.system_hash(SYSTEM_PROMPT)


def unit(*values: float) -> list[float]:
    """A 256-wide vector with the given leading components (normalised by the store, not here)."""
    return [*values, *([0.0] * (256 - len(values)))]


@pytest.fixture(autouse=True)
def _scope_sizes_forgotten():
    cache.cache_scope_sizes_forget()
    yield
    cache.cache_scope_sizes_forget()


@pytest.fixture
def agent(workspace):
    return AgentFactory.create(workspace=workspace, slug="support")


@pytest.fixture
def target(workspace):
    return ModelTargetFactory.create(workspace=workspace, alias="small", model="fake-embed/small")


@pytest.fixture
def versions(agent):
    prompt = prompt_with_versions(
        agent=agent, name="support/system", templates=("You help.", "You help briefly."), labels={1: ["production"]}
    )
    return list(prompt.versions.order_by("version"))


def store(agent, target, text=REQUEST, *, prompt_version=None, system_prompt_hash=HASH, ttl_seconds=3600, **kwargs):
    return cache.cache_store(
        agent=agent,
        model_target=target,
        prompt_version=prompt_version,
        system_prompt_hash=system_prompt_hash,
        request_text=text,
        embedding=kwargs.pop("embedding", None) or embed_offline(text),
        response={"message": {"role": "assistant", "content": f"answer to {text}"}},
        trace_id=kwargs.pop("trace_id", "a" * 32),
        ttl_seconds=ttl_seconds,
        **kwargs,
    )


def lookup(agent, target, text=REQUEST, *, prompt_version=None, system_prompt_hash=HASH, threshold=0.9, **kwargs):
    return cache.cache_lookup(
        agent=agent,
        model_target=target,
        prompt_version=prompt_version,
        system_prompt_hash=system_prompt_hash,
        embedding=kwargs.pop("embedding", None) or embed_offline(text),
        threshold=threshold,
        **kwargs,
    )


# --- Store and look up ----------------------------------------------------------------------------------


def test_cache_store_keeps_the_scope_and_expiry(agent, target, versions):
    now = timezone.now()

    entry = store(agent, target, prompt_version=versions[0], ttl_seconds=600, now=now, trace_id="b" * 32)

    entry.refresh_from_db()
    assert entry.workspace_id == agent.workspace_id
    assert (entry.agent_id, entry.model_target_id, entry.prompt_version_id) == (agent.pk, target.pk, versions[0].pk)
    assert entry.system_hash == HASH
    assert entry.request_text == REQUEST
    assert entry.response == {"message": {"role": "assistant", "content": f"answer to {REQUEST}"}}
    assert entry.trace_id == "b" * 32
    assert entry.hit_count == 0
    assert entry.created_at == now
    assert entry.expires_at == now + timedelta(seconds=600)
    assert entry.embedding == pytest.approx(embed_offline(REQUEST), abs=1e-6)


def test_cache_store_refuses_a_target_of_another_workspace(agent, other_workspace):
    foreign = ModelTargetFactory.create(workspace=other_workspace)

    with pytest.raises(cache.CacheScopeMismatch):
        store(agent, foreign)

    assert CacheEntry.objects.count() == 0


def test_cache_store_refuses_a_prompt_version_of_another_agent(agent, target, workspace):
    other_prompt = prompt_with_versions(agent=AgentFactory.create(workspace=workspace), name="other/system")

    with pytest.raises(cache.CacheScopeMismatch):
        store(agent, target, prompt_version=other_prompt.versions.get())

    assert CacheEntry.objects.count() == 0


@pytest.mark.parametrize(("embedding", "ttl_seconds"), [([1.0] * 255, 60), (unit(1.0), 0)])
def test_cache_store_refuses_a_wrong_width_or_no_lifetime(agent, target, embedding, ttl_seconds):
    with pytest.raises(ValueError, match=r"wide|time to live"):
        store(agent, target, embedding=embedding, ttl_seconds=ttl_seconds)

    assert CacheEntry.objects.count() == 0


def test_cache_lookup_finds_the_same_request_and_a_paraphrase(agent, target):
    entry = store(agent, target)

    same = lookup(agent, target)
    paraphrase = lookup(agent, target, PARAPHRASE, threshold=0.8)

    assert same is not None
    assert same[0].pk == entry.pk
    assert same[1] == pytest.approx(1.0, abs=1e-6)
    assert paraphrase is not None
    assert paraphrase[0].pk == entry.pk
    assert paraphrase[1] == pytest.approx(0.8577, abs=1e-3)
    assert lookup(agent, target, UNRELATED, threshold=0.5) is None


def test_an_exact_repeat_is_found_by_its_text_whatever_its_vector(agent, target):
    stored = store(agent, target)
    far = [0.0] * 255 + [1.0]  # a vector nowhere near the stored one: only the text can find it

    assert lookup(agent, target, embedding=far) is None
    assert lookup(agent, target, embedding=far, request_text=REQUEST) == (stored, 1.0)
    assert lookup(agent, target, embedding=far, request_text=REQUEST + "?") is None


def test_cache_lookup_returns_the_nearest_entry(agent, target):
    store(agent, target, embedding=unit(1.0, 1.0))
    nearest = store(agent, target, embedding=unit(1.0, 0.2))
    store(agent, target, embedding=unit(0.0, 1.0))

    found = lookup(agent, target, embedding=unit(1.0, 0.0), threshold=0.5)

    assert found is not None
    assert found[0].pk == nearest.pk
    assert found[1] == pytest.approx(1 / (1 + 0.2**2) ** 0.5, abs=1e-6)


def test_cache_lookup_never_leaves_its_scope(agent, target, versions, workspace, other_workspace):
    store(agent, target, prompt_version=versions[0])
    other_agent = AgentFactory.create(workspace=workspace)
    other_target = ModelTargetFactory.create(workspace=workspace)
    foreign_agent = AgentFactory.create(workspace=other_workspace, slug="support")
    foreign_target = ModelTargetFactory.create(workspace=other_workspace, alias="small", model=target.model)
    # The same request, stored in every neighbouring scope but the one looked up below.
    store(other_agent, target, prompt_version=None)
    store(foreign_agent, foreign_target)

    assert lookup(agent, target, prompt_version=versions[0]) is not None
    assert lookup(other_agent, target, prompt_version=versions[0]) is None
    assert lookup(agent, other_target, prompt_version=versions[0]) is None
    assert lookup(agent, target, prompt_version=versions[1]) is None
    assert lookup(agent, target, prompt_version=None) is None
    assert lookup(agent, target, prompt_version=versions[0], system_prompt_hash=cache.system_hash("Other.")) is None
    assert lookup(foreign_agent, foreign_target, prompt_version=None) is not None
    assert lookup(foreign_agent, target, prompt_version=None) is None


def test_cache_lookup_without_prompt_version_is_its_own_scope(agent, target, versions):
    without = store(agent, target, prompt_version=None)

    found = lookup(agent, target, prompt_version=None)

    assert found is not None
    assert found[0].pk == without.pk
    assert lookup(agent, target, prompt_version=versions[0]) is None


def test_cache_lookup_threshold_is_inclusive(agent, target):
    store(agent, target, embedding=unit(0.6, 0.8))
    nearest = lookup(agent, target, embedding=unit(1.0), threshold=0.0)
    assert nearest is not None
    similarity = nearest[1]

    assert similarity == pytest.approx(0.6, abs=1e-6)
    assert lookup(agent, target, embedding=unit(1.0), threshold=similarity) is not None
    assert lookup(agent, target, embedding=unit(1.0), threshold=similarity + 1e-9) is None


def test_cache_lookup_ignores_expired_entries(agent, target):
    now = timezone.now()
    store(agent, target, ttl_seconds=60, now=now)

    assert lookup(agent, target, now=now + timedelta(seconds=59)) is not None
    assert lookup(agent, target, now=now + timedelta(seconds=60)) is None


def test_cache_lookup_in_an_empty_scope(agent, target):
    assert lookup(agent, target) is None


def test_cache_lookup_defers_the_embedding(agent, target):
    store(agent, target)

    found = lookup(agent, target)

    assert found is not None
    assert "embedding" in found[0].get_deferred_fields()


def test_cache_lookup_of_a_large_scope_walks_the_hnsw_index(agent, target, monkeypatch):
    monkeypatch.setattr(cache, "EXACT_SCAN_LIMIT", 2)
    far = store(agent, target, embedding=unit(0.0, 1.0))
    near = store(agent, target, embedding=unit(1.0, 0.1))
    store(agent, target, embedding=unit(1.0, 1.0))
    # Nearer still, but in another agent's scope: the filtered index walk must pass over it.
    store(AgentFactory.create(workspace=agent.workspace), target, embedding=unit(1.0))

    found = lookup(agent, target, embedding=unit(1.0), threshold=0.9)

    assert found is not None
    assert found[0].pk == near.pk
    assert found[1] == pytest.approx(1 / (1 + 0.1**2) ** 0.5, abs=1e-6)
    assert far.pk != near.pk


@contextlib.contextmanager
def counted_scopes() -> Iterator[list[str]]:
    """The COUNT statements sent inside the block: one each time a look-up counts its scope."""
    counts: list[str] = []

    def count_seen(execute, sql, params, many, context):
        if "COUNT(" in sql:
            counts.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(count_seen):
        yield counts


@contextlib.contextmanager
def searches_sent() -> Iterator[list[str]]:
    """The plan of each look-up statement sent inside the block: "approximate" (the HNSW settings come with
    it) or "exact"."""
    plans: list[str] = []

    def search_seen(execute, sql, params, many, context):
        if "embedding <=>" in sql:
            plans.append("approximate" if "set_config('enable_sort'" in sql else "exact")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(search_seen):
        yield plans


def test_cache_lookup_keeps_a_scopes_count_and_picks_the_plan_by_it(agent, target, monkeypatch):
    monkeypatch.setattr(cache, "EXACT_SCAN_LIMIT", 2)
    for text in (REQUEST, PARAPHRASE, UNRELATED):
        store(agent, target, text)

    with counted_scopes() as counts, searches_sent() as plans:
        first = lookup(agent, target)
        CacheEntry.objects.filter(agent=agent).exclude(request_text=REQUEST).delete()
        second = lookup(agent, target)

    assert first is not None
    assert second is not None
    assert len(counts) == 1  # the second look-up took the first one's count
    assert plans == ["approximate", "approximate"]


def test_cache_lookup_searches_a_small_scope_exactly(agent, target):
    for text in (REQUEST, PARAPHRASE, UNRELATED):
        store(agent, target, text)

    with searches_sent() as plans:
        found = lookup(agent, target, PARAPHRASE.upper())

    assert found is not None
    assert found[0].request_text == PARAPHRASE
    assert plans == ["exact"]


def test_cache_lookup_counts_an_empty_scope_again(agent, target):
    with counted_scopes() as counts:
        missed = lookup(agent, target)
        store(agent, target)
        found = lookup(agent, target)

    assert missed is None
    assert found is not None
    assert len(counts) == 2


def test_cache_lookup_counts_a_scope_again_once_its_count_is_old(agent, target, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(cache._scope_sizes, "clock", lambda: clock[0])
    store(agent, target)
    monkeypatch.setattr(cache, "EXACT_SCAN_LIMIT", 1)
    assert lookup(agent, target) is not None
    store(agent, target, PARAPHRASE)
    seen: list[int] = []
    count = cache._scope_size

    def size(*args):
        seen.append(count(*args))
        return seen[-1]

    monkeypatch.setattr(cache, "_scope_size", size)

    clock[0] += cache.SCOPE_SIZE_SECONDS - 1
    lookup(agent, target)
    clock[0] += 1
    lookup(agent, target)

    assert seen == [1, 2]


def test_cache_lookup_puts_the_planner_settings_back(agent, target, monkeypatch):
    monkeypatch.setattr(cache, "EXACT_SCAN_LIMIT", 0)
    store(agent, target)
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL hnsw.ef_search = 40")
        cursor.execute("SET LOCAL hnsw.iterative_scan = off")  # Keel's sessions start with relaxed_order

        assert lookup(agent, target) is not None

        cursor.execute(
            "SELECT current_setting('enable_sort'), current_setting('hnsw.ef_search'),"
            " current_setting('hnsw.iterative_scan')"
        )
        assert cursor.fetchone() == ("on", "40", "off")


@pytest.mark.parametrize("repeat", [False, True])
def test_the_large_scope_search_walks_the_hnsw_index(agent, target, repeat):
    # The plan the latency target relies on; left to itself, the planner sorts a table this small.
    store(agent, target)
    statement = cache._lookup_statement(approximate=True, repeat=repeat, prompt_version=False)
    scope = [agent.workspace_id, agent.pk, target.pk, HASH, timezone.now()]
    vector = cache._vector_literal(embed_offline(REQUEST))
    params = [*scope, cache.request_hash(REQUEST), REQUEST] if repeat else []
    with connection.cursor() as cursor:
        cursor.execute(cache._HNSW_SETTINGS_SQL, [str(cache.HNSW_EF_SEARCH), str(cache.HNSW_MAX_SCAN_TUPLES)])
        cursor.execute(f"EXPLAIN {statement}", [*params, vector, *scope])
        plan = "\n".join(row[0] for row in cursor.fetchall())

    assert "Index Scan using cacheentry_embedding on routing_cacheentry" in plan
    if repeat:
        assert "One-Time Filter: (NOT (InitPlan" in plan  # the search runs only without a repeat


@pytest.mark.django_db(transaction=True)
def test_a_large_scope_look_up_outside_a_transaction_leaves_the_session_as_it_was(monkeypatch):
    # Outside a transaction the settings and the search go as one query string, one implicit transaction.
    workspace = WorkspaceFactory.create()
    agent = AgentFactory.create(workspace=workspace)
    target = ModelTargetFactory.create(workspace=workspace)
    monkeypatch.setattr(cache, "EXACT_SCAN_LIMIT", 0)
    store(agent, target)
    store(agent, target, UNRELATED)

    with searches_sent() as plans:
        found = lookup(agent, target, REQUEST.lower())
        repeat = lookup(agent, target, UNRELATED, request_text=UNRELATED)

    assert plans == ["approximate", "approximate"]
    assert found is not None
    assert found[0].request_text == REQUEST
    assert repeat is not None
    assert repeat == (CacheEntry.objects.get(request_text=UNRELATED), 1.0)
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('enable_sort'), current_setting('hnsw.ef_search')")
        assert cursor.fetchone() == ("on", "40")


# --- Eligibility --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "tier", "has_tools", "end_user", "expected"),
    [
        (None, TierChoice.SINGLE_CALL, False, None, (False, "no_config")),
        ({"cache_enabled": False}, TierChoice.SINGLE_CALL, False, None, (False, "cache_disabled")),
        ({"cache_enabled": True}, TierChoice.AGENTIC, False, None, (False, "agentic_tier")),
        ({"cache_enabled": True}, TierChoice.HUMAN, False, None, (False, "human_tier")),
        ({"cache_enabled": True}, TierChoice.SINGLE_CALL, True, None, (False, "tool_request")),
        ({"cache_enabled": True}, TierChoice.CHAIN, False, "rider-42", (False, "end_user")),
        (
            {"cache_enabled": True, "cache_end_user_requests": True},
            TierChoice.SINGLE_CALL,
            False,
            "rider-42",
            (True, ""),
        ),
        ({"cache_enabled": True}, TierChoice.SINGLE_CALL, False, "", (True, "")),
        ({"cache_enabled": True}, TierChoice.SINGLE_CALL, False, None, (True, "")),
        ({"cache_enabled": True}, TierChoice.CHAIN, False, None, (True, "")),
    ],
)
def test_cache_eligibility(agent, settings, tier, has_tools, end_user, expected):
    config = None if settings is None else RouterConfigFactory.create(agent=agent, **settings)

    assert cache.cache_eligibility(config=config, tier=tier, has_tools=has_tools, end_user=end_user) == expected


@pytest.mark.parametrize(
    ("messages", "tools", "expected"),
    [
        ([{"role": "user", "content": "hi"}], None, False),
        ([{"role": "user", "content": "hi"}], [], False),
        ([{"role": "user", "content": "hi"}], [{"type": "function", "function": {"name": "lookup"}}], True),
        ([{"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]}], None, True),
        ([{"role": "tool", "tool_call_id": "c1", "content": "{}"}], None, True),
        ([{"role": "assistant", "content": None, "function_call": {"name": "lookup"}}], None, True),
        ([{"role": "function", "name": "lookup", "content": "{}"}], None, True),
    ],
)
def test_request_uses_tools(messages, tools, expected):
    assert cache.request_uses_tools(messages=messages, tools=tools) is expected


def test_system_hash():
    assert cache.system_hash("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert cache.system_hash("You help.") != cache.system_hash("You help. ")


# --- Hits and their review ----------------------------------------------------------------------------


def test_cache_hit_record_counts_on_the_entry(agent, target):
    entry = store(agent, target)

    first = cache.cache_hit_record(entry=entry, trace_id="c" * 32, request_text=PARAPHRASE, similarity=0.91)
    cache.cache_hit_record(entry=entry, trace_id="d" * 32, request_text=REQUEST, similarity=1.0)

    entry.refresh_from_db()
    first.refresh_from_db()
    assert entry.hit_count == 2
    assert (first.workspace_id, first.agent_id, first.entry_id) == (agent.workspace_id, agent.pk, entry.pk)
    assert (first.trace_id, first.request_text, first.similarity) == ("c" * 32, PARAPHRASE, 0.91)
    assert first.false_hit is None
    assert first.reviewed_by is None
    assert first.reviewed_at is None


def test_cache_hit_review_records_the_verdict_and_a_later_one_replaces_it(workspace):
    hit = CacheHitFactory.create(entry__workspace=workspace)
    reviewer = UserFactory.create(username="reviewer")
    before = timezone.now()

    cache.cache_hit_review(hit=hit, false_hit=True, reviewed_by=reviewer)

    hit.refresh_from_db()
    assert hit.false_hit is True
    assert hit.reviewed_by == reviewer
    assert hit.reviewed_at is not None
    assert hit.reviewed_at >= before

    cache.cache_hit_review(hit=hit, false_hit=False, reviewed_by=reviewer)

    hit.refresh_from_db()
    assert hit.false_hit is False


def test_cache_hits_for_review_is_scoped_and_newest_first(workspace, other_workspace, django_assert_num_queries):
    now = timezone.now()
    agent = AgentFactory.create(workspace=workspace)
    other_agent = AgentFactory.create(workspace=workspace)
    old = CacheHitFactory.create(entry__workspace=workspace, entry__agent=agent, created_at=now - timedelta(hours=2))
    reviewed = CacheHitFactory.create(
        entry__workspace=workspace, entry__agent=agent, created_at=now - timedelta(hours=1), false_hit=False
    )
    newest = CacheHitFactory.create(entry__workspace=workspace, entry__agent=other_agent, created_at=now)
    CacheHitFactory.create(entry__workspace=other_workspace)

    with django_assert_num_queries(1):
        hits = cache.cache_hits_for_review(workspace=workspace)
        originals = [hit.entry.request_text for hit in hits]

    assert hits == [newest, reviewed, old]
    assert originals == [newest.entry.request_text, reviewed.entry.request_text, old.entry.request_text]
    assert cache.cache_hits_for_review(workspace=workspace, agent=agent) == [reviewed, old]
    assert cache.cache_hits_for_review(workspace=workspace, only_unreviewed=True) == [newest, old]
    assert cache.cache_hits_for_review(workspace=workspace, limit=1) == [newest]
    # An agent of another workspace finds nothing in this one.
    assert cache.cache_hits_for_review(workspace=other_workspace, agent=agent) == []


# --- Invalidation and sweep -----------------------------------------------------------------------------


def test_cache_entries_invalidate_for_prompt(agent, target, versions, workspace):
    now = timezone.now()
    stale = store(agent, target, prompt_version=versions[0])
    stale_with_hit = store(agent, target, "Where is my parcel?", prompt_version=versions[0])
    hit = cache.cache_hit_record(entry=stale_with_hit, trace_id="e" * 32, request_text="parcel?", similarity=0.95)
    live = store(agent, target, prompt_version=versions[1])
    without_version = store(agent, target, prompt_version=None)
    other_agent = AgentFactory.create(workspace=workspace)
    other_version = prompt_with_versions(agent=other_agent, name="other/system").versions.get()
    other = store(other_agent, target, prompt_version=other_version)

    retired = cache.cache_entries_invalidate_for_prompt(agent=agent, keep_prompt_version_ids=[versions[1].pk], now=now)

    assert retired == 2
    assert set(CacheEntry.objects.values_list("pk", flat=True)) == {
        stale_with_hit.pk,
        live.pk,
        without_version.pk,
        other.pk,
    }
    assert not CacheEntry.objects.filter(pk=stale.pk).exists()
    stale_with_hit.refresh_from_db()
    assert stale_with_hit.expires_at == now
    assert CacheHit.objects.filter(pk=hit.pk).exists()
    assert lookup(agent, target, "Where is my parcel?", prompt_version=versions[0]) is None
    assert lookup(agent, target, prompt_version=versions[1]) is not None


def test_cache_entries_invalidate_for_prompt_with_nothing_kept(agent, target, versions):
    store(agent, target, prompt_version=versions[0])
    store(agent, target, prompt_version=versions[1])

    assert cache.cache_entries_invalidate_for_prompt(agent=agent, keep_prompt_version_ids=()) == 2
    assert CacheEntry.objects.count() == 0


def test_deleting_a_target_keeps_the_hits_its_answers_served_for_review(agent, target, workspace):
    other_target = ModelTargetFactory.create(workspace=workspace, alias="other-target")
    unused = store(agent, target)
    answered = store(agent, target, "Where is my parcel?")
    hit = cache.cache_hit_record(entry=answered, trace_id="e" * 32, request_text="parcel?", similarity=0.95)
    cache.cache_hit_review(hit=hit, false_hit=True, reviewed_by=UserFactory.create())
    elsewhere = store(agent, other_target)

    services.model_target_delete(target=target)

    assert set(CacheEntry.objects.values_list("pk", flat=True)) == {answered.pk, elsewhere.pk}
    assert not CacheEntry.objects.filter(pk=unused.pk).exists()
    answered.refresh_from_db()
    assert answered.model_target_id is None
    assert answered.expires_at <= timezone.now()
    assert CacheHit.objects.get(pk=hit.pk).false_hit is True
    assert [h.pk for h in cache.cache_hits_for_review(workspace=workspace)] == [hit.pk]
    assert lookup(agent, other_target) is not None


def test_cache_entries_sweep(workspace, monkeypatch):
    monkeypatch.setattr(cache, "SWEEP_BATCH", 2)
    now = timezone.now()
    expired = CacheEntryFactory.create_batch(3, workspace=workspace, expires_at=now - timedelta(seconds=1))
    live = CacheEntryFactory.create(workspace=workspace, expires_at=now + timedelta(seconds=1))
    reviewable = CacheEntryFactory.create(workspace=workspace, expires_at=now - timedelta(days=29))
    kept_hit = CacheHitFactory.create(entry=reviewable)
    past_retention = CacheEntryFactory.create(workspace=workspace, expires_at=now - cache.HIT_RETENTION)
    gone_hit = CacheHitFactory.create(entry=past_retention)

    deleted = cache.cache_entries_sweep(now=now)

    assert deleted == 4
    assert set(CacheEntry.objects.values_list("pk", flat=True)) == {live.pk, reviewable.pk}
    assert set(CacheHit.objects.values_list("pk", flat=True)) == {kept_hit.pk}
    assert not CacheEntry.objects.filter(pk__in=[entry.pk for entry in expired]).exists()
    assert not CacheHit.objects.filter(pk=gone_hit.pk).exists()
    assert cache.cache_entries_sweep(now=now) == 0


# --- Threshold report ---------------------------------------------------------------------------------


def test_cache_threshold_report(workspace, other_workspace):
    now = timezone.now()
    agent = AgentFactory.create(workspace=workspace)
    RouterConfigFactory.create(agent=agent, cache_enabled=True, cache_threshold=0.90)
    entry = CacheEntryFactory.create(workspace=workspace, agent=agent)
    # Hits by similarity, with reviews: True = flagged false, False = confirmed, None = not reviewed.
    for similarity, false_hit in [
        (0.99, False),
        (0.98, None),
        (0.96, False),
        (0.95, True),
        (0.94, None),
        (0.92, True),
        (0.91, True),
        (0.86, False),  # recorded while the threshold was lower
    ]:
        CacheHitFactory.create(entry=entry, similarity=similarity, false_hit=false_hit)
    RoutingDecisionFactory.create_batch(12, workspace=workspace, agent=agent)
    RoutingDecisionFactory.create_batch(8, workspace=workspace, agent=agent, cache_hit=True)
    # Another agent's hits and decisions, and an old period, stay out.
    foreign = AgentFactory.create(workspace=other_workspace)
    CacheHitFactory.create(entry__workspace=other_workspace, entry__agent=foreign, similarity=0.99, false_hit=True)
    RoutingDecisionFactory.create_batch(5, workspace=other_workspace, agent=foreign)
    CacheHitFactory.create(entry=entry, similarity=0.99, false_hit=True, created_at=now - timedelta(days=40))
    RoutingDecisionFactory.create_batch(30, workspace=workspace, agent=agent, created_at=now - timedelta(days=40))

    report = cache.cache_threshold_report(
        agent=agent, thresholds=(0.85, 0.90, 0.93, 0.95, 0.99), since=now - timedelta(days=30)
    )

    assert report == [
        {
            "threshold": 0.85,
            "hits": 8,
            "decisions": 20,
            "hit_rate": 0.4,
            "reviewed": 6,
            "false_hits": 3,
            "false_hit_rate": 0.5,
            "lower_bound": True,
        },
        {
            "threshold": 0.90,
            "hits": 7,
            "decisions": 20,
            "hit_rate": 0.35,
            "reviewed": 5,
            "false_hits": 3,
            "false_hit_rate": 0.6,
            "lower_bound": False,
        },
        {
            "threshold": 0.93,
            "hits": 5,
            "decisions": 20,
            "hit_rate": 0.25,
            "reviewed": 3,
            "false_hits": 1,
            "false_hit_rate": pytest.approx(1 / 3),
            "lower_bound": False,
        },
        {
            "threshold": 0.95,
            "hits": 4,
            "decisions": 20,
            "hit_rate": 0.2,
            "reviewed": 3,
            "false_hits": 1,
            "false_hit_rate": pytest.approx(1 / 3),
            "lower_bound": False,
        },
        {
            "threshold": 0.99,
            "hits": 1,
            "decisions": 20,
            "hit_rate": 0.05,
            "reviewed": 1,
            "false_hits": 0,
            "false_hit_rate": 0.0,
            "lower_bound": False,
        },
    ]

    everything = cache.cache_threshold_report(agent=agent, thresholds=(0.99,))
    assert everything[0]["hits"] == 2
    assert everything[0]["decisions"] == 50
    assert everything[0]["false_hits"] == 1


def test_cache_threshold_report_without_traffic(agent):
    report = cache.cache_threshold_report(agent=agent)

    assert [row["threshold"] for row in report] == [0.80, 0.85, 0.90, 0.93, 0.95, 0.97, 0.99]
    assert {(row["hits"], row["decisions"], row["hit_rate"], row["false_hit_rate"]) for row in report} == {
        (0, 0, None, None)
    }
    assert {row["lower_bound"] for row in report} == {False}


# --- Request embeddings ------------------------------------------------------------------------------------

EMBEDDING_PROVIDER = "fake-embed"


class FakeEmbeddingLLM(CustomLLM):
    """A fake embedding provider: a fixed 1536-wide vector per text, or the scripted error; it keeps
    every call's model, input, base URL, key and timeout."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[dict[str, Any]] = []
        self.error: Exception | None = None

    @staticmethod
    def vector_of(text: str) -> list[float]:
        values = embed_offline(text)
        return [values[index % 256] * (1 + index // 256) for index in range(1536)]

    def embedding(
        self,
        model: str,
        input: list[Any],
        model_response: EmbeddingResponse,
        print_verbose: Callable[..., Any],
        logging_obj: Any,
        optional_params: dict[str, Any],
        api_key: str | None = None,
        api_base: str | None = None,
        timeout: float | httpx.Timeout | None = None,
        litellm_params: Any = None,
    ) -> EmbeddingResponse:
        self.calls.append(
            {"model": model, "input": input, "api_base": api_base, "api_key": api_key, "timeout": timeout}
        )
        if self.error is not None:
            raise self.error
        return EmbeddingResponse(
            model=model,
            data=[{"object": "embedding", "index": 0, "embedding": self.vector_of(text)} for text in input],
        )


@pytest.fixture
def fake_embeddings(monkeypatch):
    import litellm

    network_forbid(monkeypatch)
    fake = FakeEmbeddingLLM()
    monkeypatch.setattr(
        litellm,
        "custom_provider_map",
        [*litellm.custom_provider_map, {"provider": EMBEDDING_PROVIDER, "custom_handler": fake}],
    )
    return fake


def test_request_embed_without_target_is_offline():
    embedded = cache.request_embed(text=REQUEST, target=None)

    assert embedded == cache.Embedding(vector=embed_offline(REQUEST), source="offline")


def test_request_embed_through_the_provider(workspace, fake_embeddings):
    target = ModelTargetFactory.create(
        workspace=workspace,
        model=f"{EMBEDDING_PROVIDER}/text-embedding-small",
        api_base="http://embeddings.internal/v1",
        api_key_encrypted=crypto.encrypt("sk-embed"),
        timeout_seconds=4.0,
    )

    embedded = cache.request_embed(text=REQUEST, target=target)

    assert embedded.source == "provider"
    assert embedded.vector == project(FakeEmbeddingLLM.vector_of(REQUEST))
    assert len(embedded.vector) == 256
    assert fake_embeddings.calls == [
        {
            "model": "text-embedding-small",
            "input": [REQUEST],
            "api_base": "http://embeddings.internal/v1",
            "api_key": "sk-embed",
            "timeout": 4.0,
        }
    ]


def test_request_embed_falls_back_offline_when_the_provider_fails(workspace, fake_embeddings, caplog):
    target = ModelTargetFactory.create(workspace=workspace, model=f"{EMBEDDING_PROVIDER}/text-embedding-small")
    fake_embeddings.error = RuntimeError("the embedding server is down")

    with caplog.at_level(logging.WARNING, logger="routing.cache"):
        embedded = cache.request_embed(text=REQUEST, target=target)

    assert embedded == cache.Embedding(vector=embed_offline(REQUEST), source="offline_fallback")
    assert len(fake_embeddings.calls) == 1
    assert [record.getMessage() for record in caplog.records] == ["routing.embedding_fallback"]
    assert caplog.records[0].target_id == target.pk
    assert "the embedding server is down" in caplog.records[0].error


def test_request_embed_falls_back_when_the_key_cannot_be_decrypted(workspace, fake_embeddings):
    target = ModelTargetFactory.create(
        workspace=workspace, model=f"{EMBEDDING_PROVIDER}/text-embedding-small", api_key_encrypted="not a token"
    )

    embedded = cache.request_embed(text=REQUEST, target=target)

    assert embedded.source == "offline_fallback"
    assert fake_embeddings.calls == []


def test_provider_embeddings_find_a_stored_paraphrase(agent, target, fake_embeddings):
    embedder = ModelTargetFactory.create(workspace=agent.workspace, model=f"{EMBEDDING_PROVIDER}/text-embedding-small")
    stored = store(agent, target, embedding=cache.request_embed(text=REQUEST, target=embedder).vector)

    found = lookup(agent, target, embedding=cache.request_embed(text=PARAPHRASE, target=embedder).vector, threshold=0.8)

    assert found is not None
    assert found[0].pk == stored.pk
