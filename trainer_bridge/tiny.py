"""A tiny causal language model built from a config, for tests and demos: nothing is downloaded.

`tiny_model_dir` trains a byte-level BPE tokenizer on the given corpus, gives it a small chat template (roles,
tool definitions, tool calls and tool results), builds a two-layer Llama with seeded random weights and saves
both, so `AutoModelForCausalLM.from_pretrained(dir)` and `AutoTokenizer.from_pretrained(dir)` load them offline.
The model knows nothing; it is only big enough for a loss to fall.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

BOS = "<|bos|>"
PAD = "<|pad|>"
TURN_START = "<|im_start|>"
TURN_END = "<|im_end|>"
SPECIAL_TOKENS = [PAD, BOS, TURN_START, TURN_END]
INITIALIZER_RANGE = 0.1

# ChatML-like. Tool-call arguments may be a JSON string (OpenAI) or a dict (TRL); both render as JSON text.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and tools %}"
    "<|im_start|>system{{ '\\n' }}tools: {{ tools | tojson }}<|im_end|>{{ '\\n' }}"
    "{% endif %}"
    "<|im_start|>{{ message['role'] }}"
    "{% if message['role'] == 'tool' and message.get('tool_call_id') %} {{ message['tool_call_id'] }}{% endif %}"
    "{{ '\\n' }}"
    "{% if message.get('content') %}{{ message['content'] }}{% endif %}"
    "{% for call in message.get('tool_calls') or [] %}"
    "{% set function = call['function'] if call.get('function') else call %}"
    "<tool_call>{{ function['name'] }} "
    "{% if function['arguments'] is string %}{{ function['arguments'] }}"
    "{% else %}{{ function['arguments'] | tojson }}{% endif %}</tool_call>"
    "{% endfor %}<|im_end|>{{ '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant{{ '\\n' }}{% endif %}"
)


def tiny_model_dir(
    path: str | Path,
    *,
    vocab_corpus: Iterable[str],
    vocab_size: int = 512,
    hidden_size: int = 64,
    num_layers: int = 2,
    seed: int = 0,
) -> Path:
    """Build and save a tiny Llama and its tokenizer in `path`; return the directory."""
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        # Every byte is in the vocabulary, so any text tokenizes, however little of it was in the corpus.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [*vocab_corpus, "system user assistant tool <tool_call></tool_call> tools: {}[]\"':,"]
    backend.train_from_iterator(corpus, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend,
        bos_token=BOS,
        eos_token=TURN_END,
        pad_token=PAD,
        chat_template=CHAT_TEMPLATE,
        model_max_length=2048,
    )
    tokenizer.save_pretrained(directory)

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        # Wider than the usual 0.02: with a frozen random head, tiny logits would leave LoRA nothing to sharpen.
        initializer_range=INITIALIZER_RANGE,
    )
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = LlamaForCausalLM(config)
    finally:
        # Building a model must not move the caller's random stream.
        torch.random.set_rng_state(generator_state)
    model.save_pretrained(directory)
    return directory


# --- toy exports: a pattern a tiny model can learn in a few dozen steps -------------------------------------------

TOY_FACTS = [
    ("sky", "blue"),
    ("grass", "green"),
    ("sun", "yellow"),
    ("snow", "white"),
    ("coal", "black"),
    ("blood", "red"),
    ("sea", "blue"),
    ("leaf", "green"),
    ("rose", "red"),
    ("cloud", "grey"),
    ("lemon", "yellow"),
    ("plum", "purple"),
]
TOY_TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


def _toy_question(thing: str) -> list[dict[str, object]]:
    return [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": f"What colour is the {thing}?"},
    ]


def _toy_lookup(thing: str, colour: str) -> list[dict[str, object]]:
    call = {
        "id": "call-1",
        "type": "function",
        "function": {"name": "lookup", "arguments": json.dumps({"thing": thing})},
    }
    return [
        {
            "finish_reason": "tool_calls",
            "index": 0,
            "message": {"role": "assistant", "content": None, "tool_calls": [call]},
        },
        {"role": "tool", "tool_call_id": "call-1", "content": colour},
    ]


def toy_art_group(thing: str, colour: str, *, split: str = "train") -> dict[str, object]:
    """One ART group: the high-reward completions look the colour up and say it; the low-reward ones guess."""

    def trajectory(messages_and_choices: list[dict[str, object]], reward: float) -> dict[str, object]:
        return {
            "messages_and_choices": messages_and_choices,
            "tools": TOY_TOOLS,
            "reward": reward,
            "metrics": {},
            "metadata": {"trace_id": f"trace-{thing}-{reward}", "task_id": thing},
            "logs": [],
        }

    answer: dict[str, object] = {"role": "assistant", "content": f"Checked: it is {colour}."}
    return {
        "trajectories": [
            trajectory(
                [
                    *_toy_question(thing),
                    *_toy_lookup(thing, colour),
                    {
                        "finish_reason": "stop",
                        "index": 0,
                        "message": {**answer, "content": f"Checked: the {thing} is {colour}."},
                    },
                ],
                1.0,
            ),
            trajectory([*_toy_question(thing), *_toy_lookup(thing, colour), answer], 0.8),
            trajectory(
                [
                    *_toy_question(thing),
                    {
                        "finish_reason": "stop",
                        "index": 0,
                        "message": {"role": "assistant", "content": "Maybe orange, no idea."},
                    },
                ],
                0.0,
            ),
            trajectory(
                [*_toy_question(thing), {"role": "assistant", "content": "Perhaps pink or so, hard to say."}], 0.1
            ),
        ],
        "metadata": {"task_id": thing, "split": split},
    }


def toy_art_export(path: str | Path) -> Path:
    """Eight training groups, one whose rewards are all equal (skipped), four validation groups."""
    groups = [toy_art_group(thing, colour) for thing, colour in TOY_FACTS[:8]]
    flat = toy_art_group("moon", "white")
    for trajectory in flat["trajectories"]:  # type: ignore[attr-defined]
        trajectory["reward"] = 0.5
    groups.append(flat)
    groups += [toy_art_group(thing, colour, split="validation") for thing, colour in TOY_FACTS[8:]]
    return _jsonl_write(path, groups)


def toy_sft_export(path: str | Path) -> Path:
    """Eight training conversations (look the colour up, then say it) and four held out."""
    rows = [_toy_sft_row(thing, colour) for thing, colour in TOY_FACTS[:8]]
    rows += [{**_toy_sft_row(thing, colour), "split": "validation"} for thing, colour in TOY_FACTS[8:]]
    return _jsonl_write(path, rows)


def toy_dpo_export(path: str | Path) -> Path:
    rows: list[dict[str, object]] = [
        {
            "prompt": _toy_question(thing),
            "chosen": [{"role": "assistant", "content": f"Checked: the {thing} is {colour}."}],
            "rejected": [{"role": "assistant", "content": "Maybe orange, no idea."}],
            **({"split": "validation"} if index >= 8 else {}),
        }
        for index, (thing, colour) in enumerate(TOY_FACTS)
    ]
    return _jsonl_write(path, rows)


def toy_corpus() -> list[str]:
    """Text for the tokenizer: the toy exports' words."""
    return [json.dumps(toy_art_group(thing, colour)) for thing, colour in TOY_FACTS] + ["moon white"]


def _toy_sft_row(thing: str, colour: str) -> dict[str, object]:
    return {
        "messages": [
            *_toy_question(thing),
            {"role": "assistant", "content": None, "tool_calls": [_lookup_call(thing)]},
            {"role": "tool", "tool_call_id": "call-1", "content": colour},
            {"role": "assistant", "content": f"Checked: the {thing} is {colour}."},
        ],
        "tools": TOY_TOOLS,
    }


def _lookup_call(thing: str) -> dict[str, object]:
    return {"id": "call-1", "type": "function", "function": {"name": "lookup", "arguments": {"thing": thing}}}


def _jsonl_write(path: str | Path, rows: list[dict[str, object]]) -> Path:
    destination = Path(path)
    destination.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return destination
