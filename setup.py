import os

from setuptools import find_packages, setup


def read(name):
    with open(os.path.join(os.path.dirname(__file__), name), encoding="utf-8") as f:
        return f.read()


setup(
    name="training-toolkit",
    version="0.1.0",
    description=("Entrypoint of ML training containers: "
                 "a drop-in for the SageMaker training contract"),
    long_description=read("README.md"),
    long_description_content_type="text/markdown",
    packages=find_packages("src"),
    package_dir={"": "src"},
    # The sitecustomize each rank runs while the hang watchdog is on: a plain
    # directory on the rank's PYTHONPATH, not a package.
    # So is the `sagemaker_training` package a user's process imports (import_alias.py).
    package_data={"training_toolkit.resilience": ["boot/sitecustomize.py"],
                  "training_toolkit": ["import_alias_path/sagemaker_training/__init__.py"]},
    python_requires=">=3.9",
    install_requires=[
        "boto3",       # S3: code fetch (s3:// code), intermediate output (sagemaker_s3_output) and
                       # checkpoints (TRAINING_TOOLKIT_CHECKPOINT_S3_URI), imported only then;
                       # uploads and restores use its transfer manager (s3transfer)
        # Intermediate output and checkpoints: inotify for the watch of their trees, imported
        # only when they are synced. A thin ctypes wrapper (the reference's choice), no new
        # C code of ours; watchdog would bring threads and polling we do not need.
        "inotify_simple>=1.2",
        # Code fetch: ISA-L's gzip (igzip) decompresses code archives several times faster than
        # zlib (docs/benchmarks.md, "Code fetch"); imported only to extract a .tar.gz, and the
        # standard gzip module is used where it is missing.
        "isal",
        "retrying",    # imported by framework hooks (the DLC toolkits) that run on the toolkit
    ],
    # pytest 8.2: reads the README's light tests from a file (`pytest @test/light-tests.txt`);
    # psutil: the tests prove no process outlives a job; six: the real DLC hook imports it;
    # scipy: the encoders' tests write sparse matrices as recordio-protobuf (the encoders
    # import numpy when called, scipy never: sparse input comes with it); protobuf: as below;
    # pytest-timeout: a multi-host or control-channel test that hangs fails (with every
    # thread's stack) instead of holding the run until CI's own limit (test/conftest.py);
    # import-linter: `lint-imports` checks the layers of docs/architecture.md (the contracts in
    # pyproject.toml; test/test_architecture.py), 2.17 for its acyclic_siblings contract, which
    # needs Python 3.11 (that test skips on older Pythons); wheel: the install tests build a
    # user's package offline without build isolation, where a venv's own setuptools (65 in
    # Python 3.11's ensurepip) has no bdist_wheel without it; pytest-xdist: CI runs the suite
    # as two streams, one per core (`-n 2 --dist loadgroup`, test/conftest.py), in a quarter
    # less time than one.
    extras_require={"test": ["pytest>=8.2", "moto[server]", "hypothesis", "numpy", "mpi4py",
                             "psutil", "six", "scipy", "protobuf", "pytest-timeout>=2.1",
                             "import-linter>=2.17; python_version >= '3.11'", "wheel",
                             "pytest-xdist>=3.5"],
                    # recordio-protobuf only (record_pb2's messages, used by recordio and
                    # encoders.array_to_recordio_protobuf, imported only then): the Record
                    # classes are protobuf's own; the reference depends on protobuf too.
                    "recordio": ["protobuf"],
                    # `training-toolkit timeline --out F.png`; SVG needs nothing.
                    "png": ["cairosvg"]},
    entry_points={
        "console_scripts": [
            "train=training_toolkit.__main__:main",
            "training-toolkit=training_toolkit.cli:console_main",
        ]
    },
    # python_requires and these: the versions CI runs (.ci/run): the default python3 (3.11)
    # and scripts/python-legs.sh's venvs (3.9 and 3.13 in full, 3.12 its multi-host jobs).
    classifiers=["Programming Language :: Python :: 3",
                 "Programming Language :: Python :: 3.9",
                 "Programming Language :: Python :: 3.11",
                 "Programming Language :: Python :: 3.12",
                 "Programming Language :: Python :: 3.13",
                 "Operating System :: POSIX :: Linux"],
)
