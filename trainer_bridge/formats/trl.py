"""Hugging Face TRL datasets, conversational: SFT, DPO and KTO rows, one JSON line each.

Pure module, no Django. The rows are TRL's documented conversational types (`docs/source/dataset_formats.md`):

    SFT  {"messages": [...], "tools": "<JSON list>", "split": "train"}
    DPO  {"prompt": [...], "chosen": [...], "rejected": [...], "tools": "<JSON list>", "split": "train"}
    KTO  {"prompt": [...], "completion": [...], "label": true, "tools": "<JSON list>", "split": "train"}

`split` is the group's ("train" or "validation", from the curation's `validation_share`): one file holds both,
and a row of a held-out task must not be trained on. Keel's worker holds "validation" rows out; with TRL,
`dataset.filter(lambda row: row["split"] == "train")` (the trainers drop the extra column when they tokenise).

Messages are TRL's shape: assistant tool calls {"id", "type": "function", "function": {"name", "arguments":
{...}}} with the arguments decoded to an object (chat templates render them; OpenAI's JSON string would be
rendered as a quoted string), tool results {"role": "tool", "name", "tool_call_id", "content"}, and an
assistant turn's missing content as "" (templates test `content is string`). `tools` is the JSON text of the
tool definitions: every TRL trainer that takes tools (`SFTTrainer`, `DPOTrainer`, `KTOTrainer`) json-decodes a
string column, and a string survives Arrow's schema inference, which would otherwise merge different tools'
parameter schemas into one struct with nulls.

Images: a row whose messages carry OpenAI image parts ({"type": "image_url", "image_url": {"url": ...}}) is a
TRL vision-language row (`dataset_formats.md`, "Vision datasets"): every message's content becomes a list of
{"type": "text", "text": ...} and {"type": "image"} parts, in their recorded order, and the row gets an
`images` column, one entry per placeholder in order, which TRL's collators hand to the processor
(`prepare_multimodal_messages`, then `processor(images=...)`). The file stays one JSONL file, so an entry is a
string that transformers' `load_image` (which the processors call through `fetch_images`) opens:
- a data: URL is decoded and checked (its bytes must be a PNG, JPEG, GIF or WebP image) and written back as a
  base64 data: URL of the type its bytes show (undecodable, or not an image: the part is left out);
- an http(s) URL is kept as it is and not downloaded (Keel reaches no network to export); the manifest says
  how many, since loading the rows fetches them;
- any other image part (another scheme, an image in a tool result, whose placeholder TRL does not fill, or in a
  DPO/KTO completion, where TRL takes images in the prompt only) is left out and counted.
A row without images keeps string contents and has no `images` column, as before; loading a file of both kinds
with `datasets` gives the text rows `images: None`.

Which rows (`threshold` is the reward that counts as good):
- SFT: each rollout rewarded at or above the threshold, and each corrected rollout with its final answer
  replaced by the correction (see `base.sft_examples`).
- DPO: per group, each correction against the answer it corrected, and per prompt of the group the best rollout
  against the worst (see `base.group_pairs`); a group with equal rewards and no correction gives none, and
  rollouts of different prompts are never paired (the manifest counts those left unpaired for it).
- KTO: each rewarded rollout, prompt = its messages before the first assistant turn, completion = the rest,
  label = reward >= threshold; a corrected rollout also gives its corrected final answer labelled true
  (and its original answer is then labelled false, whatever its reward).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import IO, Any, Final

from trainer_bridge.formats.base import (
    DEFAULT_REWARD_THRESHOLD,
    Counts,
    Tally,
    first_assistant_index,
    group_pairs,
    last_assistant_index,
    require,
    sft_examples,
    tool_call_arguments,
    tool_names_by_call_id,
    write_line,
)
from trainer_bridge.groups import Group, Preview, Rollout, image_part_url, prompt_pairing

EXTENSION = "jsonl"

# An image's type by its first bytes: what a data: URL declares is not trusted.
_IMAGE_SIGNATURES: Final = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


def _image_type(data: bytes) -> str | None:
    for signature, media_type in _IMAGE_SIGNATURES:
        if data.startswith(signature):
            return media_type
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def image_from_data_url(url: str) -> str | None:
    """The image a base64 data: URL carries, decoded and checked, as a data: URL of the type its bytes show;
    None when the URL is not base64 or its bytes are not a PNG, JPEG, GIF or WebP image."""
    header, separator, payload = url.partition(",")
    header = header.strip().lower()
    if not separator or not header.startswith("data:") or not header.endswith(";base64"):
        return None
    # Standard or URL-safe alphabet, padding optional: what agents put in data: URLs.
    text = "".join(payload.split()).translate(str.maketrans("-_", "+/"))
    try:
        data = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None
    media_type = _image_type(data)
    if media_type is None:
        return None
    return f"data:{media_type};base64,{base64.b64encode(data).decode('ascii')}"


class RowImages:
    """The `images` column of one row, one entry per {"type": "image"} placeholder in order, and the tally of
    what became of each image part (see the module docstring)."""

    def __init__(self, tally: Tally | None = None) -> None:
        self.images: list[str] = []
        self._tally = tally if tally is not None else Tally()

    def placeholder(self, url: str, *, kept: bool) -> dict[str, str] | None:
        """The placeholder of an image part, its image added to the column; None when the part is left out."""
        image: str | None = None
        if kept and url.startswith("data:"):
            image = image_from_data_url(url)
            self._tally.images += image is not None
        elif kept and url.lower().startswith(("http://", "https://")):
            image = url
            self._tally.image_urls += 1
        if image is None:
            self._tally.images_dropped += 1
            return None
        self.images.append(image)
        return {"type": "image"}

    def contents(self, *conversations: list[dict[str, Any]]) -> None:
        """Settle the row's contents: without an image, each content list becomes its text (text parts joined by
        newlines), as a text-only row has always been."""
        if self.images:
            return
        for messages in conversations:
            for message in messages:
                message["content"] = "\n".join(part["text"] for part in message["content"] if part["type"] == "text")


def _content_parts(message: Mapping[str, Any], images: RowImages | None, *, images_kept: bool) -> list[dict[str, str]]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    parts: list[dict[str, str]] = []
    for part in content if isinstance(content, list) else ():
        url = image_part_url(part)
        if url is not None:
            placeholder = images.placeholder(url, kept=images_kept) if images is not None else None
            if placeholder is not None:
                parts.append(placeholder)
        elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
    return parts


def trl_messages(
    messages: Sequence[Mapping[str, Any]],
    names: Mapping[str, str] | None = None,
    *,
    images: RowImages | None = None,
    completion: bool = False,
) -> list[dict[str, Any]]:
    """Messages in TRL's conversational shape (see the module docstring), each content a list of parts until
    `images.contents` settles the row. `names` maps tool call ids to tool names, for a completion whose tool
    results answer calls made in its prompt. Image parts go to `images`; without it they are left out and the
    contents are text, settled here. A `completion` keeps no image."""
    names = {**(names or {}), **tool_names_by_call_id(messages)}
    converted: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        # TRL fills the placeholders of every message but tool results, and of a prompt only (DPO, KTO).
        content = _content_parts(message, images, images_kept=not completion and role != "tool")
        if role == "assistant":
            row: dict[str, Any] = {"role": "assistant", "content": content}
            calls = [
                {
                    "id": str(call.get("id") or ""),
                    "type": "function",
                    "function": {
                        "name": str((call.get("function") or {}).get("name", "")),
                        "arguments": tool_call_arguments(call),
                    },
                }
                for call in message.get("tool_calls") or ()
            ]
            if calls:
                row["tool_calls"] = calls
            converted.append(row)
        elif role == "tool":
            call_id = str(message.get("tool_call_id") or "")
            converted.append(
                {
                    "role": "tool",
                    "name": str(message.get("name") or names.get(call_id, "")),
                    "tool_call_id": call_id,
                    "content": content,
                }
            )
        else:
            converted.append({"role": str(role), "content": content})
    if images is None:
        RowImages().contents(converted)
    return converted


def _with_images(row: dict[str, Any], images: RowImages) -> dict[str, Any]:
    if images.images:
        row["images"] = images.images
    return row


def tools_text(rollout: Rollout) -> str:
    return json.dumps([dict(tool) for tool in rollout.tools], ensure_ascii=False, sort_keys=True)


# --- SFT ------------------------------------------------------------------------------------------------


def sft_check(preview: Preview, *, threshold: float = DEFAULT_REWARD_THRESHOLD) -> None:
    best = preview.rewards.max
    require(
        preview.corrections > 0 or (best is not None and best >= threshold),
        f"SFT needs a rollout rewarded at least {threshold} or a corrected one; the best reward is {best}",
    )


def sft_write(groups: Iterable[Group], out: IO[bytes], *, threshold: float = DEFAULT_REWARD_THRESHOLD) -> Counts:
    tally = Tally()
    for group in groups:
        used = 0
        for rollout in group.rollouts:
            examples = sft_examples(rollout, threshold)
            for messages in examples:
                images = RowImages(tally)
                converted = trl_messages(messages, images=images)
                images.contents(converted)
                row = {"messages": converted, "tools": tools_text(rollout), "split": group.split}
                write_line(out, _with_images(row, images), tally)
            used += bool(examples)
        tally.rollouts += used
        tally.skipped += len(group.rollouts) - used
        tally.groups += used > 0
    return tally.counts()


# --- DPO ------------------------------------------------------------------------------------------------


def dpo_check(preview: Preview, *, threshold: float = DEFAULT_REWARD_THRESHOLD) -> None:
    require(
        preview.pairable_groups > 0,
        "DPO needs pairs: a group with two different rewards or a corrected answer, and there is none",
    )


def dpo_write(groups: Iterable[Group], out: IO[bytes], *, threshold: float = DEFAULT_REWARD_THRESHOLD) -> Counts:
    tally = Tally()
    for group in groups:
        pairs = group_pairs(group)
        tools = tools_text(group.rollouts[0]) if group.rollouts else "[]"
        used = 0
        for pair in pairs:
            names = tool_names_by_call_id(pair.prompt)
            images = RowImages(tally)
            prompt = trl_messages(pair.prompt, images=images)
            chosen = trl_messages(pair.chosen, names, images=images, completion=True)
            rejected = trl_messages(pair.rejected, names, images=images, completion=True)
            images.contents(prompt, chosen, rejected)
            row = {
                "prompt": prompt,
                "chosen": chosen,
                "rejected": rejected,
                "tools": tools,
                "split": group.split,
            }
            write_line(out, _with_images(row, images), tally)
            used += pair.rollouts
        used = min(used, len(group.rollouts))
        tally.rollouts += used
        tally.skipped += len(group.rollouts) - used
        tally.groups += bool(pairs)
        tally.unpaired_by_prompt += prompt_pairing(group.rollouts)[1]
    return tally.counts()


# --- KTO ------------------------------------------------------------------------------------------------


def kto_check(preview: Preview, *, threshold: float = DEFAULT_REWARD_THRESHOLD) -> None:
    require(
        preview.rewarded > 0 or preview.corrections > 0,
        "KTO labels rollouts by their reward or a correction, and no rollout has either",
    )


def _kto_rows(
    rollout: Rollout, threshold: float
) -> list[tuple[Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]], bool]]:
    rows: list[tuple[Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]], bool]] = []
    last = last_assistant_index(rollout.messages)
    if rollout.correction and last is not None:
        prompt = rollout.messages[:last]
        rows.append((prompt, [{"role": "assistant", "content": rollout.correction}], True))
        rows.append((prompt, [rollout.messages[last]], False))
    elif rollout.reward is not None:
        start = first_assistant_index(rollout.messages)
        if rollout.messages[start:]:
            rows.append((rollout.messages[:start], rollout.messages[start:], rollout.reward >= threshold))
    return [row for row in rows if row[0] and row[0][-1].get("role") in ("user", "tool")]


def kto_write(groups: Iterable[Group], out: IO[bytes], *, threshold: float = DEFAULT_REWARD_THRESHOLD) -> Counts:
    tally = Tally()
    for group in groups:
        used = 0
        for rollout in group.rollouts:
            rows = _kto_rows(rollout, threshold)
            for prompt, completion, label in rows:
                names = tool_names_by_call_id(prompt)
                images = RowImages(tally)
                prompt_messages = trl_messages(prompt, images=images)
                completion_messages = trl_messages(completion, names, images=images, completion=True)
                images.contents(prompt_messages, completion_messages)
                row = {
                    "prompt": prompt_messages,
                    "completion": completion_messages,
                    "label": label,
                    "tools": tools_text(rollout),
                    "split": group.split,
                }
                write_line(out, _with_images(row, images), tally)
            used += bool(rows)
        tally.rollouts += used
        tally.skipped += len(group.rollouts) - used
        tally.groups += used > 0
    return tally.counts()
