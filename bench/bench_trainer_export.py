"""Trainer export: wall time and peak memory of writing 100,000 trajectories of 20 steps to ART's format.

The trajectories are synthetic and made lazily, group by group (8 rollouts per task): a system prompt, a
user request, then 20 steps of an assistant tool call and its tool result, then a final answer; rewards,
signals and metrics vary by a seeded generator. Each export runs in a child process of its own, which
reports its own peak resident set size (`ru_maxrss`), next to that of a child that imports the same
modules and writes nothing (the interpreter's baseline). Target (issue: trainer bridge): ART export of
100,000 trajectories in at most 60 s and 500 MB. The other formats are timed on a fifth of that.

    python -m bench.bench_trainer_export [--trajectories 100000] [--others 20000] [--quick]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.harness import BASE_DIR, Report

STEPS = 20
PER_GROUP = 8
TRAJECTORIES = 100_000
QUICK_TRAJECTORIES = 10_000
TARGET_SECONDS = 60.0
TARGET_MB = 500.0
TOOLS = ("order_lookup", "refund_create", "shipment_track", "customer_get", "invoice_list")
WORDS = ("order", "refund", "parcel", "invoice", "customer", "address", "status", "delivery", "credit", "return")
SIGNALS = ("execution.loops.retry", "interaction.misalignment.correction", "execution.failure.invalid_args")


class Pseudo:
    """A seeded 64-bit LCG: the same trajectories on every run."""

    def __init__(self, seed: int) -> None:
        self.state = seed

    def next(self) -> int:
        self.state = (self.state * 6364136223846793005 + 1442695040888963407) % 2**64
        return self.state >> 11

    def below(self, count: int) -> int:
        return self.next() % count

    def words(self, count: int) -> str:
        return " ".join(WORDS[self.below(len(WORDS))] for _ in range(count))


def _tool_definitions() -> tuple[dict[str, Any], ...]:
    return tuple(
        {
            "type": "function",
            "function": {
                "name": name,
                "description": f"{name.replace('_', ' ')} by id",
                "parameters": {
                    "type": "object",
                    "properties": {"id": {"type": "integer"}, "note": {"type": "string"}},
                    "required": ["id"],
                },
            },
        }
        for name in TOOLS
    )


def synthetic_groups(trajectories: int, *, seed: int = 7) -> Iterator[Any]:
    """`trajectories` rollouts in groups of PER_GROUP, made as they are drawn."""
    from trainer_bridge.groups import Group, Rollout

    pseudo = Pseudo(seed)
    tools = _tool_definitions()
    made = 0
    task = 0
    while made < trajectories:
        request = f"Task {task}: please check {pseudo.words(12)}"
        rollouts = []
        for sample in range(min(PER_GROUP, trajectories - made)):
            trace_id = f"{task:06d}-{sample}"
            messages: list[dict[str, Any]] = [
                {"role": "system", "content": "You are the support agent. Use the tools; answer briefly."},
                {"role": "user", "content": request},
            ]
            for step in range(STEPS):
                call_id = f"call_{trace_id}_{step}"
                arguments = json.dumps({"id": pseudo.below(100_000), "note": pseudo.words(4)})
                messages.append(
                    {
                        "role": "assistant",
                        "content": pseudo.words(8) if step % 4 == 0 else None,
                        "tool_calls": [
                            {
                                "id": call_id,
                                "type": "function",
                                "function": {"name": TOOLS[pseudo.below(len(TOOLS))], "arguments": arguments},
                            }
                        ],
                    }
                )
                messages.append({"role": "tool", "tool_call_id": call_id, "content": pseudo.words(24)})
            messages.append({"role": "assistant", "content": f"Done: {pseudo.words(20)}"})
            rollouts.append(
                Rollout(
                    trace_id=trace_id,
                    messages=tuple(messages),
                    tools=tools,
                    reward=pseudo.below(11) / 10,
                    metrics={"steps": STEPS, "duration_s": pseudo.below(9000) / 100},
                    metadata={
                        "agent": "support",
                        "signals": [SIGNALS[pseudo.below(len(SIGNALS))]],
                        "prompt_version": 3,
                    },
                    correction="The corrected answer." if pseudo.below(50) == 0 else None,
                    tokens=1200 + pseudo.below(800),
                )
            )
        made += len(rollouts)
        yield Group(task_id=f"task:{task}", task_text=request, rollouts=tuple(rollouts))
        task += 1


def _child(format_name: str, trajectories: int, output: Path) -> dict[str, Any]:
    """Runs in the child: export (or, for "idle", only import) and report time and own peak RSS."""
    from datetime import UTC, datetime

    from trainer_bridge.formats.manifest import export_write

    started = time.perf_counter()
    counts: dict[str, int] = {}
    size = 0
    if format_name != "idle":
        with output.open("wb") as out:
            manifest = export_write(
                synthetic_groups(trajectories),
                out,
                format_name=format_name,
                curation={"bench": True},
                created_at=datetime.now(UTC),
                threshold=0.5,
            )
        counts = {"lines": manifest.counts.lines, "rollouts": manifest.counts.rollouts}
        size = manifest.size
    seconds = time.perf_counter() - started
    # ru_maxrss is in KiB on Linux.
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": seconds, "peak_mb": peak_mb, "bytes": size, **counts}


def export_measure(format_name: str, trajectories: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch:
        output = Path(scratch) / f"export.{format_name}.jsonl"
        argv = [
            sys.executable,
            "-m",
            "bench.bench_trainer_export",
            "--child-format",
            format_name,
            "--trajectories",
            str(trajectories),
            "--child-output",
            str(output),
        ]
        wall = time.perf_counter()
        result = subprocess.run(argv, cwd=BASE_DIR, check=True, capture_output=True, text=True)
        measured: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
        measured["process_seconds"] = time.perf_counter() - wall
        return measured


def run(report: Report, *, quick: bool, trajectories: int | None = None, others: int | None = None) -> None:
    total = trajectories or (QUICK_TRAJECTORIES if quick else TRAJECTORIES)
    others_total = others or max(total // 5, PER_GROUP)
    report.line(
        f"{total:,} synthetic trajectories ({PER_GROUP} per task, {STEPS} steps of tool call + tool result, "
        f"{2 * STEPS + 3} messages each), made lazily and written by `trainer_bridge.formats` through the manifest's "
        "hashing writer to a temporary file, each export in a child process of its own. Peak memory is the child's "
        "own `ru_maxrss`; 'idle' imports the same modules and writes nothing. Target: ART at 100,000 trajectories "
        f"in ≤ {TARGET_SECONDS:.0f} s and ≤ {TARGET_MB:.0f} MB."
    )
    report.line()
    idle = export_measure("idle", 0)
    art = export_measure("art", total)
    rows: list[list[object]] = [
        ["idle interpreter (baseline)", "-", "-", "-", "-", f"{idle['peak_mb']:.0f}"],
        [
            "art",
            f"{total:,}",
            f"{art['lines']:,}",
            f"{art['bytes'] / 2**20:,.0f}",
            f"{art['seconds']:.1f}",
            f"{art['peak_mb']:.0f}",
        ],
    ]
    for name in ("trl_sft", "trl_dpo", "trl_kto", "openai", "nemo_gym"):
        measured = export_measure(name, others_total)
        rows.append(
            [
                name,
                f"{others_total:,}",
                f"{measured['lines']:,}",
                f"{measured['bytes'] / 2**20:,.0f}",
                f"{measured['seconds']:.1f}",
                f"{measured['peak_mb']:.0f}",
            ]
        )
    report.table(["format", "trajectories", "lines", "file MiB", "export s", "peak RSS MB"], rows)
    rate = art["rollouts"] / art["seconds"]
    verdict_time = "meets" if art["seconds"] <= TARGET_SECONDS else "misses"
    verdict_memory = "meets" if art["peak_mb"] <= TARGET_MB else "misses"
    report.line(
        f"ART: {art['rollouts']:,} trajectories in {art['seconds']:.1f} s ({rate:,.0f}/s; {verdict_time} the "
        f"{TARGET_SECONDS:.0f} s target{' at this size' if total != TRAJECTORIES else ''}), peak RSS "
        f"{art['peak_mb']:.0f} MB ({art['peak_mb'] - idle['peak_mb']:.0f} MB above the idle interpreter; "
        f"{verdict_memory} the {TARGET_MB:.0f} MB target). Export seconds include generating the synthetic data."
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trajectories", type=int)
    parser.add_argument("--others", type=int, help="trajectories for the formats other than ART")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child-format", help=argparse.SUPPRESS)
    parser.add_argument("--child-output", type=Path, help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.child_format:
        print(json.dumps(_child(arguments.child_format, arguments.trajectories or 0, arguments.child_output)))
        return 0
    report = Report("bench_trainer_export")
    run(report, quick=arguments.quick, trajectories=arguments.trajectories, others=arguments.others)
    return 0


if __name__ == "__main__":
    sys.exit(main())
