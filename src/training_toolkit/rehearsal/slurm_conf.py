"""What the Slurm daemons on the simulated hosts run with (slurm.py): the
programs and where Debian puts them, the directory of a cluster under
``/run``, and its ``slurm.conf``.

A cluster's directory is ``RUN_DIR/tt-slurm-<SimCluster prefix>-<cluster
name>`` (a path every host sees: their ``/tmp`` is private); it holds
``slurm.conf``, the munge key and socket, the daemons' state, spool, pid and
log files. Standard library only.
"""
import os
import shutil

RUN_DIR = "/run"
DIR_PREFIX = "tt-slurm-"   # RUN_DIR/tt-slurm-<SimCluster prefix>-<cluster name>
CONTROLLER_NAME = "slurmctl"
# Where Debian puts the daemons; PATH may lack the sbin directories.
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin",
                               "/usr/local/sbin"])
PROGRAMS = (("munged", "munge"), ("slurmctld", "slurmctld"), ("slurmd", "slurmd"),
            ("srun", "slurm-client"), ("sbatch", "slurm-client"), ("scancel", "slurm-client"),
            ("squeue", "slurm-client"), ("scontrol", "slurm-client"), ("sinfo", "slurm-client"))


def which(prog):
    return shutil.which(prog, path=SEARCH_PATH)


def cluster_dir(sim_prefix, cluster_name):
    """The directory of the Slurm cluster ``cluster_name`` over the simulated
    cluster ``sim_prefix``."""
    return os.path.join(RUN_DIR, "%s%s-%s" % (DIR_PREFIX, sim_prefix, cluster_name))


def conf_text(d, cluster_name, controller_name, controller_address, munge_socket, nodes, cpus,
              kill_wait_s, cred_expire_s, debug, extra_conf):
    """A slurm.conf for the cluster whose directory is ``d``: ``nodes`` is
    [(host, address)], each with ``cpus`` CPUs; ``extra_conf``, more lines,
    appended (a later line wins)."""
    lines = [
        "# written by training_toolkit.rehearsal.slurm for simulated hosts",
        "ClusterName=%s" % cluster_name,
        "SlurmctldHost=%s(%s)" % (controller_name, controller_address),
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        "AuthInfo=socket=%s%s" % (munge_socket, "" if cred_expire_s is None
                                  else ",cred_expire=%d" % cred_expire_s),
        "StateSaveLocation=%s" % os.path.join(d, "state"),
        "SlurmctldPidFile=%s" % os.path.join(d, "slurmctld.pid"),
        "SlurmctldLogFile=%s" % os.path.join(d, "log", "slurmctld.log"),
        "SlurmdSpoolDir=%s" % os.path.join(d, "spool", "slurmd.%n"),
        "SlurmdPidFile=%s" % os.path.join(d, "slurmd.%n.pid"),
        "SlurmdLogFile=%s" % os.path.join(d, "log", "slurmd.%n.log"),
        "SlurmctldDebug=%s" % debug,
        "SlurmdDebug=%s" % debug,
        "SlurmdParameters=config_overrides",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "ReturnToService=2",
        "KillWait=%d" % kill_wait_s,
        "InactiveLimit=0",
        "MinJobAge=300",
        "SlurmdTimeout=60",
        # The main scheduling loop every 2 s, not 60: a requeued job starts
        # again once its begin time (cred_expire) passes, not up to a minute later.
        "SchedulerParameters=sched_interval=2",
    ]
    for host, address in nodes:
        lines.append("NodeName=%s NodeAddr=%s CPUs=%d State=UNKNOWN" % (host, address, cpus))
    lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    lines += extra_conf
    return "\n".join(lines) + "\n"

