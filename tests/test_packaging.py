"""What the installed package holds: everything under ``aot`` (the bundled models and the
bench driver included), no top-level ``models`` or ``benchmarks`` in site-packages."""

import subprocess
import sys


def test_only_aot_is_installed(tmp_path):
    code = ("import importlib.util as u, aot.cli, aot.bench.suite, aot.bench.isolated, aot.models\n"
            "print(u.find_spec('models') is None, u.find_spec('benchmarks') is None,\n"
            "      callable(aot.models.get), 'resnet18_b1' in aot.bench.suite.BENCH_MODELS)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True"] * 4
