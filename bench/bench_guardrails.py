"""Guardrail checks (issue 6 §5): detection, false positives and latency of the offline checks.

    python -m bench --only guardrails        # appended to bench/RESULTS.md
    python -m bench.bench_guardrails [--quick]   # prints only

Reads the labelled sets in `guardrails/datasets/` (see its README) and runs each built-in check on
its set in this process, one item at a time, wall time per item from `CheckResult.latency_ms`:
- `prompt_injection` on direct_injection (user messages), `indirect_injection` on documents and tool
  results, `system_prompt_leakage` on model outputs (with the item's system prompt and canary),
  `pii` on user messages (recall per entity kind; a benign item with any finding is a false positive);
- per split (dev: looked at while writing the cues; heldout: not) and per source;
- the input layer as the gateway runs it (`prompt_injection`, `pii`, `secrets`, `toxicity`, `topic`
  through `run_checks`) on 2,000-character messages assembled from the sets, and the tool layer
  (`indirect_injection`, `pii`, `secrets`) on 2,000-character documents: total p50/p99 per message;
- scaling: each check on 100 kB and 1 MB, to show the time is linear.
No database, no network, no model.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench.harness import Report, percentile
from guardrails.checks import BUILTIN_CHECKS, DEFAULT_CHECKS, CheckContext, Layer, run_checks
from guardrails.datasets import dataset_load
from guardrails.pii import STRUCTURED_KINDS

TARGETS = {
    "prompt_injection": (0.90, 0.02),
    "indirect_injection": (0.80, 0.02),
    "system_prompt_leakage": (0.95, 0.01),
}
PII_RECALL_TARGET = 0.95
INPUT_P99_TARGET_MS = 20.0
MESSAGE_CHARS = 2_000


@dataclass
class Tally:
    positives: int = 0
    negatives: int = 0
    true_positives: int = 0
    false_positives: int = 0

    def add(self, label: bool, fired: bool) -> None:
        if label:
            self.positives += 1
            self.true_positives += fired
        else:
            self.negatives += 1
            self.false_positives += fired

    @property
    def recall(self) -> float | None:
        return self.true_positives / self.positives if self.positives else None

    @property
    def false_positive_rate(self) -> float | None:
        return self.false_positives / self.negatives if self.negatives else None

    @property
    def precision(self) -> float | None:
        fired = self.true_positives + self.false_positives
        return self.true_positives / fired if fired else None


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


def _context(check: str, item: dict[str, Any]) -> CheckContext:
    if check == "system_prompt_leakage":
        return CheckContext(Layer.OUTPUT, source="model", system_prompt=item["system_prompt"], canary=item["canary"])
    if check == "indirect_injection":
        return CheckContext(Layer.TOOL, source=item["source"])
    return CheckContext(Layer.INPUT, source=item["source"])


def _classifier_rows(
    check_name: str, set_name: str, repeat: int
) -> tuple[list[list[object]], dict[str, Tally], list[str]]:
    check = BUILTIN_CHECKS[check_name]
    items = dataset_load(set_name)
    groups: dict[str, Tally] = {}
    latencies: dict[str, list[float]] = {}
    misses: list[str] = []
    for item in items:
        context = _context(check_name, item)
        result = check.check(item["text"], context)
        timings = [result.latency_ms] + [check.check(item["text"], context).latency_ms for _ in range(repeat - 1)]
        for key in ("all", f"split={item['split']}", f"source={item['source']}"):
            groups.setdefault(key, Tally()).add(item["label"], result.triggered)
            latencies.setdefault(key, []).extend(timings)
        if item["split"] == "heldout" and item["label"] != result.triggered:
            kind = "missed" if item["label"] else "false positive"
            misses.append(f"{kind} ({item['category']}): {item['text'][:110]!r}")
    rows: list[list[object]] = []
    for key, tally in groups.items():
        rows.append(
            [
                check_name,
                key,
                tally.positives,
                tally.negatives,
                _pct(tally.recall),
                _pct(tally.false_positive_rate),
                _pct(tally.precision),
                f"{percentile(latencies[key], 0.5):.2f}",
                f"{percentile(latencies[key], 0.99):.2f}",
            ]
        )
    return rows, groups, misses


def _pii_rows(repeat: int) -> tuple[list[list[object]], dict[str, dict[str, float]], Tally]:
    check = BUILTIN_CHECKS["pii"]
    items = dataset_load("pii")
    found: dict[tuple[str, str], int] = {}
    total: dict[tuple[str, str], int] = {}
    benign = Tally()
    benign_heldout = Tally()
    latencies: list[float] = []
    for item in items:
        context = CheckContext(Layer.INPUT, source=item["source"])
        result = check.check(item["text"], context)
        latencies += [result.latency_ms] + [check.check(item["text"], context).latency_ms for _ in range(repeat - 1)]
        if not item["label"]:
            benign.add(False, result.triggered)
            if item["split"] == "heldout":
                benign_heldout.add(False, result.triggered)
            continue
        for entity in item["entities"]:
            hit = any(
                finding.kind == entity["kind"]
                and finding.text.replace(" ", "") in entity["text"].replace(" ", "")
                and len(finding.text) >= 0.8 * len(entity["text"])
                for finding in result.findings
            )
            for split in ("all", item["split"]):
                key = (entity["kind"], split)
                total[key] = total.get(key, 0) + 1
                found[key] = found.get(key, 0) + hit
    recall: dict[str, dict[str, float]] = {}
    rows: list[list[object]] = []
    for kind in sorted({kind for kind, _ in total}):
        recall[kind] = {
            split: found.get((kind, split), 0) / total[(kind, split)]
            for split in ("all", "heldout")
            if (kind, split) in total
        }
        rows.append(
            [
                kind,
                "structured" if kind in STRUCTURED_KINDS else "cue-based",
                total[(kind, "all")],
                _pct(recall[kind].get("all")),
                _pct(recall[kind].get("heldout")),
            ]
        )
    rows.append(
        [
            "(benign items with any finding)",
            "",
            benign.negatives,
            _pct(benign.false_positive_rate),
            _pct(benign_heldout.false_positive_rate),
        ]
    )
    rows.append(
        [
            "(latency per item, ms p50 / p99)",
            "",
            len(latencies),
            f"{percentile(latencies, 0.5):.2f}",
            f"{percentile(latencies, 0.99):.2f}",
        ]
    )
    return rows, recall, benign


def _messages(texts: Sequence[str], count: int, rng: random.Random) -> list[str]:
    messages = []
    for _ in range(count):
        parts: list[str] = []
        length = 0
        while length < MESSAGE_CHARS:
            text = rng.choice(texts)
            parts.append(text)
            length += len(text) + 1
        messages.append(" ".join(parts)[:MESSAGE_CHARS])
    return messages


def _layer_latency(
    layer: Layer, messages: Sequence[str], context: CheckContext
) -> tuple[float, float, dict[str, float]]:
    names = DEFAULT_CHECKS[layer]
    totals: list[float] = []
    per_check: dict[str, list[float]] = {name: [] for name in names}
    for message in messages[:20]:  # warm-up: regex caches, first-call costs
        run_checks(message, context, names)
    for message in messages:
        started = time.perf_counter()
        results = run_checks(message, context, names)
        totals.append((time.perf_counter() - started) * 1000)
        for result in results:
            per_check[result.check].append(result.latency_ms)
    return (
        percentile(totals, 0.5),
        percentile(totals, 0.99),
        {name: percentile(values, 0.99) for name, values in per_check.items()},
    )


def _scaling_rows() -> list[list[object]]:
    rng = random.Random(7)  # noqa: S311 - reproducible filler text
    words = [w for item in dataset_load("indirect_injection") for w in item["text"].split()]
    base = " ".join(rng.choice(words) for _ in range(200_000))
    context = CheckContext(
        Layer.INPUT, system_prompt=" ".join(words[:300]), canary="kc-0123456789abcdef0123", allowed_topics=("order",)
    )
    rows: list[list[object]] = []
    for name, check in BUILTIN_CHECKS.items():
        times = []
        for size in (100_000, 1_000_000):
            content = base[:size]
            started = time.perf_counter()
            check.check(content, context)
            times.append((time.perf_counter() - started) * 1000)
        rows.append([name, f"{times[0]:.1f}", f"{times[1]:.1f}", f"{times[1] / times[0]:.1f}×"])
    return rows


def _verdict(met: bool) -> str:
    return "**met**" if met else "**not met**"


def run(report: Report, *, quick: bool) -> None:
    repeat = 1 if quick else 3
    report.line(
        "Offline built-in checks (no model, no network) on Keel's own labelled sets (`guardrails/datasets/`, "
        "generated by `guardrails/datasets/build.py` plus handwritten items). `heldout` items were not looked at "
        "while writing the cues; `dev` items were. Latency is wall time per item in this process "
        f"(best-effort: the machine is shared); each item timed {repeat}×."
    )
    report.line()
    header = [
        "check",
        "group",
        "attacks",
        "benign",
        "detection (recall)",
        "false positives",
        "precision",
        "p50 ms",
        "p99 ms",
    ]
    summary: dict[str, dict[str, Tally]] = {}
    all_misses: list[str] = []
    for check_name, set_name in (
        ("prompt_injection", "direct_injection"),
        ("indirect_injection", "indirect_injection"),
        ("system_prompt_leakage", "leakage"),
    ):
        rows, groups, misses = _classifier_rows(check_name, set_name, repeat)
        summary[check_name] = groups
        all_misses += [f"{check_name}: {miss}" for miss in misses]
        report.line(f"**{check_name}** on `{set_name}.jsonl`")
        report.line()
        report.table(header, rows)

    pii_rows, pii_recall, _ = _pii_rows(repeat)
    report.line("**pii** on `pii.jsonl`: recall per entity kind (a finding of the right kind covering the value)")
    report.line()
    report.table(["kind", "type", "entities", "recall (all)", "recall (heldout)"], pii_rows)

    rng = random.Random(2025)  # noqa: S311 - reproducible message mix
    count = 150 if quick else 1_000
    user_texts = [item["text"] for name in ("direct_injection", "pii") for item in dataset_load(name)]
    doc_texts = [item["text"] for item in dataset_load("indirect_injection")]
    input_context = CheckContext(Layer.INPUT, allowed_topics=("order", "refund", "invoice"))
    input_p50, input_p99, input_checks = _layer_latency(Layer.INPUT, _messages(user_texts, count, rng), input_context)
    tool_p50, tool_p99, tool_checks = _layer_latency(
        Layer.TOOL, _messages(doc_texts, count, rng), CheckContext(Layer.TOOL, source="document")
    )
    report.line(
        f"**Layer totals** on {count} messages of {MESSAGE_CHARS:,} characters (all of the layer's default checks th"
        "rough `run_checks`)"
    )
    report.line()
    report.table(
        ["layer", "checks", "total p50 ms", "total p99 ms", "p99 per check ms"],
        [
            [
                "input",
                ", ".join(DEFAULT_CHECKS[Layer.INPUT]),
                f"{input_p50:.2f}",
                f"{input_p99:.2f}",
                ", ".join(f"{k} {v:.2f}" for k, v in input_checks.items()),
            ],
            [
                "tool",
                ", ".join(DEFAULT_CHECKS[Layer.TOOL]),
                f"{tool_p50:.2f}",
                f"{tool_p99:.2f}",
                ", ".join(f"{k} {v:.2f}" for k, v in tool_checks.items()),
            ],
        ],
    )
    if not quick:
        report.line(
            "**Scaling**: one call per check on 100 kB and 1 MB of document text (linear means about 10×; the "
            "classifying checks read at most 64 kB, `interface.SCAN_HEAD` + `SCAN_TAIL`, so they stay flat)"
        )
        report.line()
        report.table(["check", "100 kB ms", "1 MB ms", "ratio"], _scaling_rows())

    rows = []
    for check_name, (recall_target, fpr_target) in TARGETS.items():
        for split in ("all", "split=heldout"):
            tally = summary[check_name][split]
            met = (tally.recall or 0) >= recall_target and (tally.false_positive_rate or 0) <= fpr_target
            rows.append(
                [
                    check_name,
                    split,
                    f"≥ {recall_target:.0%} at ≤ {fpr_target:.0%} FP",
                    f"{_pct(tally.recall)} at {_pct(tally.false_positive_rate)} FP",
                    _verdict(met),
                ]
            )
    structured = {kind: values for kind, values in pii_recall.items() if kind in STRUCTURED_KINDS}
    for split in ("all", "heldout"):
        worst_kind = min(structured, key=lambda kind: structured[kind].get(split, 1.0))
        worst = structured[worst_kind].get(split, 1.0)
        rows.append(
            [
                "pii (structured kinds)",
                split,
                f"recall ≥ {PII_RECALL_TARGET:.0%} per kind",
                f"lowest {worst:.1%} ({worst_kind})",
                _verdict(worst >= PII_RECALL_TARGET),
            ]
        )
    rows.append(
        [
            "input layer",
            f"{MESSAGE_CHARS:,}-char messages",
            f"p99 ≤ {INPUT_P99_TARGET_MS:.0f} ms",
            f"{input_p99:.2f} ms",
            _verdict(input_p99 <= INPUT_P99_TARGET_MS),
        ]
    )
    report.line("**Issue 6 targets**")
    report.line()
    report.table(["target", "set", "wanted", "measured", "verdict"], rows)
    if all_misses:
        report.line("Held-out errors (what the cues do not cover):")
        report.line()
        report.code("\n".join(all_misses[:30]))
    report.line(
        "Caveats: the sets and the detectors share an author, so even held-out figures are optimistic for attacks "
        "written by someone else; PII names and addresses are cue-based and miss any phrasing without a cue; leakage "
        "by paraphrase or translation is not caught. A model-based check (an LLM judge or a guard model through "
        "litellm, `guardrails.model_checks`) adds what patterns cannot: intent behind novel or paraphrased attacks, "
        "translated or summarised leaks, names without cues and context-dependent toxicity, at the cost of tens to "
        "hundreds of milliseconds and a provider call per check; the offline checks remain the fast first layer."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    arguments = parser.parse_args()
    run(Report("bench_guardrails"), quick=arguments.quick)


if __name__ == "__main__":
    main()
