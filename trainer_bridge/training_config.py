"""A training job's settings (`TrainingConfig`), checked where the job is made and again on the worker.

Pure Python: Keel's web process validates a job's config with it without importing torch (trainer_bridge/training.py,
which trains, needs torch, transformers and peft).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields

METHODS = ("grpo", "sft", "dpo")


class TrainingConfigError(ValueError):
    """A training config field is missing, of the wrong type or out of range; `field` names it."""

    def __init__(self, field_name: str, message: str) -> None:
        self.field = field_name
        super().__init__(f"{field_name}: {message}")


@dataclass(frozen=True)
class TrainingConfig:
    """What a training job asks for. Built from the job's JSON with `from_dict`, which rejects unknown keys."""

    method: str
    steps: int = 100
    learning_rate: float = 1e-5
    batch_size: int = 4  # groups (grpo), examples (sft) or pairs (dpo) per step
    micro_batch_size: int = 8  # sequences per forward pass; gradients accumulate over a step's micro-batches
    lora_r: int = 8
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    lora_target_modules: str | tuple[str, ...] = "all-linear"
    kl_coef: float = 0.0  # grpo: weight of KL(policy ‖ base) in the loss; ART's default beta is 0 too
    dpo_beta: float = 0.1
    max_grad_norm: float = 1.0
    max_length: int = 2048  # tokens per sequence; longer ones are cut at the end
    seed: int = 0
    validation_every: int = 10  # 0: validate only before the first and after the last step

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise TrainingConfigError("method", f"must be one of {', '.join(METHODS)}, not {self.method!r}")
        for name, minimum in (
            ("steps", 1),
            ("batch_size", 1),
            ("micro_batch_size", 1),
            ("lora_r", 1),
            ("lora_alpha", 1),
            ("max_length", 8),
            ("validation_every", 0),
            ("seed", None),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TrainingConfigError(name, f"must be an integer, not {value!r}")
            if minimum is not None and value < minimum:
                raise TrainingConfigError(name, f"must be at least {minimum}, not {value}")
        for name, positive in (
            ("learning_rate", True),
            ("dpo_beta", True),
            ("max_grad_norm", True),
            ("kl_coef", False),
            ("lora_dropout", False),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise TrainingConfigError(name, f"must be a number, not {value!r}")
            if value < 0 or (positive and value == 0):
                raise TrainingConfigError(name, f"must be {'positive' if positive else 'at least 0'}, not {value}")
        if self.lora_dropout >= 1:
            raise TrainingConfigError("lora_dropout", f"must be below 1, not {self.lora_dropout}")
        modules = self.lora_target_modules
        if isinstance(modules, str):
            if not modules:
                raise TrainingConfigError("lora_target_modules", "must not be empty")
        elif not modules or not all(isinstance(m, str) and m for m in modules):
            raise TrainingConfigError("lora_target_modules", "must be 'all-linear' or a list of module names")

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> TrainingConfig:
        known = {f.name for f in fields(cls)}
        for key in data:
            if key not in known:
                raise TrainingConfigError(str(key), "is not a training config field")
        if "method" not in data:
            raise TrainingConfigError("method", "is required")
        values = dict(data)
        modules = values.get("lora_target_modules")
        if isinstance(modules, list):
            values["lora_target_modules"] = tuple(modules)
        integral_floats = ("learning_rate", "lora_dropout", "kl_coef", "dpo_beta", "max_grad_norm")
        for name in integral_floats:
            # JSON writes 16.0 as 16; an integer is a fine float.
            if type(values.get(name)) is int:
                values[name] = float(values[name])  # type: ignore[arg-type]
        return cls(**values)  # type: ignore[arg-type]
