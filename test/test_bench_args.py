"""The benchmarks' venv options (bench/common.py): a venv without `train`, given
or to be built, ends a benchmark before anything runs, with one line naming
the option and exit code 2; and a benchmark's own options, refused the same
way (argparse's usage, then the line). Only the argument handling runs here."""
import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
# The benchmarks that time `train` from venvs (the others take no --ours-venv).
VENV_BENCHMARKS = ["bench_overhead.py", "bench_relay.py", "bench_intermediate.py",
                   "bench_mpi.py"]


def bench(script, *args, python=sys.executable, **env):
    return subprocess.run([python, os.path.join(BENCH, script), *args],
                          env=dict(os.environ, **env), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60)


def one_error_line(result, script):
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""  # nothing was timed, not even the header
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(script + ": error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize("script", VENV_BENCHMARKS)
def test_a_missing_ours_venv_is_one_line(tmp_path, script):
    missing = str(tmp_path / "no-venv")
    line = one_error_line(bench(script, "--ours-venv", missing, "--no-ref"), script)
    assert "--ours-venv %s has no bin/train" % missing in line


@pytest.mark.parametrize("script", VENV_BENCHMARKS)
def test_a_missing_ref_venv_is_one_line_naming_the_script_that_makes_it(tmp_path, script):
    missing = str(tmp_path / "no-ref")
    line = one_error_line(bench(script, "--ours-venv", sys.prefix, "--ref-venv", missing),
                          script)
    assert "--ref-venv %s has no bin/train" % missing in line
    assert "scripts/reference-venv.sh %s" % missing in line and "--no-ref" in line


def test_a_missing_also_venv_is_one_line(tmp_path):
    line = one_error_line(bench("bench_relay.py", "--ours-venv", sys.prefix, "--no-ref",
                                "--also", "before=%s" % tmp_path), "bench_relay.py")
    assert "--also before=%s" % tmp_path in line


def test_an_ours_venv_that_cannot_be_built_is_one_line(tmp_path):
    """Run by a Python without `train`, a benchmark builds its venv under
    $TMPDIR/tt-bench; where that cannot be made, it says so and names
    --ours-venv."""
    python_env = tmp_path / "python-without-train"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(python_env)], check=True)
    (tmp_path / "tt-bench").write_text("a file where the venv's dir would be")
    result = bench("bench_overhead.py", "--no-ref", python=str(python_env / "bin" / "python3"),
                   TMPDIR=str(tmp_path))
    venv = tmp_path / "tt-bench" / "venv"
    assert result.returncode == 2 and result.stdout == "", result.stdout + result.stderr
    notice, error = result.stderr.splitlines()  # what it tried, then why it stopped
    assert notice.startswith("ours: building %s from this working tree" % venv)
    assert error.startswith("bench_overhead.py: error: building %s failed" % venv)
    assert "give --ours-venv DIR" in error


def test_bench_restarts_takes_hosts_runs_and_runners():
    result = bench("bench_restarts.py", "--help")
    assert result.returncode == 0, result.stderr
    for option in ("--hosts", "--runs", "--runners", "--cases", "--timeout", "--crash-after"):
        assert option in result.stdout


@pytest.mark.parametrize("args, option", [
    (["--runners", "torchrun,slurm"], "--runners"),
    (["--hosts", "1,8"], "--hosts"),
    (["--hosts", "two"], "--hosts"),
    (["--cases", "one-node,everything"], "--cases"),
    (["--runs", "0"], "--runs"),
    (["--torchrun-rdzv", "etcd"], "--torchrun-rdzv"),
    (["--crash-after", "-1"], "--crash-after"),
])
def test_bench_restarts_refuses_a_bad_option_before_anything_runs(args, option):
    result = bench("bench_restarts.py", *args)
    assert result.returncode == 2 and result.stdout == "", result.stdout + result.stderr
    last = result.stderr.splitlines()[-1]
    assert last.startswith("bench_restarts.py: error: ") and option in last, result.stderr
