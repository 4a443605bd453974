"""A long compile says what it is doing: each long step logs a line on ``aot.progress``
and the CLI prints them with the seconds elapsed."""

import logging

import torch

import aot
from aot import progress


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(256, 256)

    def forward(self, x):
        return torch.special.i0(self.fc(x))


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_compile_steps_are_logged(tmp_path, monkeypatch):
    monkeypatch.setenv("AOT_CACHE_DIR", str(tmp_path))  # cold: probes and measures
    got = _Lines()
    level = progress.log.level
    # setLevel, not the attribute: it also clears the logger's cache of what is enabled,
    # which an earlier step logged at the default level has filled
    progress.log.setLevel(logging.INFO)
    progress.log.addHandler(got)
    try:
        cm = aot.compile(Small().eval(), (torch.randn(64, 256),))
    finally:
        progress.log.removeHandler(got)
        progress.log.setLevel(level)
    lines = got.lines
    assert any(line.startswith("probing which of") for line in lines), lines
    assert any(line.startswith("measuring ") and "heavy op" in line for line in lines), lines
    assert any(line.startswith("compiling Small with IREE") for line in lines), lines
    assert any(line.startswith("timing ") and "candidates" in line for line in lines), lines
    x = torch.randn(64, 256)
    with torch.no_grad():
        torch.testing.assert_close(cm(x), Small().eval()(x), rtol=1e-5, atol=1e-5)


def test_the_cli_prints_progress_with_elapsed_seconds(tmp_path, monkeypatch, capsys):
    from aot.cli import main
    monkeypatch.setenv("AOT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(progress.log, "handlers", [])
    try:
        assert main(["compile", "custom_op", "-o", str(tmp_path / "c.aot")]) == 0
        err = capsys.readouterr().err
    finally:
        progress.log.handlers = []
        progress.log.propagate = True
        progress.log.setLevel(logging.NOTSET)
    steps = [line for line in err.splitlines() if line.startswith("[aot]") and "s  " in line]
    assert any("compiling" in line and "with IREE" in line for line in steps), err
    seconds = [float(line.split()[1].rstrip("s")) for line in steps]
    assert seconds == sorted(seconds)
