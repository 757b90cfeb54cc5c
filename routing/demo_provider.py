"""Keel's demo model: a FAKE litellm provider, `keel-demo/<name>`, so that the demo workspace's gateway
works on a machine with no model server and no network. It is not a model: it answers from templates,
looks up and refunds the trip a request names when it is offered the ride-support tools (once each),
passes on the answer of a tool that answers in prose (another agent), and, as a judge, scores an answer by
how much of the request it addresses. It serves only targets whose model string starts with `keel-demo/`, and
only while KEEL_DEMO_PROVIDER is on (the default outside production). Point the demo's targets at a real
OpenAI-compatible server (dashboard, API or KEEL_MODEL_TARGETS) to see real answers.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Sequence
from typing import Any

PROVIDER = "keel-demo"
_registered = False


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def _last(messages: Sequence[Any], role: str) -> str:
    for message in reversed(messages):
        if message.get("role") == role:
            return _text(message.get("content"))
    return ""


def _words(text: str) -> set[str]:
    return {word for word in re.findall(r"[a-z0-9$]+", text.lower()) if len(word) > 2}


def _judge(messages: Sequence[Any]) -> str:
    prompt = _last(messages, "user")
    request, _, answer = prompt.partition("\n\nAnswer:\n")
    request_words = _words(request.removeprefix("Request:\n"))
    overlap = len(request_words & _words(answer)) / max(1, len(request_words))
    length = min(1.0, len(answer) / 160)
    score = round(10 * (0.6 * overlap + 0.4 * length))
    return json.dumps({"reasoning": f"covers {overlap:.0%} of the request's terms", "score": score})


def _coverage(target: str, answer: str) -> float:
    """How much of the target's terms the answer addresses, with a little credit for a full answer."""
    words = _words(target)
    overlap = len(words & _words(answer)) / max(1, len(words))
    return 0.7 * overlap + 0.3 * min(1.0, len(answer) / 160)


def _section(text: str, tag: str) -> str:
    match = re.search(rf"<{tag}[^>]*>\n?(.*?)\n?</{tag}>", text, re.DOTALL)
    return match.group(1) if match else ""


def _eval_judge(messages: Sequence[Any]) -> str:
    """Keel's eval judges (evals/judges.py): a rubric verdict on the scale asked for, or relative scores for
    a group of candidates; scored by how much of the task (and the reference) an answer covers."""
    prompt = _last(messages, "user")
    task = _section(prompt, "task") + " " + _section(prompt, "reference")
    candidates = re.findall(r'<candidate id="([^"]+)">\n?(.*?)\n?</candidate>', prompt, re.DOTALL)
    if candidates:
        scores = [
            {"id": id_, "score": round(_coverage(task, text), 2), "explanation": "covers the task's terms"}
            for id_, text in candidates
        ]
        return json.dumps({"reasoning": "ranked by how much of the task each candidate addresses", "scores": scores})
    value = _coverage(task, _section(prompt, "response"))
    if "Score 1 if" in prompt:
        score = int(value >= 0.5)
    elif "Score from 1" in prompt:
        score = 1 + round(4 * value)
    else:
        score = round(10 * value)
    return json.dumps({"reasoning": f"the response covers {value:.0%} of what the task asks", "score": score})


def _first(messages: Sequence[Any], role: str) -> str:
    return next((_text(m.get("content")) for m in messages if m.get("role") == role), "")


def _parsed(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _answer(model: str, messages: Sequence[Any]) -> str:
    request = _first(messages, "user")
    tool_results = [_text(m.get("content")) for m in messages if m.get("role") == "tool"]
    system = _text(messages[0].get("content")) if messages and messages[0].get("role") == "system" else ""
    if "output schema" in system.lower() or "classify" in system.lower():
        intent = "billing" if re.search(r"charge|refund|fee|fare", request, re.I) else "general"
        return json.dumps({"intent": intent, "summary": request[:80]})
    last = _parsed(tool_results[-1]) if tool_results else None
    if tool_results and "eligibility" in system.lower():
        cited = f"{last['section']}: {last['text']}" if isinstance(last, dict) and "text" in last else tool_results[-1]
        return (
            f"Eligible only where the charge is confirmed as an error ({cited[:160]}): check each trip's fare "
            "against its quote before refunding."
        )
    if tool_results and not isinstance(last, (dict, list)):
        # A tool that answers in prose is another agent: pass its answer on.
        return f"I had your request checked by a specialist: {tool_results[-1][:300]}"
    if tool_results:
        return f"I checked your trip ({tool_results[-1][:120]}) and took care of it: {request[:80]}"
    if "escalate at once" in system and re.search(r"unsafe|safety|assault|red light", request, re.I):
        return "I'm sorry. I'm handing this to our safety team now; a person will call you shortly."
    digest = int(hashlib.sha256(f"{model}{request}".encode()).hexdigest()[:4], 16)
    if model.endswith("fast") and digest % 3 == 0:
        return "Thanks for reaching out! Could you tell me more?"
    return f"About '{request[:120]}': here is what I found, and what happens next."


def _tool_call(messages: Sequence[Any], tools: Sequence[Any]) -> dict[str, Any] | None:
    """Look up, then refund, the trip the last user message names (T4417 or T-48213), once each, when offered
    the tools; a request that names no trip gets an answer."""
    trip = re.search(r"\bT-?\d+\b", _last(messages, "user"))
    if trip is None:
        return None
    names = [str((tool.get("function") or {}).get("name")) for tool in tools or ()]
    done = {
        (call.get("function") or {}).get("name")
        for message in messages
        for call in message.get("tool_calls") or ()
        if isinstance(call, dict)
    }
    for name in ("lookup_trip", "issue_refund"):
        if name in names and name not in done:
            arguments: dict[str, Any] = {"trip_id": trip.group(0)}
            if name == "issue_refund":
                arguments["amount"] = 12.5
            return {"name": name, "arguments": json.dumps(arguments)}
    return None


def register() -> None:
    """Register the fake provider with litellm (once per process)."""
    global _registered
    if _registered:
        return
    import litellm
    from litellm.llms.custom_llm import CustomLLM
    from litellm.types.utils import (
        ChatCompletionMessageToolCall,
        Choices,
        Function,
        GenericStreamingChunk,
        Message,
        ModelResponse,
        Usage,
    )

    class DemoLLM(CustomLLM):
        def completion(self, model: str, messages: list[Any], *args: Any, **kwargs: Any) -> ModelResponse:
            params = kwargs.get("optional_params") or {}
            system = _text(messages[0].get("content")) if messages else ""
            judging = "grade an AI assistant" in system or "impartial evaluator" in system
            call = None if judging else _tool_call(messages, params.get("tools") or ())
            content = None
            if call is None and "impartial evaluator" in system:
                content = _eval_judge(messages)
            elif call is None:
                content = _judge(messages) if judging else _answer(model, messages)
            calls = (
                [ChatCompletionMessageToolCall(id=f"call-{len(messages)}", type="function", function=Function(**call))]
                if call
                else None
            )
            prompt_tokens = sum(len(_text(m.get("content")).split()) for m in messages) + 20
            completion_tokens = len((content or "").split()) + 5
            return ModelResponse(
                model=model,
                choices=[
                    Choices(
                        index=0,
                        finish_reason="tool_calls" if calls else "stop",
                        message=Message(role="assistant", content=content, tool_calls=calls),
                    )
                ],
                usage=Usage(
                    prompt_tokens=prompt_tokens,
                    completion_tokens=completion_tokens,
                    total_tokens=prompt_tokens + completion_tokens,
                ),
            )

        def streaming(
            self, model: str, messages: list[Any], *args: Any, **kwargs: Any
        ) -> Iterator[GenericStreamingChunk]:
            text = _answer(model, messages)
            for index, word in enumerate(text.split(" ")):
                yield GenericStreamingChunk(
                    text=word if index == 0 else f" {word}",
                    tool_use=None,
                    is_finished=False,
                    finish_reason="",
                    usage=None,
                    index=0,
                )
            yield GenericStreamingChunk(
                text="", tool_use=None, is_finished=True, finish_reason="stop", usage=None, index=0
            )

    litellm.custom_provider_map = [*litellm.custom_provider_map, {"provider": PROVIDER, "custom_handler": DemoLLM()}]
    _registered = True
