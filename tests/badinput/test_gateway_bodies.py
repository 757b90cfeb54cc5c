"""POST /v1/chat/completions with generated request bodies, against the fake litellm provider of
routing/tests (no network).

A valid OpenAI request is answered (200, streamed or not, or 400 guardrail_blocked when the input
guardrails stop it) and the trace the gateway records of it is stored by the worker. A mutated or
arbitrary body is never a 5xx: it is refused with OpenAI's error JSON plus Keel's `detail` and `code`;
a refusal before the request is read (not JSON, not a chat request, too large) writes nothing, and
whatever a later refusal records (the gateway keeps a trace of failed requests) the worker stores.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.badinput.conftest import fuzz, json_paths, json_replace, rolled_back, row_counts
from tracing import services as tracing_services
from tracing.models import IngestBatch, Trajectory

pytestmark = pytest.mark.django_db

PATH = "/v1/chat/completions"
# Refused before the request is read: nothing may be written.
UNREAD = {"invalid_json", "invalid_request", "payload_too_large"}

TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=60)
WORD = st.text("abcdefghijklmnopqrstuvwxyz_-0123456789", min_size=1, max_size=12)
CONTENT = st.one_of(TEXT, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}), max_size=2))
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(WORD, children, max_size=3),
    max_leaves=6,
)


@st.composite
def chat_requests(draw: st.DrawFn) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(TEXT)})
    for _ in range(draw(st.integers(0, 2))):
        messages.append({"role": "user", "content": draw(CONTENT)})
        messages.append({"role": "assistant", "content": draw(TEXT)})
    messages.append({"role": "user", "content": draw(CONTENT)})
    body: dict[str, Any] = {
        "model": draw(st.sampled_from(["agent/ride-support", "fast"])),
        "messages": messages,
        "variables": {"company": "Acme"},
    }
    body.update(
        draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "temperature": st.floats(0, 2),
                    "top_p": st.floats(0, 1),
                    "max_tokens": st.integers(1, 4096),
                    "stop": st.one_of(WORD, st.lists(WORD, max_size=2)),
                    "seed": st.integers(-(2**31), 2**31),
                    "user": WORD,
                    "stream": st.booleans(),
                    "metadata": st.dictionaries(WORD, JSON, max_size=2),
                    "tools": st.lists(
                        st.fixed_dictionaries(
                            {
                                "type": st.just("function"),
                                "function": st.fixed_dictionaries(
                                    {"name": WORD, "parameters": st.just({"type": "object", "properties": {}})}
                                ),
                            }
                        ),
                        max_size=2,
                    ),
                },
            )
        )
    )
    return body


def _content(response: Any) -> bytes:
    return b"".join(response.streaming_content) if response.streaming else response.content


def _stored(new_batches: list[IngestBatch]) -> None:
    """What the gateway recorded, the worker stores: it never fails on it."""
    for batch in new_batches:
        tracing_services.span_batch_process(batch_id=batch.pk)
        batch.refresh_from_db()
        assert (batch.status, batch.error) == ("done", ""), batch.error


def _post(client: Any, body: bytes) -> tuple[Any, bytes, list[IngestBatch]]:
    batches = set(IngestBatch.objects.values_list("pk", flat=True))
    response = client.post(PATH, body, content_type="application/json")
    content = _content(response)  # a stream records its trace when it has been read to the end
    return response, content, list(IngestBatch.objects.exclude(pk__in=batches))


def _refused_clearly(response: Any, content: bytes) -> dict[str, Any]:
    assert 400 <= response.status_code < 500, (response.status_code, content[:500])
    body: dict[str, Any] = json.loads(content)
    assert isinstance(body["error"]["message"], str)
    assert body["error"]["message"]
    assert body["detail"] == body["error"]["message"]
    assert body["code"] == body["error"]["code"]
    return body


@fuzz(25)
@given(request=chat_requests())
def test_a_valid_request_is_answered_and_its_trace_stored(client, gateway, request):
    with rolled_back():
        response, content, new = _post(client, json.dumps(request).encode())

        if response.status_code == 400:
            assert _refused_clearly(response, content)["code"] == "guardrail_blocked"
        else:
            assert response.status_code == 200, content[:500]
            if request.get("stream"):
                assert content.rstrip().endswith(b"data: [DONE]"), content[-200:]
            else:
                assert json.loads(content)["choices"][0]["message"]["role"] == "assistant"
        _stored(new)
        assert Trajectory.objects.filter(trace_id=response["X-Keel-Trace-Id"]).exists()


ODD = st.one_of(
    JSON,
    st.sampled_from(
        ["", "agent/nobody", "agent/", -1, 0, 3, 2**63, 1e308, [], {}, {"role": "wizard"}, [{"type": 1}], "x" * 5000]
    ),
)


def _sent_and_checked(client: Any, body: bytes) -> None:
    before = row_counts()
    response, content, new = _post(client, body)
    if response.status_code == 200:
        _stored(new)
        return
    refusal = _refused_clearly(response, content)
    if refusal["code"] in UNREAD:
        assert row_counts() == before
    else:
        _stored(new)


@fuzz(50)
@given(request=chat_requests(), edits=st.lists(st.tuples(st.integers(0, 10**6), ODD), min_size=1, max_size=3))
def test_a_mutated_request_is_answered_or_refused_clearly(client, gateway, request, edits):
    for choice, value in edits:
        candidates = json_paths(request)
        request = json_replace(request, candidates[choice % len(candidates)], value)

    with rolled_back():
        _sent_and_checked(client, json.dumps(request).encode())


@fuzz(30)
@given(body=st.one_of(st.binary(max_size=200), JSON.map(lambda value: json.dumps(value).encode())))
def test_any_body_is_refused_clearly_and_writes_nothing(client, gateway, body):
    with rolled_back():
        _sent_and_checked(client, body)
