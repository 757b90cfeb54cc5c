"""The ingest pipeline's pure modules, compiled with Cython: built by `main()` (`make install` runs it),
and imported compiled only when built from the source as it is now.

Decoding, mapping, assembling trajectories and computing their signals is most of the web's Python work
for every span stored. Compiled as written, with no type declared, the same code took 27 % less of the
web's CPU per span in process, and 7 %, 20 % and 16 % less in three benchmark runs, each taken in turn
with one as Python (bench/RESULTS.md, 2026-11-30). One module is written to be compiled: tracing.wire,
whose C types `wire.pxd` declares; the stamp's digest covers a module's .pxd as well as its source.

The source stays the one truth. Each extension sits beside its source (`otlp.cpython-311-x86_64-linux-gnu.so`
beside `otlp.py`) with a stamp (`otlp.compiled`) holding the SHA-256 of the source it was built from.
Python imports an extension before a source whatever their ages, so `tracing/__init__.py` installs a
finder that imports the source instead when the stamp is missing or names another source (the module was
edited since its build), or when KEEL_COMPILED=0. Without Cython or a C compiler nothing is built, and
the modules run as Python.

Pure modules only (no Django): tracing/tests/test_compiled.py checks that, compiled and as source, they
make the same spans, rows, trajectories and signals of the benchmark's requests and of agent runs from
the test suite.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import shutil
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

# tracing.wire comes first: the others take long to compile, and it is the one whose types matter most.
MODULES = ("tracing.wire", "tracing.otlp", "tracing.steps", "tracing.signals", "tracing.records")
# KEEL_COMPILED=0 imports every module from its source, built or not.
ENABLED_VARIABLE = "KEEL_COMPILED"

_ROOT = Path(__file__).resolve().parent.parent
_EXTENSION_SUFFIX = sysconfig.get_config_var("EXT_SUFFIX") or importlib.machinery.EXTENSION_SUFFIXES[0]


def source_path(module: str) -> Path:
    return _ROOT.joinpath(*module.split(".")).with_suffix(".py")


def extension_path(module: str) -> Path:
    source = source_path(module)
    return source.with_name(source.stem + _EXTENSION_SUFFIX)


def stamp_path(module: str) -> Path:
    return source_path(module).with_suffix(".compiled")


def source_digest(source: Path) -> str:
    """The SHA-256 of the source and of the .pxd beside it, if any (Cython reads the types it declares)."""
    digest = hashlib.sha256(source.read_bytes())
    declarations = source.with_suffix(".pxd")
    if declarations.is_file():
        digest.update(b"\0pxd\0" + declarations.read_bytes())
    return digest.hexdigest()


def compiled_current(module: str) -> bool:
    """Whether the module's extension was built from its source as it is now."""
    extension, stamp = extension_path(module), stamp_path(module)
    if not extension.is_file() or not stamp.is_file():
        return False
    return stamp.read_text().strip() == source_digest(source_path(module))


def enabled() -> bool:
    return os.environ.get(ENABLED_VARIABLE, "1") != "0"


class _SourceUnlessCompiled(importlib.abc.MetaPathFinder):
    """Finds MODULES: the source when the extension is stale, missing or switched off; otherwise leaves
    the module to Python's own finder, which takes the extension."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MODULES:
            return None
        if enabled() and compiled_current(fullname):
            return None
        return importlib.util.spec_from_file_location(fullname, source_path(fullname))


def finder_install() -> None:
    if not any(isinstance(finder, _SourceUnlessCompiled) for finder in sys.meta_path):
        sys.meta_path.insert(0, _SourceUnlessCompiled())


def describe() -> str:
    """Which modules the next import takes compiled, in a line for people."""
    if not enabled():
        return f"switched off ({ENABLED_VARIABLE}=0): the ingest pipeline runs as Python"
    current = [module for module in MODULES if compiled_current(module)]
    if not current:
        return "none built: the ingest pipeline runs as Python"
    stale = [module for module in MODULES if module not in current]
    return f"{len(current)} of {len(MODULES)} modules compiled" + (
        f" ({', '.join(stale)} as Python: not built from its current source)" if stale else ""
    )


def loaded_compiled(module: ModuleType) -> bool:
    """Whether an imported module is one of the extensions."""
    return str(getattr(module, "__file__", "")).endswith(_EXTENSION_SUFFIX)


def modules_loaded() -> dict[str, bool]:
    """Each of MODULES, imported, and whether it came compiled."""
    return {module: loaded_compiled(importlib.import_module(module)) for module in MODULES}


def build() -> list[str]:
    """Compile the modules whose extension is not current; returns the ones built. Raises
    CompileUnavailable without Cython or a C compiler, and whatever Cython or the compiler raise
    for a module they cannot build."""
    stale = [module for module in MODULES if not compiled_current(module)]
    if not stale:
        return []
    try:
        from Cython.Build import cythonize
        from setuptools import Distribution, Extension
    except ImportError as error:
        raise CompileUnavailable(f"Cython is not installed ({error})") from None
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        raise CompileUnavailable(f"no C compiler ({compiler} is not on PATH)")
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not headers.is_file():
        raise CompileUnavailable(f"no Python headers ({headers}; Debian's python3-dev has them)")
    # The digest of what is compiled, read before Cython reads it: a source edited during the build
    # gets a stamp that does not match it, and is imported as source.
    digests = {module: source_digest(source_path(module)) for module in stale}
    extensions = [
        Extension(
            module,
            [str(source_path(module).relative_to(_ROOT))],
            extra_compile_args=["-O2", "-g0"],
        )
        for module in stale
    ]
    build_dir = _ROOT / "build" / "cython"
    for module in stale:
        # A new file, not the old one rewritten: a process running the old extension has it mapped.
        extension_path(module).unlink(missing_ok=True)
    with contextlib.chdir(_ROOT):  # Cython and build_ext take paths from the project's root
        distribution = Distribution(
            {
                "name": "keel-compiled",
                "ext_modules": cythonize(
                    extensions,
                    build_dir=str(build_dir),
                    # Annotations stay annotations. Typed by them, the compiled services module refused a
                    # TextChoices member for an argument annotated `str` (a subclass), and a `float` argument
                    # would become a C double; as Python, neither happens.
                    compiler_directives={"language_level": 3, "binding": True, "annotation_typing": False},
                    quiet=True,
                    # Translate again even when the C file looks newer: only stale modules come here, and
                    # a file left by a build with other directives must not be reused.
                    force=True,
                    nthreads=os.cpu_count() or 1,
                ),
            }
        )
        command = distribution.get_command_obj("build_ext")
        command.inplace = True
        command.force = True
        command.parallel = os.cpu_count() or 1
        command.build_temp = str(build_dir / "temp")
        distribution.run_command("build_ext")
    for module in stale:
        stamp_path(module).write_text(digests[module] + "\n")
    return stale


class CompileUnavailable(Exception):
    """This machine cannot build the extensions; the modules run as Python."""


def main() -> int:
    try:
        built = build()
    except CompileUnavailable as error:
        print(f"tracing.compiled: not compiled, the ingest pipeline runs as Python: {error}")
        return 0
    print(f"tracing.compiled: {describe()}; {len(built)} built now")
    return 0
