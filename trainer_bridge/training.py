"""Training a LoRA adapter on an export: group-relative policy gradient on recorded trajectories, SFT or DPO.

This module runs on the GPU worker, which has torch, transformers and peft but no Django; it imports neither.

The export formats (see trainer_bridge/formats/ for the writers; the readers here are lenient):
- "grpo": ART trajectory groups, one JSON object per line: `{"trajectories": [{"messages_and_choices", "tools",
  "reward", ...}], "metadata": {"split": "train" | "validation", ...}}`. An entry of `messages_and_choices` is an
  OpenAI message or an OpenAI Choice (`{"finish_reason", "index", "message"}`); assistant turns are trained, every
  other turn is context.
- "sft": TRL conversational rows `{"messages", "tools"?}`; assistant turns are trained.
- "dpo": TRL conversational preference rows `{"prompt", "chosen", "rejected"}` (or the implicit form, whole
  `chosen` and `rejected` conversations sharing a prefix).
An SFT or DPO row with `"split": "validation"` (top level or in `metadata`) is held out, as is an ART group whose
metadata says so.

Group-relative policy gradient (as OpenPipe ART does it on recorded trajectories): in each group the advantage of a
trajectory is `(r − mean) / (std + ε)` with the population std; a group whose rewards are all equal teaches nothing
and is skipped, as is a trajectory whose advantage is exactly zero. The loss of a step is
`−mean_i(A_i × mean log-prob of trajectory i's assistant tokens) + kl_coef × KL(policy ‖ base)`, where the base is
the same model with the adapter disabled and the KL is the k3 estimator on the same tokens. The trajectories were
recorded, not sampled from the policy, so there is no importance ratio: each step is one on-policy-style update.

DPO is implemented here directly (the sigmoid loss, the reference being the model with its adapter disabled)
rather than through TRL's DPOTrainer: one loop for three methods, the same tokenisation and loss masks, and no
`datasets` round trip.

Metrics, one dict per step (all floats): `loss`, `kl`, `learning_rate`, and by method
- grpo: `reward_mean`, `reward_std` (the recorded rewards of the step's trajectories), `advantage_mean`,
  `advantage_std`, `advantage_min`, `advantage_max`, `groups`, `trajectories`, `zero_advantage_groups_skipped`
  (groups of the export's training split left out because their rewards are all equal) and `policy_reward`: each
  group's recorded rewards weighted by the policy's preference among its completions (a softmax over their mean
  token log-probs), averaged over the step's groups. Recorded rewards cannot change as the policy trains;
  `policy_reward` is the training reward that moves, the series to set against `validation_score`.
- sft: `tokens`; dpo: `reward_accuracy`, `reward_margin`, `chosen_reward`, `rejected_reward`.
`validation_score` (higher is better) is reported before the first step, every `validation_every` steps and after
the last. Without a `validation` callable it is computed on the held-out split, when there is one:
- grpo: `policy_reward` on the held-out groups (with `validation_pairwise_accuracy`: of the pairs of completions
  with different rewards in a group, the share where the policy prefers the higher-rewarded one), and beside it
  `train_policy_reward`, the same measure on a fixed sample of up to `TRAIN_SCORE_GROUPS` training groups: the
  training reward to set against the validation score (a step's `policy_reward` is of that step's batch only);
- sft: the mean per-token likelihood of the held-out assistant tokens, `exp(−NLL)`;
- dpo: the mean `sigmoid(β × margin)` on the held-out pairs (0.5 before training).
"""

from __future__ import annotations

import json
import logging
import math
import random
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from trainer_bridge.training_config import TrainingConfig

logger = logging.getLogger(__name__)

# grpo: how many training groups (a fixed, seeded sample) `train_policy_reward` is measured on at each validation.
TRAIN_SCORE_GROUPS = 32
VALIDATION_SPLITS = frozenset({"validation", "val", "valid", "eval", "test"})

Message = dict[str, Any]
Metrics = dict[str, float]
T = TypeVar("T")


class ExportError(ValueError):
    """The export cannot be trained on (unreadable line, nothing trainable)."""


# --- advantages -------------------------------------------------------------------------------------------------


def group_advantages(rewards: Sequence[float], eps: float = 1e-6) -> list[float]:
    """`(r − mean) / (std + eps)` with the population std; all zeros when every reward is equal."""
    if not rewards:
        return []
    if max(rewards) == min(rewards):
        # Exactly zero, not (r − mean)/eps on rounding noise: the group is skipped.
        return [0.0] * len(rewards)
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
    return [(r - mean) / (std + eps) for r in rewards]


def advantage_stats(advantages: Sequence[float]) -> Metrics:
    """`advantage_mean`, `advantage_std` (population), `advantage_min`, `advantage_max`; zeros when empty."""
    if not advantages:
        return {"advantage_mean": 0.0, "advantage_std": 0.0, "advantage_min": 0.0, "advantage_max": 0.0}
    mean = sum(advantages) / len(advantages)
    return {
        "advantage_mean": mean,
        "advantage_std": math.sqrt(sum((a - mean) ** 2 for a in advantages) / len(advantages)),
        "advantage_min": min(advantages),
        "advantage_max": max(advantages),
    }


# --- reading exports --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Conversation:
    """Messages to tokenise; assistant turns at index `train_from` or later are trained."""

    messages: list[Message]
    tools: list[Any] | None = None
    train_from: int = 0


@dataclass(frozen=True)
class TrajectoryGroup:
    conversations: list[Conversation]
    rewards: list[float]
    split: str = "train"


@dataclass(frozen=True)
class PreferencePair:
    chosen: Conversation
    rejected: Conversation
    split: str = "train"


def message_normalize(entry: Mapping[str, Any]) -> Message:
    """An OpenAI message or Choice as a plain chat message: role, content text, tool calls, tool call id, name."""
    message: Mapping[str, Any] = entry
    if isinstance(entry.get("message"), Mapping) and ("finish_reason" in entry or "role" not in entry):
        message = entry["message"]  # a Choice: the sampled assistant turn
    role = str(message.get("role") or "assistant")
    normalized: Message = {"role": role, "content": _content_text(message.get("content"))}
    tool_calls = [_tool_call_normalize(call) for call in message.get("tool_calls") or [] if isinstance(call, Mapping)]
    if tool_calls:
        normalized["tool_calls"] = tool_calls
    for key in ("tool_call_id", "name"):
        if message.get(key):
            normalized[key] = str(message[key])
    return normalized


def _content_text(content: object) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(
            str(part.get("text", "")) if isinstance(part, Mapping) else str(part)
            for part in content
            if not isinstance(part, Mapping) or part.get("type", "text") in ("text", "input_text", "output_text")
        )
    return json.dumps(content)


def _tool_call_normalize(call: Mapping[str, Any]) -> Message:
    function = call.get("function") if isinstance(call.get("function"), Mapping) else call
    assert isinstance(function, Mapping)
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        # Chat templates expect a dict (TRL's convention); OpenAI records a JSON string.
        try:
            parsed = json.loads(arguments)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            arguments = parsed
    normalized: Message = {
        "type": "function",
        "function": {"name": str(function.get("name", "")), "arguments": arguments},
    }
    if call.get("id"):
        normalized["id"] = str(call["id"])
    return normalized


def _tools(value: object) -> list[Any] | None:
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else None
    return list(value) if isinstance(value, list) and value else None


def _split(row: Mapping[str, Any]) -> str:
    metadata = row.get("metadata") if isinstance(row.get("metadata"), Mapping) else {}
    assert isinstance(metadata, Mapping)
    split = str(row.get("split") or metadata.get("split") or "train").lower()
    return "validation" if split in VALIDATION_SPLITS else "train"


def _jsonl_rows(path: Path) -> Iterator[Mapping[str, Any]]:
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as error:
                raise ExportError(f"{path.name} line {number}: not JSON ({error})") from error
            if not isinstance(row, Mapping):
                raise ExportError(f"{path.name} line {number}: not a JSON object")
            yield row


def art_groups_read(path: Path) -> list[TrajectoryGroup]:
    """ART trajectory groups; a trajectory without a numeric reward or without messages is left out."""
    groups = []
    for row in _jsonl_rows(path):
        conversations, rewards = [], []
        for trajectory in row.get("trajectories") or []:
            reward = trajectory.get("reward") if isinstance(trajectory, Mapping) else None
            entries = trajectory.get("messages_and_choices") if isinstance(trajectory, Mapping) else None
            if isinstance(reward, bool) or not isinstance(reward, int | float) or not entries:
                continue
            messages = [message_normalize(entry) for entry in entries if isinstance(entry, Mapping)]
            conversations.append(Conversation(messages=messages, tools=_tools(trajectory.get("tools"))))
            rewards.append(float(reward))
        if conversations:
            groups.append(TrajectoryGroup(conversations=conversations, rewards=rewards, split=_split(row)))
    return groups


def sft_rows_read(path: Path) -> list[tuple[Conversation, str]]:
    rows = []
    for row in _jsonl_rows(path):
        messages = [message_normalize(m) for m in row.get("messages") or [] if isinstance(m, Mapping)]
        if any(m["role"] == "assistant" for m in messages):
            rows.append((Conversation(messages=messages, tools=_tools(row.get("tools"))), _split(row)))
    return rows


def _as_messages(value: object, role: str) -> list[Message]:
    if isinstance(value, str):  # TRL's standard (non-conversational) form
        return [{"role": role, "content": value}]
    return [message_normalize(m) for m in value or [] if isinstance(m, Mapping)]  # type: ignore[attr-defined]


def dpo_pairs_read(path: Path) -> list[PreferencePair]:
    pairs = []
    for row in _jsonl_rows(path):
        prompt = _as_messages(row.get("prompt"), "user")
        chosen = _as_messages(row.get("chosen"), "assistant")
        rejected = _as_messages(row.get("rejected"), "assistant")
        if not prompt:
            # Implicit prompt: the longest common prefix of the two conversations.
            shared = 0
            while shared < min(len(chosen), len(rejected)) and chosen[shared] == rejected[shared]:
                shared += 1
            prompt, chosen, rejected = chosen[:shared], chosen[shared:], rejected[shared:]
        if not chosen or not rejected:
            continue
        tools = _tools(row.get("tools"))
        pairs.append(
            PreferencePair(
                chosen=Conversation(messages=prompt + chosen, tools=tools, train_from=len(prompt)),
                rejected=Conversation(messages=prompt + rejected, tools=tools, train_from=len(prompt)),
                split=_split(row),
            )
        )
    return pairs


# --- tokenisation -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenizedConversation:
    input_ids: list[int]
    loss_mask: list[int]  # 1 on the trained assistant tokens


def _render(tokenizer: Any, messages: list[Message], tools: list[Any] | None, *, generation_prompt: bool) -> str:
    if not messages and not generation_prompt:
        return ""
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=generation_prompt)
    return str(text)


def conversation_tokenize(
    tokenizer: Any, conversation: Conversation, *, max_length: int | None = None
) -> TokenizedConversation:
    """Token ids of the conversation rendered with the chat template, and a mask over its trained assistant turns.

    Each trained turn's characters are found by rendering the conversation up to it (with the generation prompt)
    and up to its end: the difference is the turn, its end-of-turn marker included. The whole text is then
    tokenised once and a token is trained when its characters overlap a turn. A template that rewrites earlier
    turns (some drop past reasoning) breaks the prefix property; such a turn is left untrained, with a warning.
    """
    messages = conversation.messages
    trained = [i for i, m in enumerate(messages) if m["role"] == "assistant" and i >= conversation.train_from]
    if trained:
        messages = messages[: trained[-1] + 1]  # nothing after the last trained turn is learnt from
    full = _render(tokenizer, messages, conversation.tools, generation_prompt=False)
    spans = []
    for index in trained:
        before = _render(tokenizer, messages[:index], conversation.tools, generation_prompt=True)
        after = _render(tokenizer, messages[: index + 1], conversation.tools, generation_prompt=False)
        if after.startswith(before) and full.startswith(after) and len(after) > len(before):
            spans.append((len(before), len(after)))
        else:
            logger.warning("training.turn_not_prefix", extra={"turn": index})
    if getattr(tokenizer, "is_fast", False):
        encoded = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
        input_ids = list(encoded["input_ids"])
        mask = [
            int(any(start < end and token_start < end and token_end > start for start, end in spans))
            for token_start, token_end in encoded["offset_mapping"]
        ]
    else:
        input_ids, mask, cursor = [], [], 0
        for start, end in [*spans, (len(full), len(full))]:
            for piece, trained_piece in ((full[cursor:start], 0), (full[start:end], 1)):
                if piece:
                    ids = tokenizer(piece, add_special_tokens=False)["input_ids"]
                    input_ids += ids
                    mask += [trained_piece] * len(ids)
            cursor = end
    if max_length is not None:
        input_ids, mask = input_ids[:max_length], mask[:max_length]
    return TokenizedConversation(input_ids=input_ids, loss_mask=mask)


# --- the model --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainingResult:
    adapter_dir: Path | None  # None when training was stopped
    steps_done: int
    final_metrics: Metrics
    stopped: bool = False


@dataclass
class _Batch:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor  # aligned with the predicted tokens, input_ids[:, 1:]


def _collate(items: Sequence[TokenizedConversation], pad_id: int, device: torch.device) -> _Batch:
    length = max(len(item.input_ids) for item in items)
    ids = torch.full((len(items), length), pad_id, dtype=torch.long)
    attention = torch.zeros((len(items), length), dtype=torch.long)
    mask = torch.zeros((len(items), length), dtype=torch.float32)
    for row, item in enumerate(items):
        ids[row, : len(item.input_ids)] = torch.tensor(item.input_ids)
        attention[row, : len(item.input_ids)] = 1
        mask[row, : len(item.loss_mask)] = torch.tensor(item.loss_mask, dtype=torch.float32)
    return _Batch(ids.to(device), attention.to(device), mask[:, 1:].to(device))


def _token_logps(model: Any, batch: _Batch) -> torch.Tensor:
    """Log-probability of each next token, shape [batch, length − 1]."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1].float()
    targets = batch.input_ids[:, 1:]
    logps: torch.Tensor = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    return logps


def _base_token_logps(model: PeftModel, batch: _Batch) -> torch.Tensor:
    with torch.no_grad(), model.disable_adapter():
        return _token_logps(model, batch)


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per sequence."""
    return (values * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)


def _kl_tokens(policy: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(policy ‖ base) per token: unbiased, always ≥ 0."""
    log_ratio = base - policy
    return torch.exp(log_ratio) - log_ratio - 1


def _chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class _Sampler(Generic[T]):
    """Batches drawn without replacement; reshuffled (seeded) every pass over the pool."""

    def __init__(self, pool: Sequence[T], seed: int) -> None:
        self.pool = list(pool)
        self.random = random.Random(seed)  # noqa: S311 - batch order, not secrets
        self.order: list[int] = []

    def batch(self, size: int) -> list[T]:
        picked: list[T] = []
        while len(picked) < min(size, len(self.pool)):
            if not self.order:
                self.order = list(range(len(self.pool)))
                self.random.shuffle(self.order)
            picked.append(self.pool[self.order.pop()])
        return picked


@contextmanager
def _evaluating(model: Any) -> Iterator[None]:
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train()


@dataclass
class _Run:
    config: TrainingConfig
    model: PeftModel
    tokenizer: Any
    device: torch.device
    pad_id: int

    def tokenize(self, conversation: Conversation) -> TokenizedConversation:
        return conversation_tokenize(self.tokenizer, conversation, max_length=self.config.max_length)

    def sequence_logps(self, items: Sequence[TokenizedConversation], *, mean: bool) -> torch.Tensor:
        """Policy log-probability of each item's trained tokens (mean or sum), without gradients."""
        values = []
        for chunk in _chunks(items, self.config.micro_batch_size):
            batch = _collate(chunk, self.pad_id, self.device)
            logps = _token_logps(self.model, batch)
            values.append(_masked_mean(logps, batch.loss_mask) if mean else (logps * batch.loss_mask).sum(dim=1))
        return torch.cat(values)


@dataclass(frozen=True)
class _TokenizedGroup:
    items: list[TokenizedConversation]
    rewards: list[float]
    advantages: list[float]


def _policy_reward(group_logps: torch.Tensor, rewards: Sequence[float]) -> tuple[float, float]:
    """The group's rewards weighted by softmax(policy mean log-probs); and the pairwise preference accuracy."""
    weights = torch.softmax(group_logps.float(), dim=0).tolist()
    weighted = sum(w * r for w, r in zip(weights, rewards, strict=True))
    logps = group_logps.tolist()
    right = total = 0.0
    for i in range(len(rewards)):
        for j in range(i + 1, len(rewards)):
            if rewards[i] == rewards[j]:
                continue
            total += 1
            high, low = (i, j) if rewards[i] > rewards[j] else (j, i)
            right += 1.0 if logps[high] > logps[low] else 0.5 if logps[high] == logps[low] else 0.0
    return weighted, (right / total if total else 0.5)


class _GroupRelative:
    def __init__(self, run: _Run, groups: list[TrajectoryGroup]) -> None:
        self.run = run
        train: list[_TokenizedGroup] = []
        self.validation: list[_TokenizedGroup] = []
        skipped = 0
        for group in groups:
            advantages = group_advantages(group.rewards)
            if not any(advantages):
                skipped += group.split == "train"
                continue
            tokenized = _TokenizedGroup([run.tokenize(c) for c in group.conversations], group.rewards, advantages)
            (train if group.split == "train" else self.validation).append(tokenized)
        if not train:
            raise ExportError(f"no training group has rewards that differ ({skipped} groups skipped)")
        self.skipped = skipped
        self.sampler = _Sampler(train, run.config.seed)
        sample = random.Random(run.config.seed).sample(range(len(train)), min(len(train), TRAIN_SCORE_GROUPS))  # noqa: S311
        self.train_sample = [train[index] for index in sorted(sample)]

    def step(self) -> Metrics:
        run, config = self.run, self.run.config
        groups = self.sampler.batch(config.batch_size)
        # ART leaves out trajectories whose advantage is exactly zero: they add nothing to the gradient.
        entries = [
            (group_index, item, advantage, reward)
            for group_index, group in enumerate(groups)
            for item, advantage, reward in zip(group.items, group.advantages, group.rewards, strict=True)
            if advantage != 0 and any(item.loss_mask)
        ]
        total_loss = total_kl = 0.0
        group_logps: dict[int, list[tuple[float, float]]] = {}
        for chunk in _chunks(entries, config.micro_batch_size):
            batch = _collate([item for _, item, _, _ in chunk], run.pad_id, run.device)
            advantages = torch.tensor([a for _, _, a, _ in chunk], device=run.device)
            policy = _token_logps(run.model, batch)
            base = _base_token_logps(run.model, batch)
            sequence_logps = _masked_mean(policy, batch.loss_mask)
            kl = _masked_mean(_kl_tokens(policy, base), batch.loss_mask)
            loss = (-(advantages * sequence_logps) + config.kl_coef * kl).sum() / len(entries)
            loss.backward()  # type: ignore[no-untyped-call]
            total_loss += loss.item()
            total_kl += kl.sum().item()
            for (group_index, _, _, reward), value in zip(chunk, sequence_logps.tolist(), strict=True):
                group_logps.setdefault(group_index, []).append((value, reward))
        rewards = [r for group in groups for r in group.rewards]
        policy_rewards = [
            _policy_reward(torch.tensor([v for v, _ in values]), [r for _, r in values])[0]
            for values in group_logps.values()
        ]
        mean_reward = sum(rewards) / len(rewards)
        return {
            "loss": total_loss,
            "kl": total_kl / max(len(entries), 1),
            "reward_mean": mean_reward,
            "reward_std": math.sqrt(sum((r - mean_reward) ** 2 for r in rewards) / len(rewards)),
            **advantage_stats([a for _, _, a, _ in entries]),
            "policy_reward": sum(policy_rewards) / max(len(policy_rewards), 1),
            "groups": float(len(groups)),
            "trajectories": float(len(entries)),
            "zero_advantage_groups_skipped": float(self.skipped),
        }

    def _policy_scores(self, groups: Sequence[_TokenizedGroup]) -> tuple[float, float] | None:
        """Mean `policy_reward` and pairwise accuracy over the groups (those with rewards that differ)."""
        scores, accuracies = [], []
        for group in groups:
            kept = [(item, r) for item, r in zip(group.items, group.rewards, strict=True) if any(item.loss_mask)]
            if len({r for _, r in kept}) < 2:
                continue
            logps = self.run.sequence_logps([item for item, _ in kept], mean=True)
            score, accuracy = _policy_reward(logps, [r for _, r in kept])
            scores.append(score)
            accuracies.append(accuracy)
        if not scores:
            return None
        return sum(scores) / len(scores), sum(accuracies) / len(accuracies)

    def validate(self) -> Metrics | None:
        held_out = self._policy_scores(self.validation) if self.validation else None
        if held_out is None:
            return None
        # The same measure on a fixed sample of the training groups, so that the two series compare: a step's
        # `policy_reward` is of that step's batch alone, and moves with the batch as much as with the policy.
        trained = self._policy_scores(self.train_sample)
        return {
            "validation_score": held_out[0],
            "validation_pairwise_accuracy": held_out[1],
            **({"train_policy_reward": trained[0]} if trained is not None else {}),
        }


class _Supervised:
    def __init__(self, run: _Run, rows: list[tuple[Conversation, str]]) -> None:
        self.run = run
        tokenized = [(run.tokenize(c), split) for c, split in rows]
        train = [item for item, split in tokenized if split == "train" and any(item.loss_mask)]
        self.validation = [item for item, split in tokenized if split != "train" and any(item.loss_mask)]
        if not train:
            raise ExportError("no training conversation has an assistant turn")
        self.sampler = _Sampler(train, run.config.seed)

    def step(self) -> Metrics:
        run, config = self.run, self.run.config
        items = self.sampler.batch(config.batch_size)
        tokens = sum(sum(item.loss_mask[1:]) for item in items)
        total_loss = total_kl = 0.0
        for chunk in _chunks(items, config.micro_batch_size):
            batch = _collate(chunk, run.pad_id, run.device)
            policy = _token_logps(run.model, batch)
            loss = -(policy * batch.loss_mask).sum() / max(tokens, 1)
            loss.backward()  # type: ignore[no-untyped-call]
            total_loss += loss.item()
            base = _base_token_logps(run.model, batch)
            total_kl += (_kl_tokens(policy.detach(), base) * batch.loss_mask).sum().item()
        return {"loss": total_loss, "kl": total_kl / max(tokens, 1), "tokens": float(tokens)}

    def validate(self) -> Metrics | None:
        if not self.validation:
            return None
        total = tokens = 0.0
        for chunk in _chunks(self.validation, self.run.config.micro_batch_size):
            batch = _collate(chunk, self.run.pad_id, self.run.device)
            total += (_token_logps(self.run.model, batch) * batch.loss_mask).sum().item()
            tokens += batch.loss_mask.sum().item()
        return {"validation_score": math.exp(total / max(tokens, 1)), "validation_loss": -total / max(tokens, 1)}


class _Preference:
    def __init__(self, run: _Run, pairs: list[PreferencePair]) -> None:
        self.run = run
        tokenized = [((run.tokenize(p.chosen), run.tokenize(p.rejected)), p.split) for p in pairs]
        usable = [(pair, split) for pair, split in tokenized if any(pair[0].loss_mask) and any(pair[1].loss_mask)]
        train = [pair for pair, split in usable if split == "train"]
        self.validation = [pair for pair, split in usable if split != "train"]
        if not train:
            raise ExportError("no training pair has both a chosen and a rejected assistant turn")
        self.sampler = _Sampler(train, run.config.seed)

    def _margins(self, pairs: Sequence[tuple[TokenizedConversation, TokenizedConversation]]) -> Iterator[Any]:
        """Per micro-batch: (chosen − reference, rejected − reference) summed log-probs, and the chosen KL."""
        run = self.run
        for chunk in _chunks(pairs, max(run.config.micro_batch_size // 2, 1)):
            batch = _collate([c for c, _ in chunk] + [r for _, r in chunk], run.pad_id, run.device)
            policy = _token_logps(run.model, batch)
            reference = _base_token_logps(run.model, batch)
            log_ratios = ((policy - reference) * batch.loss_mask).sum(dim=1)
            kl = _masked_mean(
                _kl_tokens(policy[: len(chunk)].detach(), reference[: len(chunk)]), batch.loss_mask[: len(chunk)]
            )
            yield log_ratios[: len(chunk)], log_ratios[len(chunk) :], kl

    def step(self) -> Metrics:
        run, beta = self.run, self.run.config.dpo_beta
        pairs = self.sampler.batch(run.config.batch_size)
        total_loss = total_kl = 0.0
        chosen_rewards: list[float] = []
        rejected_rewards: list[float] = []
        for chosen, rejected, kl in self._margins(pairs):
            loss = -torch.nn.functional.logsigmoid(beta * (chosen - rejected)).sum() / len(pairs)
            loss.backward()  # type: ignore[no-untyped-call]
            total_loss += loss.item()
            total_kl += kl.sum().item()
            chosen_rewards += (beta * chosen.detach()).tolist()
            rejected_rewards += (beta * rejected.detach()).tolist()
        margins = [c - r for c, r in zip(chosen_rewards, rejected_rewards, strict=True)]
        return {
            "loss": total_loss,
            "kl": total_kl / len(pairs),
            "reward_accuracy": sum(m > 0 for m in margins) / len(margins),
            "reward_margin": sum(margins) / len(margins),
            "chosen_reward": sum(chosen_rewards) / len(chosen_rewards),
            "rejected_reward": sum(rejected_rewards) / len(rejected_rewards),
        }

    def validate(self) -> Metrics | None:
        if not self.validation:
            return None
        probabilities = []
        for chosen, rejected, _ in self._margins(self.validation):
            probabilities += torch.sigmoid(self.run.config.dpo_beta * (chosen - rejected)).tolist()
        return {"validation_score": sum(probabilities) / len(probabilities)}


# --- train ------------------------------------------------------------------------------------------------------


def train(
    config: TrainingConfig,
    *,
    base_model_dir: str | Path,
    export_path: str | Path,
    output_dir: str | Path,
    on_metrics: Callable[[dict[str, float]], None] | None = None,
    validation: Callable[[Any, Any], float] | None = None,
    should_stop: Callable[[], bool] | None = None,
    validation_path: str | Path | None = None,
) -> TrainingResult:
    """Train a LoRA adapter on `export_path` and save it (with the tokenizer) in `output_dir`.

    `on_metrics` receives `{"step": n, **metrics}` after each step (and `{"step": 0, "validation_score": ...}`
    before the first). `validation(model, tokenizer) -> float` replaces the default validation (see the module
    docstring). `validation_path` adds held-out rows in the export's format. `should_stop` is asked before each
    step; when it says yes, training ends without saving and the result says `stopped`.
    """
    torch.manual_seed(config.seed)
    random.seed(config.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
    tokenizer = AutoTokenizer.from_pretrained(base_model_dir)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    base: Any = AutoModelForCausalLM.from_pretrained(base_model_dir, dtype=dtype)
    base.to(device)
    target_modules = config.lora_target_modules
    lora = LoraConfig(
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=target_modules if isinstance(target_modules, str) else list(target_modules),
        task_type="CAUSAL_LM",
    )
    with warnings.catch_warnings():
        # peft 0.21 asks transformers 5 `is_gradient_checkpointing`, deprecated there; nothing for us to change.
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        model = get_peft_model(base, lora)
    model.train()
    run = _Run(config=config, model=model, tokenizer=tokenizer, device=device, pad_id=int(tokenizer.pad_token_id))

    export = Path(export_path)
    method: _GroupRelative | _Supervised | _Preference
    if config.method == "grpo":
        groups = art_groups_read(export)
        if validation_path is not None:
            groups += [
                TrajectoryGroup(g.conversations, g.rewards, "validation")
                for g in art_groups_read(Path(validation_path))
            ]
        method = _GroupRelative(run, groups)
    elif config.method == "sft":
        rows = sft_rows_read(export)
        if validation_path is not None:
            rows += [(c, "validation") for c, _ in sft_rows_read(Path(validation_path))]
        method = _Supervised(run, rows)
    else:
        pairs = dpo_pairs_read(export)
        if validation_path is not None:
            pairs += [PreferencePair(p.chosen, p.rejected, "validation") for p in dpo_pairs_read(Path(validation_path))]
        method = _Preference(run, pairs)

    def validate() -> Metrics | None:
        with _evaluating(model):
            if validation is not None:
                return {"validation_score": float(validation(model, tokenizer))}
            return method.validate()

    def report(step: int, metrics: Metrics) -> None:
        if on_metrics is not None:
            on_metrics({"step": step, **metrics})

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.learning_rate)
    last: Metrics = {}
    initial = validate()
    if initial is not None:
        report(0, initial)
        last.update(initial)
    steps_done = 0
    for step in range(1, config.steps + 1):
        if should_stop is not None and should_stop():
            logger.info("training.stopped", extra={"step": steps_done})
            return TrainingResult(adapter_dir=None, steps_done=steps_done, final_metrics=last, stopped=True)
        optimizer.zero_grad(set_to_none=True)
        metrics = method.step()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        optimizer.step()
        steps_done = step
        metrics["learning_rate"] = config.learning_rate
        if step == config.steps or (config.validation_every and step % config.validation_every == 0):
            validated = validate()
            if validated is not None:
                metrics.update(validated)
        report(step, metrics)
        last.update(metrics)

    adapter_dir = Path(output_dir)
    adapter_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(adapter_dir))
    tokenizer.save_pretrained(adapter_dir)
    return TrainingResult(adapter_dir=adapter_dir, steps_done=steps_done, final_metrics=last)
