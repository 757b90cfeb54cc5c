"""The items of a comparison come a page at a time (API: offset + limit; dashboard: a page size with
previous/next links), while the summary counts and metrics stay over every item; the queries a page
costs do not grow with its size."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from agent_registry.models import Role, Workspace
from agent_registry.tests.factories import MembershipFactory
from evals import interchange, runs
from evals.models import Run
from frontend import evals_views

pytestmark = pytest.mark.django_db

SHARED = 27  # items both runs have: k0..k26
CANDIDATE_ONLY = 3  # k100..k102, first in the candidate's order
BASELINE_ONLY = 3  # k200..k202, after every candidate item
TOTAL = SHARED + CANDIDATE_ONLY + BASELINE_ONLY


def _imported(workspace: Workspace, keys: list[str], rewards: list[float], name: str) -> Run:
    lines = [
        {
            "responses_create_params": {"input": f"question {key}"},
            "response": f"answer {key}",
            "reward": reward,
            "keel": {"task_index": index, "sample": 0, "passed": reward >= 1, "metadata": {"item_key": key}},
        }
        for index, (key, reward) in enumerate(zip(keys, rewards, strict=True))
    ]
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    return interchange.run_import(workspace=workspace, content=content, name=name)


@pytest.fixture
def pair(workspace: Workspace) -> tuple[Run, Run]:
    """Baseline: the shared items (every other one passing), then its own. Candidate: its own first,
    then the shared ones, all passing."""
    shared = [f"k{n}" for n in range(SHARED)]
    baseline = _imported(
        workspace,
        shared + [f"k{200 + n}" for n in range(BASELINE_ONLY)],
        [float(n % 2) for n in range(SHARED)] + [1.0] * BASELINE_ONLY,
        "baseline",
    )
    candidate = _imported(
        workspace, [f"k{100 + n}" for n in range(CANDIDATE_ONLY)] + shared, [1.0] * (CANDIDATE_ONLY + SHARED), "cand"
    )
    return baseline, candidate


@pytest.fixture
def client(api_client_for: Any, workspace: Workspace) -> Client:
    client: Client = api_client_for(workspace, scopes=("read",))
    return client


def _url(baseline: Run, candidate: Run, **query: Any) -> str:
    extra = "".join(f"&{name}={value}" for name, value in query.items())
    return f"/api/v1/runs/compare?baseline={baseline.pk}&candidate={candidate.pk}&items=true{extra}"


def test_the_api_pages_through_every_item_and_keeps_the_summary_over_all(client: Client, pair: tuple[Run, Run]) -> None:
    baseline, candidate = pair
    everything = runs.runs_compare_items(
        baseline=baseline, candidate=candidate, evaluators_named=[interchange.IMPORTED_EVALUATOR]
    )
    seen: list[dict[str, Any]] = []
    offsets = []
    url: str | None = _url(baseline, candidate, limit=7)
    while url is not None:
        response = client.get(url)
        assert response.status_code == 200, response.content
        body = response.json()
        offsets.append(body["items_offset"])
        assert len(body["items"]) <= 7
        seen.extend(body["items"])
        assert body["items_total"] == TOTAL
        # The summary is over every item whichever page is asked for.
        summary = body["metrics"][interchange.IMPORTED_EVALUATOR]
        assert (summary["items"], summary["only_in_a"], summary["only_in_b"]) == (SHARED, BASELINE_ONLY, CANDIDATE_ONLY)
        assert summary["improved"] == SHARED // 2 + 1  # the shared items that failed on the baseline
        if body["items_next_offset"] is None:
            assert "Link" not in response.headers
            url = None
        else:
            assert body["items_next_offset"] == body["items_offset"] + 7
            link = response.headers["Link"]
            assert link.endswith('>; rel="next"')
            url = link[1 : link.index(">")]
            assert f"offset={body['items_next_offset']}" in url
    assert offsets == [0, 7, 14, 21, 28]
    assert seen == everything
    assert [row["key"] for row in seen[:4]] == ["k100", "k101", "k102", "k0"]
    assert [(row["presence"], row["input_text"]) for row in seen[-3:]] == [
        ("baseline_only", "question k200"),
        ("baseline_only", "question k201"),
        ("baseline_only", "question k202"),
    ]


def test_a_page_past_the_end_is_empty_and_says_no_next(client: Client, pair: tuple[Run, Run]) -> None:
    body = client.get(_url(*pair, offset=500, limit=10)).json()

    assert (body["items"], body["items_total"], body["items_next_offset"]) == ([], TOTAL, None)


@pytest.mark.parametrize("query", ["limit=0", "limit=1001", "limit=many", "offset=-1", "offset=x"])
def test_bad_page_parameters_are_422(client: Client, pair: tuple[Run, Run], query: str) -> None:
    response = client.get(_url(*pair) + "&" + query)

    assert response.status_code == 422
    assert response.json()["code"] == "validation_error"
    assert response.json()["detail"]


def test_the_api_page_costs_the_same_queries_whatever_its_size(client: Client, pair: tuple[Run, Run]) -> None:
    # Both pages run from the candidate's items into the baseline's own, so they take the same path.
    baseline, candidate = pair
    client.get(_url(baseline, candidate))  # the key's first use records it (a write the pages after it skip)
    with CaptureQueriesContext(connection) as small:
        assert len(client.get(_url(baseline, candidate, offset=29, limit=2)).json()["items"]) == 2
    with CaptureQueriesContext(connection) as large:
        assert len(client.get(_url(baseline, candidate, offset=0, limit=40)).json()["items"]) == TOTAL

    assert len(small.captured_queries) == len(large.captured_queries)


@pytest.fixture
def viewer(workspace: Workspace) -> Client:
    client = Client()
    client.force_login(MembershipFactory.create(workspace=workspace, role=Role.VIEWER).user)
    return client


def _page(viewer: Client, workspace: Workspace, pair: tuple[Run, Run], page: int) -> Any:
    baseline, candidate = pair
    return viewer.get(f"/w/{workspace.slug}/evals/compare/?a={baseline.pk}&b={candidate.pk}&page={page}")


def test_the_compare_page_shows_one_page_of_items_with_links_either_side(
    viewer: Client, workspace: Workspace, pair: tuple[Run, Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(evals_views, "COMPARE_ITEMS_PER_PAGE", 10)
    baseline, candidate = pair

    first = _page(viewer, workspace, pair, 1)
    second = _page(viewer, workspace, pair, 2)
    last = _page(viewer, workspace, pair, 4)
    beyond = _page(viewer, workspace, pair, 99)

    (metric,) = first.context["metrics"]
    assert [row.key for row in metric.items] == ["k100", "k101", "k102"] + [f"k{n}" for n in range(7)]
    (metric,) = last.context["metrics"]
    assert [(row.key, row.presence) for row in metric.items] == [
        ("k200", "baseline_only"),
        ("k201", "baseline_only"),
        ("k202", "baseline_only"),
    ]
    assert beyond.context["items_page"] == last.context["items_page"]  # a page past the end shows the last
    base = f"?a={baseline.pk}&amp;b={candidate.pk}&amp;page="
    first_html, second_html, last_html = (page.content.decode() for page in (first, second, last))
    assert "Items 1–10 of 33 · page 1 of 4" in first_html
    assert f'rel="next" href="{base}2"' in first_html
    assert 'rel="prev"' not in first_html
    assert f'rel="prev" href="{base}1"' in second_html
    assert f'rel="next" href="{base}3"' in second_html
    assert "Items 31–33 of 33 · page 4 of 4" in last_html
    assert 'rel="next"' not in last_html
    # The counts above the items are over all of them, on every page.
    for html in (first_html, last_html):
        assert f"{SHARED} items in both runs compared; {BASELINE_ONLY} only in A and {CANDIDATE_ONLY} only in B" in html


def test_the_compare_page_costs_the_same_queries_whatever_its_page_size(
    viewer: Client, workspace: Workspace, pair: tuple[Run, Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Page 8 of 4 items (28-31) and page 1 of 40 both run from the candidate's items into the baseline's own.
    monkeypatch.setattr(evals_views, "COMPARE_ITEMS_PER_PAGE", 4)
    _page(viewer, workspace, pair, 1)  # the session's first request records what a later one reads
    with CaptureQueriesContext(connection) as small:
        response = _page(viewer, workspace, pair, 8)
    assert len(response.context["metrics"][0].items) == 4
    monkeypatch.setattr(evals_views, "COMPARE_ITEMS_PER_PAGE", 40)
    with CaptureQueriesContext(connection) as large:
        response = _page(viewer, workspace, pair, 1)
    assert len(response.context["metrics"][0].items) == TOTAL

    assert len(small.captured_queries) == len(large.captured_queries)
