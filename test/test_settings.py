"""One table of every setting (src/training_toolkit/settings.py, issue 41):
every TRAINING_TOOLKIT_* name in src/ is in it and every one it names is
read; docs/settings.md is generated from it; `training-toolkit settings`
and `train` name the closest setting for a misspelt variable."""
import ast
import glob
import json
import os
import re
import subprocess
import sys

from jobs import Job

from training_toolkit import params, settings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "src", "training_toolkit")
NAME = re.compile(r"^TRAINING_TOOLKIT_[A-Z0-9_]+$")
CLI = [sys.executable, "-m", "training_toolkit.cli"]


def literals(paths):
    """Every string literal of the Python files `paths` that is a whole
    TRAINING_TOOLKIT_* name (not docstrings' mentions)."""
    found = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and NAME.match(node.value):
                found.setdefault(node.value, set()).add(os.path.relpath(path, ROOT))
    return found


def src_files():
    return [p for p in glob.glob(os.path.join(SRC, "**", "*.py"), recursive=True)
            if os.path.basename(p) != "settings.py" or os.path.dirname(p) != SRC]


def test_every_name_in_src_is_in_the_table():
    names = {r[settings.NAME] for r in settings.TABLE}
    missing = {n: sorted(where) for n, where in literals(src_files()).items() if n not in names}
    assert not missing, "TRAINING_TOOLKIT_* names read in src/ but not in settings.TABLE " \
                        "(add a row, then run scripts/gen-settings-doc.py): %s" % missing


def test_every_name_in_the_table_is_read():
    read = literals(src_files())
    unread = [r[settings.NAME] for r in settings.TABLE
              if r[settings.NAME].startswith(settings.PREFIX) and r[settings.NAME] not in read]
    assert not unread, "settings.TABLE names variables nothing in src/ reads: %s" % unread
    # The test suite's own switches are read by the tests or the scripts.
    text = ""
    for pattern in ("test/*.py", "scripts/*", ".ci/*"):
        for path in glob.glob(os.path.join(ROOT, pattern)):
            if os.path.isfile(path):
                with open(path, encoding="utf-8", errors="replace") as f:
                    text += f.read()
    unused = [n for n in settings.TEST_SUITE if settings.PREFIX + n not in text]
    assert not unused, unused


def test_each_row_is_well_formed():
    groups = {g for g, _ in settings.GROUPS}
    names = [r[settings.NAME] for r in settings.TABLE]
    assert len(names) == len(set(names)), "a name declared twice"
    assert not set(names) & {settings.PREFIX + n for n in settings.TEST_SUITE}
    for r in settings.TABLE:
        assert len(r) == 8, r
        assert r[settings.TYPE] in ("bool", "int", "float", "str", "choice", "path"), r
        assert r[settings.GROUP] in groups, r
        assert r[settings.MEANING] and "#" in r[settings.DOC], r
        if r[settings.TYPE] == "choice":
            assert r[settings.BOUNDS], r
    # params.setting's numeric settings take their kinds, bounds and defaults from the table.
    for name, (kind, low, high, default) in params.SETTINGS.items():
        r = settings.row(name)
        assert kind is (float if r[settings.TYPE] == "float" else int)
        assert (low, high) == tuple(r[settings.BOUNDS]) and default == r[settings.DEFAULT]


def test_the_checkpoint_drain_has_its_own_name_and_the_old_one_works():
    drain = settings.row(params.CHECKPOINT_DRAIN_ENV)
    assert params.DRAIN_ENV in drain[settings.MEANING]
    from training_toolkit.job.paths import JobPaths
    from training_toolkit.resilience.checkpoint_settings import settings_of

    paths = JobPaths("/nonexistent-job-tree")
    env = {params.CHECKPOINT_S3_URI_ENV: "s3://b/p", params.CHECKPOINT_DIR_ENV: "/tmp/ck"}
    assert settings_of(dict(env, SM_INTERMEDIATE_DRAIN_SECONDS="7"), paths, "algo-1").drain_s == 7
    assert settings_of(dict(env, SM_INTERMEDIATE_DRAIN_SECONDS="7",
                            TRAINING_TOOLKIT_CHECKPOINT_DRAIN_S="3"),
                       paths, "algo-1").drain_s == 3


def test_the_generated_doc_is_current():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gen-settings-doc.py"),
                        "--check"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr


def test_unknown_names_the_closest_setting():
    found = dict(settings.unknown({"TRAINING_TOOLKIT_HANG_TIMEOUT_SS": "5",
                                   "TRAINING_TOOLKIT_RESTARTS": "1",
                                   "TRAINING_TOOLKIT_REQUIRE_SDK": "1",
                                   "TRAINING_TOOLKIT_QQQ": "1", "OTHER": "x"}))
    assert found == {"TRAINING_TOOLKIT_HANG_TIMEOUT_SS": "TRAINING_TOOLKIT_HANG_TIMEOUT_S",
                     "TRAINING_TOOLKIT_QQQ": None}


def test_settings_command_shows_what_is_set_and_warns_for_a_typo(tmp_path):
    job = Job(tmp_path, {"train.py": ""}, hyperparameters={"sagemaker_mpi_enabled": True})
    env = job.env(TRAINING_TOOLKIT_HANG_TIMEOUT_SS="5", TRAINING_TOOLKIT_RESTARTS="2",
                  TRAINING_TOOLKIT_HANG_EXIT_CODE="200",  # its default: not shown
                  TRAINING_TOOLKIT_JOB_SECRET="s3cr3t")
    r = subprocess.run(CLI + ["settings"], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert "TRAINING_TOOLKIT_RESTARTS=2  (environment variable)" in out, r.stdout
    assert "TRAINING_TOOLKIT_JOB_SECRET=***  (environment variable)" in out, r.stdout
    assert not any("HANG_EXIT_CODE" in line for line in out), r.stdout
    assert any(line.startswith("sagemaker_mpi_enabled=true  (hyperparameter")
               for line in out), r.stdout
    warnings = [line for line in r.stderr.splitlines()
                if "TRAINING_TOOLKIT_HANG_TIMEOUT_SS" in line]
    assert len(warnings) == 1 and "did you mean TRAINING_TOOLKIT_HANG_TIMEOUT_S?" in warnings[0], \
        r.stderr


def test_settings_command_refuses_a_bad_value(tmp_path):
    env = dict(os.environ, TRAINING_TOOLKIT_RESTARTS="-1", SAGEMAKER_BASE_DIR=str(tmp_path))
    r = subprocess.run(CLI + ["settings"], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=60)
    assert r.returncode == 78, r.stderr
    assert "TRAINING_TOOLKIT_RESTARTS" in r.stderr


def test_train_warns_once_for_a_misspelt_variable(tmp_path):
    job = Job(tmp_path, {"train.py": "print('plain')\n"})
    r = job.run(env=job.env(TRAINING_TOOLKIT_HANG_TIMEOUT_SS="5"))
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    warnings = [line for line in r.stderr.decode().splitlines()
                if "TRAINING_TOOLKIT_HANG_TIMEOUT_SS" in line]
    assert len(warnings) == 1, r.stderr.decode()
    assert "did you mean TRAINING_TOOLKIT_HANG_TIMEOUT_S?" in warnings[0], warnings
    assert json.loads(job.read("output", "status.json"))["exit_code"] == 0


def test_train_is_silent_without_one(tmp_path):
    job = Job(tmp_path, {"train.py": "print('plain')\n"})
    r = job.run(env=job.env(TRAINING_TOOLKIT_RESTARTS="0"))
    assert r.returncode == 0 and b"names no setting" not in r.stderr, r.stderr.decode()
