"""tracing.compiled: the pipeline's modules run compiled when built from their current source, as source
otherwise, and compiled they make of a request exactly what the source makes of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from bench.workload import templates_build
from tracing import compiled, otlp, signals, steps
from tracing.tests import compiled_digest
from tracing.tests.agent_traces import long_conversation, refund_conversation
from tracing.tests.conftest import OtelRecorder

BASE_DIR = Path(__file__).resolve().parents[2]


def _built_or_skip() -> None:
    """The comparisons need the extensions. CI builds them (`make install`), so there they must be current;
    elsewhere, a module edited since the last build is only skipped."""
    stale = [module for module in compiled.MODULES if not compiled.compiled_current(module)]
    if stale and os.environ.get("CI") != "true":
        pytest.skip(f"not compiled from the current source: {', '.join(stale)} (make install builds them)")
    assert not stale, f"make install left these modules without a current extension: {stale}"


def test_the_pipeline_runs_compiled_in_this_process() -> None:
    _built_or_skip()
    assert compiled.modules_loaded() == dict.fromkeys(compiled.MODULES, compiled.enabled())


def _agent_runs() -> OtelRecorder:
    """Agent runs whose tools fail, whose prompts are Langfuse's and whose histories are long."""
    recorder = OtelRecorder()
    tracer = recorder.tracer()
    refund_conversation(tracer)
    refund_conversation(tracer, session="session-2", tool_fails=True, prompt=("refunds", "3"))
    long_conversation(tracer, turns=30)
    long_conversation(tracer, turns=12, tool_spans=False, big_number=True)
    return recorder


def _corpus(directory: Path) -> None:
    """The benchmark's requests (500 spans each), and the agent runs as protobuf and as JSON."""
    for number, template in enumerate(templates_build(2)):
        (directory / f"bench-{number}.pb").write_bytes(template.body)
    recorder = _agent_runs()
    (directory / "agents.pb").write_bytes(recorder.protobuf())
    (directory / "agents.json").write_bytes(recorder.json())


def _python(*arguments: str, environment: Mapping[str, str]) -> str:
    """What this interpreter prints, run from the project's root with these arguments."""
    result = subprocess.run(
        [sys.executable, *arguments],
        cwd=BASE_DIR,
        env=dict(environment),
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return result.stdout


def _digests(directory: Path, *, compiled_on: bool) -> dict[str, Any]:
    environment = {**os.environ, compiled.ENABLED_VARIABLE: "1" if compiled_on else "0"}
    parsed: dict[str, Any] = json.loads(
        _python("-m", "tracing.tests.compiled_digest", str(directory), environment=environment)
    )
    return parsed


def test_compiled_and_source_make_the_same_spans_trajectories_and_signals(tmp_path: Path) -> None:
    _built_or_skip()
    _corpus(tmp_path)
    as_source = _digests(tmp_path, compiled_on=False)
    as_compiled = _digests(tmp_path, compiled_on=True)
    assert set(as_source["compiled"].values()) == {False}
    assert set(as_compiled["compiled"].values()) == {True}
    assert as_compiled["digests"] == as_source["digests"]
    # Three distinct requests; the agents' as protobuf and as JSON map alike.
    assert len({digest["mapped"] for digest in as_source["digests"].values()}) == 3
    assert as_source["digests"]["agents.pb"]["mapped"] == as_source["digests"]["agents.json"]["mapped"]
    # And this process's modules (compiled, when built) agree with the source too.
    agent_views = compiled_digest.body_digests((tmp_path / "agents.pb").read_bytes(), otlp.CONTENT_TYPE_PROTOBUF)
    assert agent_views == as_source["digests"]["agents.pb"]


def test_the_corpus_fires_signals() -> None:
    spans = _agent_runs().spans()
    traces = sorted({span.trace_id for span in spans})
    reports = [
        signals.signals_compute(steps.trajectory_view_build([s for s in spans if s.trace_id == trace_id]))
        for trace_id in traces
    ]
    assert len(traces) == 4
    assert sum(len(report.instances) for report in reports) > 0


# --- The finder and the build, on a package of one module in a temporary directory ------------------


@pytest.fixture
def one_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "mod.py").write_text("def double(x):\n    return 2 * x\n")
    monkeypatch.setattr(compiled, "_ROOT", tmp_path)
    monkeypatch.setattr(compiled, "MODULES", ("pkg.mod",))
    monkeypatch.delenv(compiled.ENABLED_VARIABLE, raising=False)
    return package


def _found(name: str = "pkg.mod") -> str | None:
    spec = compiled._SourceUnlessCompiled().find_spec(name, None)
    return None if spec is None else spec.origin


def _pretend_built(package: Path) -> None:
    compiled.extension_path("pkg.mod").write_bytes(b"an extension")
    compiled.stamp_path("pkg.mod").write_text(compiled.source_digest(package / "mod.py") + "\n")


def test_a_current_extension_is_left_to_pythons_finder(one_module: Path) -> None:
    _pretend_built(one_module)
    assert compiled.compiled_current("pkg.mod")
    assert _found() is None


def test_a_module_edited_since_its_build_is_imported_from_source(one_module: Path) -> None:
    _pretend_built(one_module)
    (one_module / "mod.py").write_text("def double(x):\n    return x + x\n")
    assert not compiled.compiled_current("pkg.mod")
    assert _found() == str(one_module / "mod.py")


@pytest.mark.parametrize("missing", ["extension", "stamp"])
def test_a_module_without_extension_or_stamp_is_imported_from_source(one_module: Path, missing: str) -> None:
    _pretend_built(one_module)
    (compiled.extension_path if missing == "extension" else compiled.stamp_path)("pkg.mod").unlink()
    assert _found() == str(one_module / "mod.py")


def test_switched_off_every_module_is_imported_from_source(one_module: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _pretend_built(one_module)
    monkeypatch.setenv(compiled.ENABLED_VARIABLE, "0")
    assert _found() == str(one_module / "mod.py")


def test_other_modules_are_left_alone(one_module: Path) -> None:
    assert _found("pkg") is None
    assert _found("tracing.services") is None


_IMPORT = """
import sys
from pathlib import Path
import tracing.compiled as c
c._ROOT = Path(sys.argv[1])
c.MODULES = ("pkg.mod",)
c.finder_install()
sys.path.insert(0, sys.argv[1])
built = c.build() if sys.argv[2] == "build" else []
import pkg.mod
print(built, c.loaded_compiled(pkg.mod), pkg.mod.double(21))
"""


def _run(root: Path, action: str) -> str:
    environment = {key: value for key, value in os.environ.items() if key != compiled.ENABLED_VARIABLE}
    return _python("-c", _IMPORT, str(root), action, environment=environment).strip()


def test_build_compiles_what_is_stale_and_the_finder_takes_it(one_module: Path) -> None:
    root = one_module.parent
    assert _run(root, "build") == "['pkg.mod'] True 42"
    assert _run(root, "build") == "[] True 42"  # nothing stale: nothing built
    (one_module / "mod.py").write_text("def double(x):\n    return x + x + 1\n")
    assert _run(root, "import") == "[] False 43"  # edited: the source, not the old extension
    assert _run(root, "build") == "['pkg.mod'] True 43"


def test_without_a_c_compiler_nothing_is_built_and_install_goes_on(
    one_module: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config_var = sysconfig.get_config_var
    monkeypatch.setattr(
        sysconfig, "get_config_var", lambda name: "no-such-cc -pthread" if name == "CC" else config_var(name)
    )
    with pytest.raises(compiled.CompileUnavailable, match="no-such-cc"):
        compiled.build()
    assert compiled.main() == 0
    assert "runs as Python: no C compiler (no-such-cc is not on PATH)" in capsys.readouterr().out
    assert not compiled.extension_path("pkg.mod").exists()
    assert _found() == str(one_module / "mod.py")
