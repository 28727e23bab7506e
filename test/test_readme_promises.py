"""README promises that no other test exercised (issue 12): SIGINT, the
master-port check, TRAINING_TOOLKIT_CONTROL_PORT, SSH trusting only the
job's hosts, the `smddprun` prefix, where libsmddp is looked for, a code
package that fails to install, `training-toolkit local --hosts N`, and a
framework hook that calls sys.exit. Each runs `train` (or the CLI) as a user
would, except the library search order, a pure function tested directly."""
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys

import psutil
import pytest

from cluster_jobs import ClusterJob, require_cluster
from jobs import Job, wait_for
from training_toolkit.rehearsal.jobtree import write_job_tree



@pytest.fixture(scope="module")
def cluster_supported():
    require_cluster()


# --------------------------------------------------------------------------
# SIGINT is handled like SIGTERM
# --------------------------------------------------------------------------

def test_sigint_stops_the_whole_tree_like_sigterm(tmp_path):
    """Ctrl-C on `train` (SIGINT) reaches the user's process and the child it
    started as SIGTERM, whose handler saves a checkpoint; the job ends as a
    stopped job (143, `failure`, no `success`) with nothing left running."""
    marker = "tt-sigint-%d" % os.getpid()
    worker = """\
    import os, signal, sys, time
    name = sys.argv[1]
    def on_term(signum, frame):
        with open(os.path.join(os.environ["SM_MODEL_DIR"], "saved-" + name), "w") as f:
            f.write(signal.Signals(signum).name)
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    open(os.path.join(os.environ["SM_MODEL_DIR"], "ready-" + name), "w").close()
    time.sleep(300)
    """
    main = """\
    import subprocess, sys
    subprocess.Popen([sys.executable, "worker.py", "child", "%s"])
    sys.argv = ["worker.py", "main"]
    exec(open("worker.py").read())
    """ % marker
    job = Job(tmp_path, {"train.py": main, "worker.py": worker})
    proc = job.popen(job.env(SM_TERMINATION_GRACE_SECONDS=30))
    for name in ("main", "child"):
        wait_for(os.path.join(job.base, "model", "ready-" + name))
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err.decode()[-2000:]
    assert job.read("model", "saved-main") == "SIGTERM"
    assert job.read("model", "saved-child") == "SIGTERM"
    assert "received SIGINT" in err.decode()
    assert job.exists("output", "failure") and not job.exists("output", "success")
    assert [p for p in psutil.process_iter(["cmdline"])
            if marker in " ".join(p.info["cmdline"] or [])] == []


# --------------------------------------------------------------------------
# torchrun: the master port must be free on the master
# --------------------------------------------------------------------------

LISTEN = ("import socket, sys, time\n"
          "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
          "s.bind(('', int(sys.argv[1]))); s.listen(); time.sleep(600)\n")


def occupy(job, host, port):
    """A process in `host` that listens on `port` (ended with the cluster)."""
    proc = job.cluster.popen(host, [sys.executable, "-c", LISTEN, str(port)])
    job.cluster.wait_listening(host, port, proc=proc)
    return proc


@pytest.mark.usefixtures("cluster_supported")
def test_busy_master_port_is_a_config_error_naming_sm_master_port(tmp_path):
    pytest.importorskip("torch")
    from training_toolkit.distributed import Torchrun

    with ClusterJob(tmp_path, 2, {"train.py": "open('/opt/ml/model/ran', 'w').close()\n"},
                    distributed=Torchrun(process_count_per_node=1)) as job:
        occupy(job, "algo-1", 7777)
        job.start(hosts=["algo-1"]).wait(timeout=60)
        assert job.codes() == {"algo-1": 78}, job.runs["algo-1"].err.decode()[-2000:]
        first = job.read("algo-1", "output", "failure").splitlines()[0]
        assert "master port 7777 is not free on algo-1" in first, first
        assert "SM_MASTER_PORT" in first
        assert not job.exists("algo-1", "model", "ran")


# --------------------------------------------------------------------------
# TRAINING_TOOLKIT_CONTROL_PORT moves the control channel
# --------------------------------------------------------------------------

HOSTNAME_PER_RANK = """
import os, socket
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
with open(os.path.join(os.environ["SM_MODEL_DIR"], "rank-%d" % rank), "w") as f:
    f.write(socket.gethostname())
"""

MPI_HPS = {"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 1}


@pytest.mark.usefixtures("cluster_supported")
def test_control_port_comes_from_the_environment(tmp_path):
    """The default control port (7780) is taken on the master by something
    else; with TRAINING_TOOLKIT_CONTROL_PORT set on every host, the job
    forms its cluster on that port and succeeds."""
    with ClusterJob(tmp_path, 2, {"train.py": HOSTNAME_PER_RANK},
                    hyperparameters=MPI_HPS) as job:
        occupy(job, "algo-1", 7780)
        job.start(TRAINING_TOOLKIT_CONTROL_PORT=7791).wait(timeout=120)
        assert job.codes() == {"algo-1": 0, "algo-2": 0}, {
            h: r.err.decode()[-2000:] for h, r in job.runs.items()}
        assert job.read("algo-1", "model", "rank-0") == "algo-1"
        assert job.read("algo-2", "model", "rank-1") == "algo-2"


# --------------------------------------------------------------------------
# SSH: only the job's hosts are trusted
# --------------------------------------------------------------------------

@pytest.mark.usefixtures("cluster_supported")
def test_mpirun_ssh_trusts_only_the_jobs_hosts(tmp_path):
    """A 2-host job on a 3-host network: the known_hosts that mpirun's ssh
    uses (StrictHostKeyChecking=yes) holds the job's worker only, so ssh to
    algo-3, a host outside the job with sshd running, is refused, while ssh
    to the worker algo-2 is accepted."""
    def two_host_job(host, base, hosts):
        write_job_tree(base, "train.py", os.path.join(str(tmp_path), "src"),
                       hyperparameters=MPI_HPS, hosts=hosts[:2], current_host=host,
                       network_interface_name="eth0")

    with ClusterJob(tmp_path, 3, {"train.py": HOSTNAME_PER_RANK},
                    write_tree=lambda host, base, hosts: two_host_job(
                        host if host != "algo-3" else "algo-1", base, hosts)) as job:
        job.start(hosts=["algo-1", "algo-2"]).wait(timeout=120)
        assert job.codes() == {"algo-1": 0, "algo-2": 0}, {
            h: r.err.decode()[-2000:] for h, r in job.runs.items()}
        known_hosts = job.path("algo-1", "toolkit", "known_hosts")
        assert [line.split()[0] for line in open(known_hosts).read().splitlines()] == ["algo-2"]
        # The ssh that mpirun starts (plm_rsh_args), with no machine-wide known hosts.
        argv = shlex.split(json.loads(job.read("algo-1", "output", "status.json"))["command"])
        rsh_args = shlex.split(argv[argv.index("plm_rsh_args") + 1])
        ssh = ["ssh"] + rsh_args + ["-o", "GlobalKnownHostsFile=/dev/null"]
        for host in ("algo-2", "algo-3"):
            job.cluster.start_sshd(host)
        outside = job.cluster.run("algo-1", ssh + ["algo-3", "true"], capture_output=True,
                                  text=True, timeout=30)
        assert outside.returncode == 255
        assert "Host key verification failed" in outside.stderr, outside.stderr
        inside = job.cluster.run("algo-1", ssh + ["algo-2", "hostname"], capture_output=True,
                                 text=True, timeout=30)
        assert inside.returncode == 0 and inside.stdout.strip() == "algo-2", inside.stderr


# --------------------------------------------------------------------------
# SMDDP: the smddprun prefix and where libsmddp is looked for
# (no SMDDP exists here: smddprun is a stand-in script, and the "libraries"
# are copies of a real shared object; both stand for what GPU images ship)
# --------------------------------------------------------------------------

SMDDPRUN = """#!/bin/sh
echo "$OMPI_COMM_WORLD_RANK $*" >> "$SMDDPRUN_LOG"
exec "$@"
"""


def test_smddprun_prefixes_every_rank_when_installed(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "smddprun").write_text(SMDDPRUN)
    (bin_dir / "smddprun").chmod(0o755)
    log = tmp_path / "smddprun.log"
    job = Job(tmp_path, {"train.py": "print('ok')\n"},
              hyperparameters={"sagemaker_distributed_dataparallel_enabled": True,
                               "sagemaker_mpi_num_of_processes_per_host": 2})
    r = job.run(timeout=120, env=job.env(PATH="%s:%s" % (bin_dir, os.environ["PATH"]),
                                         SMDDPRUN_LOG=str(log)))
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert " -- smddprun " in job.status()["command"]
    calls = sorted(log.read_text().splitlines())
    assert [c.split()[0] for c in calls] == ["0", "1"]
    # smddprun runs the rank's own command: the job's Python on the script.
    assert all(os.path.basename(c.split()[1]).startswith("python") and c.endswith(" train.py")
               for c in calls), calls


def test_without_smddprun_the_program_runs_directly(tmp_path):
    job = Job(tmp_path, {"train.py": "print('ok')\n"},
              hyperparameters={"sagemaker_distributed_dataparallel_enabled": True,
                               "sagemaker_mpi_num_of_processes_per_host": 1})
    path = ":".join(d for d in os.environ["PATH"].split(":")
                    if not os.path.exists(os.path.join(d, "smddprun")))
    r = job.run(timeout=120, env=job.env(PATH=path))
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert " -- smddprun " not in job.status()["command"]


@pytest.fixture
def libraries(tmp_path, monkeypatch):
    """Real shared objects named libsmddp.so in dirs a, b (and 'conda', the
    stand-in for /opt/conda/lib), and a non-ELF one in 'fake'."""
    from training_toolkit.runners import smddp

    real = next(p for p in ("/lib/x86_64-linux-gnu/libm.so.6", "/lib64/libm.so.6",
                            "/usr/lib/x86_64-linux-gnu/libm.so.6") if os.path.exists(p))
    out = {}
    for name in ("a", "b", "conda", "override", "fake"):
        d = tmp_path / name
        d.mkdir()
        if name == "fake":
            (d / "libsmddp.so").write_text("not an ELF file")
        else:
            shutil.copy(real, d / "libsmddp.so")
        out[name] = str(d / "libsmddp.so")
    # The default location is fixed (/opt/conda/lib/libsmddp.so); point it at
    # the stand-in rather than writing into /opt on this machine.
    monkeypatch.setattr(smddp, "DEFAULT_LIBRARY", out["conda"])
    monkeypatch.delenv(smddp.LIBRARY_ENV, raising=False)
    return out


def test_library_search_order(libraries, monkeypatch, tmp_path):
    from training_toolkit.runners.smddp import LIBRARY_ENV, find_library

    dirs = lambda *names: ":".join(os.path.dirname(libraries[n]) for n in names)
    monkeypatch.setenv("LD_LIBRARY_PATH", dirs("fake", "a", "b"))
    # 1. $SMDDP_LIBRARY_PATH wins over everything.
    assert find_library({LIBRARY_ENV: libraries["override"]}) == libraries["override"]
    # 2. Then /opt/conda/lib/libsmddp.so, before LD_LIBRARY_PATH.
    assert find_library({}) == libraries["conda"]
    os.unlink(libraries["conda"])
    # 3. Then LD_LIBRARY_PATH in its order, skipping what is not a shared object.
    assert find_library({}) == libraries["a"]
    monkeypatch.setenv("LD_LIBRARY_PATH", dirs("b", "a"))
    assert find_library({}) == libraries["b"]
    # 4. Nothing anywhere (the linker's cache has no libsmddp.so here).
    monkeypatch.setenv("LD_LIBRARY_PATH", dirs("fake"))
    assert find_library({}) is None


# --------------------------------------------------------------------------
# A code package that fails to install
# --------------------------------------------------------------------------

def test_failed_package_install_is_exit_72_naming_the_code_dir(tmp_path):
    setup = """\
    raise SystemExit("this package cannot be built: missing native toolchain")
    """
    job = Job(tmp_path, {"setup.py": setup, "train.py": "open('ran', 'w').close()\n"})
    r = job.run(timeout=300)
    assert r.returncode == 72, r.stderr.decode()[-2000:]
    failure = job.failure()
    first = failure.splitlines()[0]
    assert "pip could not install the package in %s" % job.paths.code_dir in first, first
    assert "exit code: 72" in failure
    assert not os.path.exists(os.path.join(job.paths.code_dir, "ran"))
    assert not job.exists("output", "success")


# --------------------------------------------------------------------------
# training-toolkit local --hosts N
# --------------------------------------------------------------------------

@pytest.mark.usefixtures("cluster_supported")
def test_local_hosts_runs_one_train_per_host(tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(
        "import json, os, socket, sys\n"
        "with open(os.path.join(os.environ['SM_MODEL_DIR'], 'seen.json'), 'w') as f:\n"
        "    json.dump({'host': os.environ['SM_CURRENT_HOST'], 'hostname': socket.gethostname(),\n"
        "               'hosts': json.loads(os.environ['SM_HOSTS']), 'argv': sys.argv[1:]}, f)\n"
        "sys.exit(3 if os.environ['SM_CURRENT_HOST'] == 'algo-2' else 0)\n")
    job_dir = tmp_path / "job"
    r = subprocess.run(["training-toolkit", "local", str(code), "--hp", "epochs=2", "--hosts", "2",
                        "--job-dir", str(job_dir)], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=180)
    err = r.stderr.decode()
    assert r.returncode == 3, err[-2000:]  # the first failing host's code
    for host in ("algo-1", "algo-2"):
        seen = json.loads((job_dir / host / "model" / "seen.json").read_text())
        assert seen == {"host": host, "hostname": host, "hosts": ["algo-1", "algo-2"],
                        "argv": ["--epochs", "2"]}
    # One job: algo-2's failure ends algo-1 too, its `failure` naming algo-2.
    for host in ("algo-1", "algo-2"):
        failure = (job_dir / host / "output" / "failure").read_text()
        assert "exit code 3 on rank 1 on algo-2" in failure.splitlines()[0], failure
    assert "algo-2: failed with exit code 3" in err


@pytest.mark.usefixtures("cluster_supported")
def test_local_hosts_from_a_venv_and_a_checkout_under_tmp(tmp_path):
    """Issue 12, defect 11: the simulated hosts' /tmp is private, yet a venv
    and a checkout of the toolkit under /tmp must stay visible in them (the
    README's commands, run from a clone there). A bare venv whose only
    package is a copy of src/ under /tmp runs `local --hosts 2`."""
    assert str(tmp_path).startswith("/tmp/")
    checkout = tmp_path / "clone" / "src"
    shutil.copytree(os.path.join(os.path.dirname(__file__), "..", "src", "training_toolkit"),
                    checkout / "training_toolkit",
                    ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c",
                           "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          check=True, stdout=subprocess.PIPE, text=True).stdout.strip()
    with open(os.path.join(site, "toolkit-checkout.pth"), "w") as f:
        f.write(str(checkout) + "\n")
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(
        "import os, sys\n"
        "open(os.path.join(os.environ['SM_MODEL_DIR'], 'python'), 'w').write(sys.executable)\n")
    job_dir = tmp_path / "job"
    r = subprocess.run([str(python), "-m", "training_toolkit.cli", "local", str(code),
                        "--hosts", "2", "--job-dir", str(job_dir)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=180,
                       env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    for host in ("algo-1", "algo-2"):
        status = json.loads((job_dir / host / "output" / "status.json").read_text())
        assert status["command"].startswith(str(venv)), status["command"]
        assert (job_dir / host / "model" / "python").read_text().startswith(str(venv))


# --------------------------------------------------------------------------
# A framework hook that calls sys.exit
# --------------------------------------------------------------------------

@pytest.mark.parametrize("arg,code", [("0", 0), ("None", 0), ("3", 3),
                                      ("'cannot go on'", 1)])
def test_framework_hook_calling_sys_exit(tmp_path, arg, code):
    job = Job(tmp_path, {"train.py": "print(1)\n"})
    hook_dir = tmp_path / "hook"
    hook_dir.mkdir()
    (hook_dir / "exiting_hook.py").write_text(
        "import sys\ndef main():\n    sys.exit(%s)\n" % arg)
    r = job.run(env=job.env(SAGEMAKER_TRAINING_MODULE="exiting_hook:main",
                            PYTHONPATH=str(hook_dir)), timeout=60)
    assert r.returncode == code, r.stderr.decode()[-2000:]
    if code == 0:
        assert job.exists("output", "success") and not job.exists("output", "failure")
    else:
        assert not job.exists("output", "success")
        first = job.failure().splitlines()[0]
        assert "the framework hook exited with code %d" % code in first, first
