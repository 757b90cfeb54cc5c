"""Issue 9 §2 and §3, as figures: the fault suite (tests/faults) and the bad-input suite (tests/badinput), run
with pytest in a subprocess, and what they tried, survived and kept.

    python -m bench.bench_reliability [--quick]

The suites run as `make test` runs them (config.settings.test, the tests' embedded PostgreSQL), in a test
database of their own (KEEL_TEST_DATABASE_NAME=test_keel_bench_reliability). Every figure comes from that run:
- **bad inputs tried**: for every hypothesis run inside a test, its passing, failing and invalid examples, as
  hypothesis's statistics count them. They are taken from hypothesis's statistics callback by this module,
  loaded into pytest as a plugin (`-p bench.bench_reliability`), rather than from the statistics pytest
  prints: the schemathesis sweep runs one hypothesis test per operation and mode inside one pytest test,
  and pytest keeps only the last one's statistics. Tests without hypothesis (tests/badinput/test_limits.py's
  oversized bodies, deep nesting, invalid UTF-8, huge attributes, many tiny spans, ...) are listed with their
  outcome;
- **faults survived**: each fault test's outcome and the facts it recorded (tests/faults/traffic.py's
  `record_facts`, which writes to the file named by KEEL_RELIABILITY_FACTS): requests acknowledged and
  refused, spans acknowledged against spans stored, work resumed.

Full size sets KEEL_FUZZ_EXAMPLES (the examples per hypothesis test; CI's are 25 to 60 per test and 2 per
schemathesis operation and mode): FULL_EXAMPLES for the hypothesis tests, FULL_SCHEMATHESIS_EXAMPLES for the
schemathesis sweep, which runs as a second pytest of its own (its cost is per operation). `--quick` leaves it
unset: the CI sizes, one pytest.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from collections import Counter, defaultdict
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bench.harness import BASE_DIR, Report, Stopwatch, load_average

DATABASE = "test_keel_bench_reliability"
FAULTS, BADINPUT = "tests/faults", "tests/badinput"
SCHEMATHESIS = "tests/badinput/test_schemathesis.py"
FULL_EXAMPLES = 300
FULL_SCHEMATHESIS_EXAMPLES = 50
# Where the plugin half of this module (in the pytest process) appends one JSON line per hypothesis run.
EXAMPLES_FILE_VARIABLE = "KEEL_RELIABILITY_EXAMPLES"
FACTS_FILE_VARIABLE = "KEEL_RELIABILITY_FACTS"  # tests/faults/traffic.py reads the same name
OUTCOMES = ("passed", "skipped", "failed", "error")


# The pytest plugin: `-p bench.bench_reliability` loads these hooks into the suites' pytest process.


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    """Count the examples of every hypothesis run inside the test. Innermost of the wrappers (trylast), so
    hypothesis's own plugin, when the test is a @given test, has already installed its statistics callback,
    which still gets every run's statistics after this one."""
    path = os.environ.get(EXAMPLES_FILE_VARIABLE)
    if not path or "hypothesis" not in sys.modules:
        return (yield)
    from hypothesis.statistics import collector

    outer: Callable[[dict[str, Any]], None] | None = collector.value

    def note(statistics: dict[str, Any]) -> None:
        statuses: Counter[str] = Counter()
        for key, phase in statistics.items():
            if key.endswith("-phase") and isinstance(phase, dict):
                statuses.update(case["status"] for case in phase.get("test-cases", ()))
        line = {
            "test": item.nodeid,
            "passing": statuses["valid"],
            "failing": statuses["interesting"],
            "invalid": statuses["invalid"] + statuses["overrun"],
            "stopped_because": statistics.get("stopped-because", ""),
        }
        with open(path, "a") as output:
            output.write(json.dumps(line) + "\n")
        if outer is not None:
            outer(statistics)

    # Typed DynamicVariable[None] by hypothesis, for its default; its value is the statistics callback.
    with collector.with_value(note):  # type: ignore[arg-type]
        return (yield)


# The benchmark.


@dataclass
class Examples:
    runs: int = 0
    passing: int = 0
    failing: int = 0
    invalid: int = 0

    @property
    def tried(self) -> int:
        return self.passing + self.failing + self.invalid

    def add(self, other: Examples) -> None:
        self.runs += other.runs
        self.passing += other.passing
        self.failing += other.failing
        self.invalid += other.invalid


@dataclass
class Outcome:
    nodeid: str
    outcome: str  # one of OUTCOMES
    seconds: float
    message: str = ""
    details: str = ""  # the end of the failure's report, for a test that failed


@dataclass
class Run:
    """One pytest process: what it ran, how, and what came out."""

    paths: list[str]
    ignore: list[str]
    examples: int | None  # KEEL_FUZZ_EXAMPLES; None: unset, the CI sizes
    exit_code: int = -1
    seconds: float = 0.0
    summary: str = ""  # pytest's last line
    output_tail: str = ""
    outcomes: list[Outcome] = field(default_factory=list)
    examples_by_test: dict[str, Examples] = field(default_factory=dict)
    facts_by_test: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def _nodeid(classname: str, name: str) -> str:
    """pytest's node id from a JUnit test case (no test classes in these suites)."""
    return f"{classname.replace('.', '/')}.py::{name}"


def _outcomes(junit: Path) -> list[Outcome]:
    """Every test case of the JUnit report, one outcome each: pytest writes a second case for an error in
    teardown, and the worse of the two is the test's."""
    worse = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
    found: dict[str, Outcome] = {}
    # The report our own pytest process just wrote, not untrusted input.
    for case in ElementTree.parse(junit).getroot().iter("testcase"):  # noqa: S314
        nodeid = _nodeid(case.get("classname", ""), case.get("name", ""))
        outcome = Outcome(nodeid, "passed", float(case.get("time") or 0))
        for child in case:
            name = {"failure": "failed", "error": "error", "skipped": "skipped"}.get(child.tag)
            if name is not None and worse[name] > worse[outcome.outcome]:
                outcome.outcome = name
                outcome.message = (child.get("message") or "").strip().split("\n")[0][:200]
                outcome.details = (child.text or "")[-4000:]
        previous = found.get(nodeid)
        if previous is not None:
            outcome.seconds += previous.seconds
            if worse[previous.outcome] >= worse[outcome.outcome]:
                outcome.outcome, outcome.message, outcome.details = previous.outcome, previous.message, previous.details
        found[nodeid] = outcome
    return list(found.values())


def _json_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _pytest(run: Run, scratch: Path) -> None:
    """Run the suites once in pytest, and read back its JUnit report, the examples and the facts."""
    junit, examples, facts = scratch / "junit.xml", scratch / "examples.jsonl", scratch / "facts.jsonl"
    environment = {
        **os.environ,
        "KEEL_TEST_DATABASE_NAME": DATABASE,
        EXAMPLES_FILE_VARIABLE: str(examples),
        FACTS_FILE_VARIABLE: str(facts),
    }
    environment.pop("KEEL_FUZZ_EXAMPLES", None)
    if run.examples is not None:
        environment["KEEL_FUZZ_EXAMPLES"] = str(run.examples)
    argv = [sys.executable, "-m", "pytest", *run.paths, *(f"--ignore={path}" for path in run.ignore)]
    argv += ["-p", "no:cacheprovider", "-p", "bench.bench_reliability", "--hypothesis-show-statistics"]
    argv += [f"--junitxml={junit}", "-q"]
    clock = Stopwatch()
    completed = subprocess.run(argv, cwd=BASE_DIR, env=environment, capture_output=True, text=True, check=False)
    run.seconds = clock.seconds()
    run.exit_code = completed.returncode
    lines = completed.stdout.strip().splitlines()
    run.summary = lines[-1].strip("= ") if lines else ""
    run.output_tail = (completed.stdout[-3000:] + completed.stderr[-2000:]).strip()
    run.outcomes = _outcomes(junit) if junit.exists() else []
    for line in _json_lines(examples):
        counted = Examples(1, line["passing"], line["failing"], line["invalid"])
        run.examples_by_test.setdefault(line["test"], Examples()).add(counted)
    for line in _json_lines(facts):
        run.facts_by_test.setdefault(line["test"], []).append(line)


def _runs(quick: bool) -> list[Run]:
    if quick:
        return [Run([FAULTS, BADINPUT], [], None)]
    return [
        Run([FAULTS, BADINPUT], [SCHEMATHESIS], FULL_EXAMPLES),
        Run([SCHEMATHESIS], [], FULL_SCHEMATHESIS_EXAMPLES),
    ]


def _short(nodeid: str) -> str:
    """`tests/badinput/test_otlp.py::test_x[case]` as `test_otlp.py::test_x[case]` (a case may hold a `/`)."""
    path, _, name = nodeid.partition("::")
    return f"{Path(path).name}::{name}"


def _function(nodeid: str) -> str:
    return _short(nodeid).split("[")[0]


def _case(nodeid: str) -> str:
    return nodeid.split("[", 1)[1].rstrip("]") if "[" in nodeid else ""


def _count(outcomes: Iterable[Outcome]) -> str:
    counted = Counter(outcome.outcome for outcome in outcomes)
    text = ", ".join(f"{counted[name]} {name}" for name in OUTCOMES if counted[name]) or "no test ran"
    return text.replace("failed", "**failed**").replace("error", "**error**")


def _outcome_cell(outcome: Outcome) -> str:
    if outcome.outcome in ("failed", "error"):
        return f"**{outcome.outcome}**: {outcome.message}".replace("|", "\\|")
    if outcome.outcome == "skipped":
        return f"skipped: {outcome.message}".replace("|", "\\|")
    return "passed"


def _facts_cell(facts: list[dict[str, Any]]) -> str:
    if not facts:
        return "(none recorded)"
    texts = []
    for record in facts:
        pairs = "; ".join(f"{key.replace('_', ' ')} {_value(value)}" for key, value in record["facts"].items())
        texts.append(f"_{record['name']}_: {pairs}")
    return "<br>".join(texts).replace("|", "\\|")


def _value(value: object) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {_value(item)}" for key, item in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    return str(value)


def _bad_inputs(report: Report, outcomes: list[Outcome], examples: dict[str, Examples]) -> Examples:
    report.line("#### Bad inputs tried (tests/badinput)")
    report.line()
    total = Examples()
    rows = []
    for outcome in outcomes:
        counted = examples.get(outcome.nodeid)
        if counted is None:
            continue
        total.add(counted)
        runs = f"{counted.runs} (operation × mode)" if counted.runs > 1 else "1"
        row = [_short(outcome.nodeid), _outcome_cell(outcome), runs, counted.passing, counted.failing, counted.invalid]
        rows.append([*row, counted.tried])
    rows.append(["**total**", "", total.runs, total.passing, total.failing, total.invalid, f"**{total.tried}**"])
    report.line(
        "Per hypothesis test: the hypothesis runs inside it (one for a @given test; the schemathesis sweep runs "
        "one per operation and generation mode) and their examples, as hypothesis counts them (passing; "
        "failing, shrinking included; invalid: rejected by a filter or assumption while generating)."
    )
    report.line()
    report.table(["test", "outcome", "hypothesis runs", "passing", "failing", "invalid", "examples"], rows)

    by_function: dict[str, list[Outcome]] = defaultdict(list)
    for outcome in outcomes:
        if outcome.nodeid not in examples:
            by_function[_function(outcome.nodeid)].append(outcome)
    rows = []
    for function, cases in by_function.items():
        names = [_case(case.nodeid) for case in cases if _case(case.nodeid)]
        named = ", ".join(names[:12]) + (f", … ({len(names)} in all)" if len(names) > 12 else "")
        failures = "; ".join(
            f"{_case(case.nodeid) or 'the test'}: {_outcome_cell(case)}" for case in cases if case.outcome != "passed"
        )
        rows.append([function, named or "—", len(cases), _count(cases), failures or "—"])
    report.line("The tests without hypothesis: fixed bad inputs (limits, encodings, edges), with their cases.")
    report.line()
    report.table(["test", "cases", "count", "outcome", "not passed"], rows)
    return total


def _faults(report: Report, outcomes: list[Outcome], facts: dict[str, list[dict[str, Any]]]) -> None:
    report.line("#### Faults survived (tests/faults)")
    report.line()
    rows = [
        [
            _short(outcome.nodeid),
            _outcome_cell(outcome),
            f"{outcome.seconds:.0f}",
            _facts_cell(facts.get(outcome.nodeid, [])),
        ]
        for outcome in outcomes
    ]
    report.table(["test", "outcome", "s", "what it measured"], rows)


def _nothing_lost(facts: Iterable[dict[str, Any]]) -> tuple[bool, int, int]:
    """Whether the recorded facts show nothing lost and nothing done twice; the spans acknowledged and stored."""
    acknowledged = stored = 0
    kept = True
    for record in facts:
        values = record["facts"]
        if "spans_acknowledged" in values:
            acknowledged += values["spans_acknowledged"]
            stored += values["spans_stored"]
            kept &= values["spans_stored"] == values["spans_acknowledged"]
        kept &= values.get("spans_stored_twice", 0) == 0 and values.get("trajectories_written_twice", 0) == 0
        kept &= values.get("gateway_traces_stored", 0) == values.get("gateway_requests_answered", 0)
        kept &= values.get("failed_batches", 0) == 0 and values.get("other_5xx", 0) == 0
        kept &= values.get("unanswered", 0) == 0 and values.get("requests_hung", 0) == 0
    return kept, acknowledged, stored


def _summary(
    report: Report, fault_outcomes: list[Outcome], bad_outcomes: list[Outcome], runs: list[Run], tried: Examples
) -> None:
    facts = [record for run in runs for records in run.facts_by_test.values() for record in records]
    counted = Counter(outcome.outcome for outcome in fault_outcomes)
    passed = counted["failed"] + counted["error"] == 0 and bool(fault_outcomes)
    kept, acknowledged, stored = _nothing_lost(facts)
    with_facts = sum(1 for outcome in fault_outcomes if any(run.facts_by_test.get(outcome.nodeid) for run in runs))
    verdict = "all passed" if passed else "NOT all passed"
    text = f"**Faults: {verdict}** ({_count(fault_outcomes)}; {with_facts} with recorded facts). "
    if passed and kept:
        text += (
            f"Nothing lost: every acknowledged span stored exactly once ({acknowledged} acknowledged, {stored} stored, "
            "none twice), every answered gateway request's trace stored, no failed batch, no 5xx but a 503 with "
            "Retry-After, no request left hanging."
        )
    elif not kept:
        text += (
            f"**Something was lost or done twice** ({acknowledged} spans acknowledged, {stored} stored): "
            "see the facts above."
        )
    else:
        text += "A fault test failed, so this run does not show that nothing is lost: see above."
    report.line(text)
    report.line()
    counted = Counter(outcome.outcome for outcome in bad_outcomes)
    passed = counted["failed"] + counted["error"] == 0 and bool(bad_outcomes)
    report.line(
        f"**Bad inputs: {'all passed' if passed else 'NOT all passed'}** ({_count(bad_outcomes)}). "
        f"{tried.tried} generated examples in {tried.runs} hypothesis runs ({tried.passing} passing, "
        f"{tried.failing} failing, {tried.invalid} invalid)"
        + (
            ", each one answered or refused with a 4xx as the tests require, a refusal leaving every table's "
            "row count as it was."
            if passed
            else ": a test failed, see above."
        )
    )
    report.line()


def run(report: Report, *, quick: bool) -> None:
    measure(report, quick=quick)


def measure(report: Report, *, quick: bool) -> bool:
    """Run the suites and add their figures to the report; returns whether every test passed."""
    clock = Stopwatch()
    runs = _runs(quick)
    for each in runs:
        before = load_average()
        with tempfile.TemporaryDirectory(prefix="bench-reliability-") as scratch:
            _pytest(each, Path(scratch))
        setting = "unset (CI sizes)" if each.examples is None else str(each.examples)
        report.line(
            f"- `pytest {' '.join(each.paths)}{''.join(f' --ignore={path}' for path in each.ignore)}`, "
            f"KEEL_FUZZ_EXAMPLES {setting}: {each.summary or 'no summary'} (exit code {each.exit_code}; "
            f"{each.seconds:.0f} s; load average before {before}, after {load_average()})"
        )
    report.line()

    outcomes = [outcome for each in runs for outcome in each.outcomes]
    examples = {nodeid: counted for each in runs for nodeid, counted in each.examples_by_test.items()}
    facts = {nodeid: records for each in runs for nodeid, records in each.facts_by_test.items()}
    fault_outcomes = [outcome for outcome in outcomes if outcome.nodeid.startswith(FAULTS + "/")]
    bad_outcomes = [outcome for outcome in outcomes if outcome.nodeid.startswith(BADINPUT + "/")]
    for each in runs:
        if each.exit_code not in (0, 1) or not each.outcomes:
            report.line(f"**pytest did not complete** (exit code {each.exit_code}); the end of its output:")
            report.code(each.output_tail)

    tried = _bad_inputs(report, bad_outcomes, examples)
    _faults(report, fault_outcomes, facts)
    report.line("#### Summary")
    report.line()
    _summary(report, fault_outcomes, bad_outcomes, runs, tried)
    failed = [outcome for outcome in outcomes if outcome.outcome in ("failed", "error")]
    for outcome in failed:
        report.line(f"**{_short(outcome.nodeid)} {outcome.outcome}**; the end of its report:")
        report.code(outcome.details or outcome.message)
    report.line(f"_Whole benchmark: {clock.seconds():.0f} s._")
    return not failed and all(each.exit_code == 0 for each in runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CI sizes (KEEL_FUZZ_EXAMPLES unset)")
    arguments = parser.parse_args()
    return 0 if measure(Report("bench_reliability"), quick=arguments.quick) else 1


if __name__ == "__main__":
    sys.exit(main())
