"""`make bench`: run every benchmark and append a dated section to bench/RESULTS.md.

    python -m bench [--quick] [--only NAME ...] [--no-results]

Every `bench/bench_<name>.py` is a benchmark. Each runs in a process of its own (each configures
Django for a database of its own, and a crash in one does not lose the others' figures):
- a module with `run(report: Report, *, quick: bool) -> None` (see bench/harness.py) is run through
  `python -m bench --child <module>`, and what it added to the report is its section;
- a module without one is run as `python -m bench.<name>` (plus QUICK_ARGUMENTS[name] under
  --quick), and its standard output is its section: as it is if it prints markdown tables, else in a
  code block.
The section starts with the date, the machine (CPU model, cores, RAM, Python, PostgreSQL) and the
load average before and after each benchmark: the machine is shared, so figures taken under load
say so.
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from bench.harness import BASE_DIR, BENCH_DIR, Report, load_average, machine_lines

RESULTS = BENCH_DIR / "RESULTS.md"
RESULTS_HEADER = (
    "# Benchmark results\n\n"
    "Appended by `make bench` (`python -m bench`), newest last. How each benchmark works: bench/README.md.\n"
)
# Arguments that make a module without `run()` short under --quick.
QUICK_ARGUMENTS: dict[str, list[str]] = {"bench_otlp_parse": ["--trajectories", "200", "--repeat", "1"]}
# Order of the run: cheap single-process ones first, the server benchmarks last.
FIRST = ("bench_otlp_parse",)


def benchmark_names() -> list[str]:
    names = sorted(path.stem for path in BENCH_DIR.glob("bench_*.py"))
    return [name for name in FIRST if name in names] + [name for name in names if name not in FIRST]


def _has_run(name: str) -> bool:
    """Whether the module defines `run(report, *, quick)`; read from the source, so nothing is imported here."""
    source = (BENCH_DIR / f"{name}.py").read_text()
    return "\ndef run(report: Report" in source


def _child(name: str, quick: bool, output: Path) -> int:
    module = importlib.import_module(f"bench.{name}")
    report = Report(name)
    module.run(report, quick=quick)
    output.write_text("\n".join(report.parts))
    return 0


def _as_markdown(output: str) -> str:
    """A module's standard output as markdown: as it is (headings demoted) when it prints a markdown
    table, else fenced."""
    if not output.strip():
        return ""
    lines = output.splitlines()
    if any(line.startswith(("|---", "|:--")) for line in lines):
        # Its headings go under the benchmark's own (### name): demote them by two levels.
        return "\n".join("##" + line if line.startswith("#") else line for line in lines) + "\n"
    return "```\n" + output.rstrip("\n") + "\n```\n"


def run_one(name: str, quick: bool) -> tuple[str, bool, float]:
    """Run one benchmark in a child process; returns its markdown body, whether it succeeded, seconds."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as scratch:
        output = Path(scratch) / "section.md"
        if _has_run(name):
            argv = [sys.executable, "-m", "bench", "--child", name, "--child-output", str(output)]
            if quick:
                argv.append("--quick")
            code = subprocess.run(argv, cwd=BASE_DIR, check=False).returncode
            body = output.read_text() if output.exists() else ""
        else:
            argv = [sys.executable, "-m", f"bench.{name}", *(QUICK_ARGUMENTS.get(name, []) if quick else [])]
            captured = subprocess.run(argv, cwd=BASE_DIR, check=False, capture_output=True, text=True)
            sys.stdout.write(captured.stdout)
            sys.stderr.write(captured.stderr[-4000:])
            code = captured.returncode
            body = _as_markdown(captured.stdout)
    ok = code == 0
    if not ok:
        body += f"\n**Failed** with exit code {code}; see the output of `python -m bench`.\n"
    return body, ok, time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short runs, for smoke-testing")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these (e.g. bench_ingest)")
    parser.add_argument("--no-results", action="store_true", help="print only; do not append to bench/RESULTS.md")
    parser.add_argument("--profile", action="store_true", help="bench_ingest: also profile Keel (py-spy, cProfile)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-output", type=Path, help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.child:
        return _child(arguments.child, arguments.quick, arguments.child_output)

    if arguments.profile:
        os.environ["BENCH_PROFILE"] = "1"
    names = benchmark_names()
    if arguments.only:
        wanted = {name if name.startswith("bench_") else f"bench_{name}" for name in arguments.only}
        unknown = wanted - set(names)
        if unknown:
            parser.error(f"no such benchmark: {', '.join(sorted(unknown))} (have: {', '.join(names)})")
        names = [name for name in names if name in wanted]

    started = datetime.now(UTC)
    sections = [
        f"## {started:%Y-%m-%d %H:%M} UTC{' (--quick: smoke test, not figures)' if arguments.quick else ''}",
        "",
        *machine_lines(),
        "",
    ]
    failures = 0
    for name in names:
        print(f"\n=== {name} (load average {load_average()}) ===", flush=True)
        before = load_average()
        body, ok, seconds = run_one(name, arguments.quick)
        failures += not ok
        sections += [
            f"### {name}",
            "",
            f"_{seconds:.0f} s; load average (1/5/15 min) before {before}, after {load_average()}._",
            "",
            body.rstrip("\n"),
            "",
        ]
    text = "\n".join(sections).rstrip("\n") + "\n"
    if arguments.no_results:
        print(text)
    else:
        existing = RESULTS.read_text() if RESULTS.exists() else RESULTS_HEADER
        RESULTS.write_text(existing.rstrip("\n") + "\n\n" + text)
        print(f"\nappended to {RESULTS.relative_to(BASE_DIR)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
