"""Rate limits: a key over its budget for a scope gets 429 `rate_limited` with Retry-After, and others keep
theirs; an address that sends unknown keys is refused before its next key is looked at; failed sign-ins
per address and username lock that username out of that address for a while, with a clear message.

Time is the limiter's clock, moved by the test (no sleeping). The limits are small here; the test settings
switch them off for every other test."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from agent_registry import ratelimit
from agent_registry import services as registry_services
from agent_registry.models import RateLimitBucket, Workspace
from agent_registry.tests.factories import PASSWORD, MembershipFactory, UserFactory

pytestmark = pytest.mark.django_db


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    settings.KEEL_RATE_LIMIT_ENABLED = True
    # (requests per second, burst): the read scope refills one request a second and holds two.
    settings.KEEL_RATE_LIMITS = {"read": (1, 2), "write": (1, 2), "ingest": (2, 3), "gateway": (2, 3), "train": (1, 2)}
    settings.KEEL_RATE_LIMIT_PROCESS_SCOPES = ["ingest", "gateway"]
    settings.KEEL_RATE_LIMIT_AUTH_FAILURES = 3
    settings.KEEL_RATE_LIMIT_AUTH_WINDOW_SECONDS = 60
    settings.KEEL_RATE_LIMIT_LOGIN_FAILURES = 3
    settings.KEEL_RATE_LIMIT_LOGIN_WINDOW_SECONDS = 300
    fake = Clock()
    monkeypatch.setattr(ratelimit, "clock", fake)
    ratelimit.reset()
    yield fake
    ratelimit.reset()


def _client(workspace: Workspace, scopes: list[str], address: str = "127.0.0.1") -> Client:
    _, raw = registry_services.apikey_create(workspace=workspace, name="limited", scopes=scopes)
    return Client(headers={"Authorization": f"Bearer {raw}"}, REMOTE_ADDR=address)


def _refused(response: Any, retry_after: str) -> None:
    assert response.status_code == 429
    assert response["Retry-After"] == retry_after
    body = response.json()
    assert body["code"] == "rate_limited"
    assert "rate limit" in body["detail"] or "retry in" in body["detail"]


# --- Per key -----------------------------------------------------------------------------------------------


def test_a_key_over_its_budget_gets_429_and_another_key_does_not(workspace: Workspace, clock: Clock) -> None:
    first = _client(workspace, ["read"])
    second = _client(workspace, ["read"])

    statuses = [first.get("/api/v1/agents").status_code for _ in range(2)]
    over = first.get("/api/v1/agents")
    other = second.get("/api/v1/agents")

    assert statuses == [200, 200]
    _refused(over, "1")
    assert over.json()["detail"].startswith("this API key is over its read rate limit")
    assert other.status_code == 200


def test_the_budget_refills_with_time(workspace: Workspace, clock: Clock) -> None:
    client = _client(workspace, ["read"])
    for _ in range(2):
        client.get("/api/v1/agents")
    assert client.get("/api/v1/agents").status_code == 429

    clock.advance(0.5)
    half = client.get("/api/v1/agents")
    clock.advance(0.5)
    one = [client.get("/api/v1/agents").status_code for _ in range(2)]
    clock.advance(3600)
    full = [client.get("/api/v1/agents").status_code for _ in range(3)]

    _refused(half, "1")
    assert one == [200, 429]
    assert full == [200, 200, 429]  # a full bucket holds the burst, not an hour of requests


def test_each_scope_has_its_own_budget(workspace: Workspace, clock: Clock) -> None:
    client = _client(workspace, ["read", "write"])
    for _ in range(2):
        client.get("/api/v1/agents")

    read = client.get("/api/v1/agents")
    write = client.post("/api/v1/agents", data=json.dumps({"slug": "a", "name": "A"}), content_type="application/json")

    assert read.status_code == 429
    assert write.status_code == 201


def test_the_ingest_endpoint_answers_429_with_retry_after(workspace: Workspace, clock: Clock) -> None:
    client = _client(workspace, ["ingest"])
    body = json.dumps({"resourceSpans": []})

    statuses = [client.post("/v1/traces", body, content_type="application/json").status_code for _ in range(3)]
    over = client.post("/v1/traces", body, content_type="application/json")

    assert statuses == [200, 200, 200]
    _refused(over, "1")  # 2 a second: half a second to the next, rounded up


def test_the_gateway_answers_429_in_openai_s_shape_too(workspace: Workspace, clock: Clock) -> None:
    client = _client(workspace, ["gateway"])

    statuses = [client.get("/v1/models").status_code for _ in range(3)]
    over = client.get("/v1/models")

    assert statuses == [200, 200, 200]
    _refused(over, "1")
    assert over.json()["error"]["type"] == "rate_limit_error"


def test_a_langfuse_client_with_basic_auth_is_limited_by_its_key(workspace: Workspace, clock: Clock) -> None:
    import base64

    _, raw = registry_services.apikey_create(workspace=workspace, name="lf", scopes=["read"])
    basic = base64.b64encode(f"pk-lf-any:{raw}".encode()).decode()
    client = Client(headers={"Authorization": f"Basic {basic}"})

    statuses = [client.get("/api/public/v2/prompts/missing").status_code for _ in range(3)]

    assert statuses == [404, 404, 429]


def test_the_hot_scopes_can_count_in_the_database_instead(workspace: Workspace, clock: Clock, settings: Any) -> None:
    settings.KEEL_RATE_LIMIT_PROCESS_SCOPES = []
    client = _client(workspace, ["gateway"])

    statuses = [client.get("/v1/models").status_code for _ in range(4)]
    ratelimit.reset()  # another process: its memory is empty, the database is not
    after = client.get("/v1/models")

    assert statuses == [200, 200, 200, 429]
    assert after.status_code == 429
    assert RateLimitBucket.objects.filter(key__endswith=":gateway").count() == 1


# --- Unknown keys per address ------------------------------------------------------------------------------


def test_an_address_sending_unknown_keys_is_refused_before_its_next_key_is_checked(
    workspace: Workspace, clock: Clock
) -> None:
    _, raw = registry_services.apikey_create(workspace=workspace, name="good", scopes=["read"])
    guesser = Client(headers={"Authorization": "Bearer keel_000000000000_guess"}, REMOTE_ADDR="198.51.100.7")
    right_key_same_address = Client(headers={"Authorization": f"Bearer {raw}"}, REMOTE_ADDR="198.51.100.7")
    right_key_elsewhere = Client(headers={"Authorization": f"Bearer {raw}"}, REMOTE_ADDR="203.0.113.5")

    guesses = [guesser.get("/api/v1/agents").status_code for _ in range(3)]
    over = guesser.get("/api/v1/agents")
    blocked = right_key_same_address.get("/api/v1/agents")
    elsewhere = right_key_elsewhere.get("/api/v1/agents")
    clock.advance(20)  # 3 a minute: one failure back every 20 s
    later = right_key_same_address.get("/api/v1/agents")

    assert guesses == [401, 401, 401]
    _refused(over, "20")
    assert over.json()["detail"].startswith("too many requests with an invalid API key from this address")
    _refused(blocked, "20")
    assert elsewhere.status_code == 200
    assert later.status_code == 200


def test_another_process_refuses_the_address_at_its_first_failure(workspace: Workspace, clock: Clock) -> None:
    guesser = Client(headers={"Authorization": "Bearer keel_000000000000_guess"}, REMOTE_ADDR="198.51.100.7")
    for _ in range(3):
        guesser.get("/v1/models")
    ratelimit.reset()  # the failures were counted in PostgreSQL; this process has no block in memory

    response = guesser.get("/v1/models")

    _refused(response, "20")


def test_requests_with_no_key_are_not_counted_as_guesses(workspace: Workspace, clock: Clock) -> None:
    anonymous = Client(REMOTE_ADDR="198.51.100.8")

    statuses = [anonymous.get("/api/v1/agents").status_code for _ in range(5)]

    assert statuses == [401] * 5


# --- Sign-in -----------------------------------------------------------------------------------------------


def _sign_in(client: Client, username: str, password: str) -> Any:
    return client.post("/login/", {"username": username, "password": password})


def test_failed_sign_ins_lock_the_username_out_of_the_address_with_a_clear_message(
    workspace: Workspace, clock: Clock
) -> None:
    user = UserFactory.create(username="ada")
    MembershipFactory.create(workspace=workspace, user=user)
    browser = Client(REMOTE_ADDR="192.0.2.10")
    other_address = Client(REMOTE_ADDR="192.0.2.11")

    failures = [_sign_in(browser, "ada", "wrong").status_code for _ in range(3)]
    locked = _sign_in(browser, "ada", PASSWORD)
    elsewhere = _sign_in(other_address, "ada", PASSWORD)

    assert failures == [200, 200, 200]
    assert locked.status_code == 429
    assert locked["Retry-After"] == "100"  # 3 per 5 minutes: one back every 100 s
    page = locked.content.decode()
    assert "Too many failed sign-ins for ada from your address. Try again in 100 seconds." in page
    assert "_auth_user_id" not in browser.session
    assert elsewhere.status_code == 302


def test_the_lock_ends_and_a_successful_sign_in_does_not_count(workspace: Workspace, clock: Clock) -> None:
    UserFactory.create(username="ada")
    browser = Client(REMOTE_ADDR="192.0.2.10")

    signed_in = [_sign_in(Client(REMOTE_ADDR="192.0.2.10"), "ada", PASSWORD).status_code for _ in range(5)]
    failures = [_sign_in(browser, "ADA", "wrong").status_code for _ in range(3)]
    locked = _sign_in(browser, "ada", PASSWORD)
    clock.advance(300)
    after = _sign_in(browser, "ada", PASSWORD)

    assert signed_in == [302] * 5
    assert failures == [200, 200, 200]
    assert locked.status_code == 429  # the username's case does not buy more attempts
    assert after.status_code == 302


def test_another_username_from_the_same_address_is_not_locked(workspace: Workspace, clock: Clock) -> None:
    UserFactory.create(username="ada")
    UserFactory.create(username="bob")
    browser = Client(REMOTE_ADDR="192.0.2.10")
    for _ in range(3):
        _sign_in(browser, "ada", "wrong")

    assert _sign_in(browser, "bob", PASSWORD).status_code == 302


# --- Housekeeping ------------------------------------------------------------------------------------------


def test_the_sweep_deletes_only_buckets_that_are_full_again(workspace: Workspace, clock: Clock) -> None:
    client = _client(workspace, ["read"])
    client.get("/api/v1/agents")
    _sign_in(Client(REMOTE_ADDR="192.0.2.10"), "nobody", "wrong")
    clock.advance(120)  # the read bucket is full again; the sign-in one refills over 5 minutes

    swept = ratelimit.buckets_sweep()

    assert swept == 0  # within the longest refill time (5 min) plus a minute, nothing goes
    clock.advance(300)
    assert ratelimit.buckets_sweep() == 2
    assert not RateLimitBucket.objects.exists()


def test_with_limits_off_nothing_is_counted(workspace: Workspace, clock: Clock, settings: Any) -> None:
    settings.KEEL_RATE_LIMIT_ENABLED = False
    client = _client(workspace, ["read"])

    statuses = {client.get("/api/v1/agents").status_code for _ in range(5)}

    assert statuses == {200}
    assert not RateLimitBucket.objects.exists()


def test_the_process_buckets_forget_full_buckets_when_they_grow_past_their_size() -> None:
    buckets = ratelimit.ProcessBuckets(max_keys=2)
    limit = ratelimit.Limit(rate=1, burst=2)

    buckets.take("a", limit, now=0)
    buckets.take("b", limit, now=0)
    buckets.take("c", limit, now=10)  # a and b are full again by now: forgotten
    refused = [buckets.take("c", limit, now=10).allowed for _ in range(2)]

    assert set(buckets._buckets) == {"c"}
    assert refused == [True, False]
