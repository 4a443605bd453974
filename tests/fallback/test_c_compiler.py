"""C sources of this package compiled once per process (``aot.fallback.c_compiler``)."""

import ctypes
import logging
import shutil

import pytest

from aot.fallback import c_compiler

has_cc = pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")),
                            reason="no C compiler here")


@has_cc
def test_a_source_compiles_loads_and_runs():
    lib = c_compiler.load("int aot_twice(int x) { return 2 * x; }", ["-O2"], "a test")
    assert lib is not None and lib.aot_twice(ctypes.c_int(21)) == 42


@has_cc
def test_a_source_that_does_not_compile_is_none_and_logged(caplog):
    with caplog.at_level(logging.INFO, logger="aot.fallback.c_compiler"):
        assert c_compiler.load("this is not C", [], "a broken test source") is None
    assert "a broken test source did not compile" in caplog.text


def test_without_a_compiler_nothing_is_loaded(monkeypatch, caplog):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    with caplog.at_level(logging.INFO, logger="aot.fallback.c_compiler"):
        assert c_compiler.load("int f(void) { return 0; }", [], "a test source") is None
    assert "did not compile with /nonexistent/cc" in caplog.text


@has_cc
def test_cc_with_arguments_is_split_as_a_shell_would(monkeypatch):
    monkeypatch.setenv("CC", f"{shutil.which('cc') or shutil.which('gcc')} -O1")
    lib = c_compiler.load("int aot_three(void) { return 3; }", [], "a test")
    assert lib is not None and lib.aot_three() == 3


def test_a_cc_that_is_not_a_command_line_is_refused(monkeypatch, caplog):
    monkeypatch.setenv("CC", "gcc '-O1")
    with caplog.at_level(logging.INFO, logger="aot.fallback.c_compiler"):
        assert c_compiler.load("int f(void) { return 0; }", [], "a test source") is None
    assert "$CC is not a command line" in caplog.text
