#!/usr/bin/env python3
"""Run one training job with a real SageMaker Python SDK in local mode.

    <sdk-venv>/bin/python scripts/sdk_local_driver.py SPEC.json

Run by the python of an SDK venv (SDK v2 `sagemaker==2.257.7`, or SDK v3
`sagemaker-train==1.27.0`), as a subprocess of test/test_sdk_local_mode.py
and bench/bench_sdk_local.py, which give it its environment (DOCKER_HOST,
fake AWS keys and region, a temporary HOME whose SDK defaults config opts out
of telemetry). It imports nothing of this project: it is a user's script.

SPEC (JSON):
  sdk              "v2" (Estimator + LocalSession) or "v3" (ModelTrainer, Mode.LOCAL_CONTAINER)
  image            the training image
  instance_count   hosts
  instance_type    v2: "local"; v3: the Compute's instance type (default "local_cpu")
  root             a fresh directory: v2's local.container_root, v3's local_container_root
  snapshot         where each host's /opt/ml/output is copied before the SDK deletes it
  source_dir, entry_point, hyperparameters, environment, base_job_name
  v2: `distribution` is passed to the Estimator as a user would (the generic
      Estimator ignores it: hyperparameters carry the distribution instead);
      "estimator": "pytorch" makes it the framework estimator
      `sagemaker.pytorch.PyTorch` (with "framework_version" and "py_version";
      it turns `distribution` into its hyperparameters) instead of the generic
      `Estimator`
  v3: "source_code": SourceCode kwargs (source_dir is added), or absent for a
      legacy tree (hyperparameters sagemaker_program and a file://
      sagemaker_submit_directory, no SourceCode);
      "distributed": {"kind": "mpi"|"torchrun", ...kwargs}

The one thing done besides what a user does: the SDK's retrieve_artifacts
(which both SDKs call in a `finally` after compose ends, and after which they
delete the per-host directories) is wrapped to copy each host's output
directory to SPEC.snapshot/<host>/output first, so that the test can read
every host's success/failure/status.json. It changes nothing the SDK does.

Every socket connect and name lookup the SDK's process makes is recorded
with an audit hook (sys.addaudithook sees those of every Python socket,
botocore's and requests' included) and reported, as is every command it runs.

The last line on stdout is `SDK-LOCAL-RESULT <json>`:
  ok, error (the exception's text), error_type, seconds (fit's wall time),
  model_data (v2: estimator.model_data on success), estimator_hyperparameters
  (v2: estimator.hyperparameters() after fit), artifacts (what
  retrieve_artifacts returned), container_root, compose_file, hosts,
  host_outputs {host: snapshot dir}, connects, lookups, commands.
"""
import json
import os
import shutil
import sys
import time
import traceback

MARK = "SDK-LOCAL-RESULT "
connects, lookups, commands = [], [], []


def audit(event, args):
    # Must not raise, and must not open sockets itself.
    try:
        if event == "socket.connect":
            connects.append(repr(args[1]))
        elif event == "socket.getaddrinfo":
            lookups.append(repr(args[:2]))
        elif event == "subprocess.Popen":
            commands.append([str(a) for a in (args[1] or [])]
                            if isinstance(args[1], (list, tuple)) else str(args[1]))
    except Exception:  # noqa: BLE001
        pass


sys.addaudithook(audit)

spec = json.load(open(sys.argv[1]))
result = {"ok": False, "error": None, "error_type": None, "model_data": None,
          "artifacts": None, "container_root": None, "compose_file": None, "hosts": [],
          "host_outputs": {}}


def snapshot_outputs(container, compose_data):
    """Copy each host's /opt/ml/output (a bind mount of a host dir)."""
    result["container_root"] = container.container_root
    result["compose_file"] = os.path.join(container.container_root, "docker-compose.yaml")
    for host, service in compose_data["services"].items():
        result["hosts"].append(host)
        for volume in service["volumes"]:
            host_dir, inside = volume.split(":")[:2]  # HOST:INSIDE[:z]
            if inside == "/opt/ml/output":
                dest = os.path.join(spec["snapshot"], host, "output")
                if os.path.isdir(host_dir):
                    shutil.copytree(host_dir, dest, symlinks=True)
                    result["host_outputs"][host] = dest


def wrap_retrieve(cls):
    real = cls.retrieve_artifacts

    def retrieve_artifacts(self, compose_data, *args, **kwargs):
        try:
            snapshot_outputs(self, compose_data)
        except Exception:  # noqa: BLE001
            result["snapshot_error"] = traceback.format_exc()
        artifacts = real(self, compose_data, *args, **kwargs)
        result["artifacts"] = artifacts
        return artifacts

    cls.retrieve_artifacts = retrieve_artifacts


def run_v2():
    from sagemaker.estimator import Estimator
    from sagemaker.local import LocalSession
    from sagemaker.local.image import _SageMakerContainer

    wrap_retrieve(_SageMakerContainer)
    session = LocalSession()
    session.config = {"local": {"local_code": True, "container_root": spec["root"]}}
    kwargs = {}
    if spec.get("distribution") is not None:
        kwargs["distribution"] = spec["distribution"]
    cls = Estimator
    if spec.get("estimator") == "pytorch":
        from sagemaker.pytorch import PyTorch as cls
        kwargs.update(framework_version=spec["framework_version"], py_version=spec["py_version"])
    estimator = cls(
        image_uri=spec["image"], role="arn:aws:iam::111111111111:role/fake",
        instance_count=spec["instance_count"], instance_type=spec.get("instance_type", "local"),
        sagemaker_session=session, entry_point=spec["entry_point"],
        source_dir=spec["source_dir"], hyperparameters=spec.get("hyperparameters") or {},
        environment=spec.get("environment") or None,
        base_job_name=spec.get("base_job_name"), **kwargs)
    result["distribution_kept"] = getattr(estimator, "distribution", None) is not None
    try:
        estimator.fit(wait=True)
    finally:
        try:
            result["model_data"] = estimator.model_data
        except Exception as e:  # noqa: BLE001
            result["model_data_error"] = "%s: %s" % (type(e).__name__, e)
        try:  # what the estimator made of its arguments (a framework's: `distribution`)
            result["estimator_hyperparameters"] = estimator.hyperparameters()
        except Exception as e:  # noqa: BLE001
            result["estimator_hyperparameters_error"] = "%s: %s" % (type(e).__name__, e)


def run_v3():
    from sagemaker.core.training.configs import Compute, SourceCode
    from sagemaker.train import ModelTrainer
    from sagemaker.train.distributed import MPI, Torchrun
    from sagemaker.train.local.local_container import _LocalContainer
    from sagemaker.train.model_trainer import Mode

    wrap_retrieve(_LocalContainer)
    hps = dict(spec.get("hyperparameters") or {})
    source_code = None
    if spec.get("source_code") is not None:
        source_code = SourceCode(source_dir=spec["source_dir"], **spec["source_code"])
    else:
        hps.setdefault("sagemaker_program", spec["entry_point"])
        hps.setdefault("sagemaker_submit_directory", "file://" + spec["source_dir"])
    distributed = None
    if spec.get("distributed"):
        d = dict(spec["distributed"])
        distributed = {"mpi": MPI, "torchrun": Torchrun}[d.pop("kind")](**d)
    trainer = ModelTrainer(
        training_image=spec["image"], training_mode=Mode.LOCAL_CONTAINER,
        local_container_root=spec["root"],
        compute=Compute(instance_type=spec.get("instance_type", "local_cpu"),
                        instance_count=spec["instance_count"]),
        source_code=source_code, distributed=distributed, hyperparameters=hps,
        environment=spec.get("environment") or None,
        base_job_name=spec.get("base_job_name") or "sdk-local")
    trainer.train(wait=True)


t0 = time.perf_counter()
try:
    {"v2": run_v2, "v3": run_v3}[spec["sdk"]]()
    result["ok"] = True
except BaseException as e:  # noqa: BLE001  (the SDK's verdict, whatever it is)
    result["error"] = str(e)
    result["error_type"] = type(e).__name__
    result["traceback"] = traceback.format_exc()[-4000:]
result["seconds"] = time.perf_counter() - t0
result.update(connects=connects, lookups=lookups, commands=commands)
sys.stdout.flush()
print("\n" + MARK + json.dumps(result), flush=True)
