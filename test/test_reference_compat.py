"""Our sagemaker_training-compatible modules against the reference toolkit
(sagemaker-training 5.1.4), on the same inputs.

Each check is one snippet of Python run twice: in the reference's venv (a
subprocess, with PKG = "sagemaker_training") and here, in-process (PKG =
"training_toolkit"). Inputs travel to the subprocess pickled, results come
back as JSON, and both results must be equal.

The reference's interpreter is $TRAINING_TOOLKIT_REFERENCE_PYTHON, else
/opt/sagemaker-training-reference/bin/python (made by
scripts/reference-venv.sh). Without one the module is skipped, unless
TRAINING_TOOLKIT_REQUIRE_REFERENCE=1.

The reference's environment module creates directories when imported, so the
subprocess always gets SAGEMAKER_BASE_DIR, a job tree of its own.
"""
import json
import os
import pickle
import subprocess
import sys
import tarfile
import textwrap

import pytest

from s3_fixtures import make_tar_gz, upload

DEFAULT_REFERENCE_PYTHON = "/opt/sagemaker-training-reference/bin/python"
REFERENCE_PYTHON = os.environ.get("TRAINING_TOOLKIT_REFERENCE_PYTHON") or DEFAULT_REFERENCE_PYTHON

if not os.access(REFERENCE_PYTHON, os.X_OK):
    why = ("no reference interpreter at %s (set TRAINING_TOOLKIT_REFERENCE_PYTHON or run "
           "scripts/reference-venv.sh)" % REFERENCE_PYTHON)
    if os.environ.get("TRAINING_TOOLKIT_REQUIRE_REFERENCE") == "1":
        raise RuntimeError(why + ", and TRAINING_TOOLKIT_REQUIRE_REFERENCE=1")
    pytest.skip(why, allow_module_level=True)

# Defined on both sides before each snippet.
PRELUDE = '''
import importlib, os, sys

def load(name):
    return importlib.import_module(PKG + "." + name)

def attempt(fn, *args, **kwargs):
    """fn's value, or the name and text of what it raised."""
    try:
        return {"value": fn(*args, **kwargs)}
    except Exception as e:
        return {"raised": type(e).__name__, "str": str(e)}

def tree(root):
    """relative path -> kind and contents, for comparing directories."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                out[rel] = ["link", os.readlink(path)]
            elif os.path.isdir(path):
                out[rel] = ["dir"]
            else:
                with open(path, "rb") as f:
                    data = f.read()
                out[rel] = ["file", data.decode("latin1"), bool(os.stat(path).st_mode & 0o100)]
    return out
'''

# Runs in the reference's interpreter: (source, inputs) pickled on stdin, the
# result as JSON to the file named by argv[1].
DRIVER = '''
import json, pickle, sys
source, inputs = pickle.loads(sys.stdin.buffer.read())
namespace = {"PKG": "sagemaker_training", "INPUTS": inputs}
exec(source, namespace)
with open(sys.argv[1], "w") as f:
    json.dump(namespace["result"], f, default=repr)
'''


def job_tree(root):
    """A minimal job tree (what the reference's environment module expects)."""
    for d in ("input/config", "input/data", "code", "model", "output/data"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    for name in ("hyperparameters.json", "inputdataconfig.json"):
        with open(os.path.join(root, "input/config", name), "w") as f:
            f.write("{}")
    with open(os.path.join(root, "input/config/resourceconfig.json"), "w") as f:
        json.dump({"current_host": "algo-1", "hosts": ["algo-1"]}, f)
    return str(root)


def as_json(value):
    return json.loads(json.dumps(value, default=repr))


@pytest.fixture
def both(tmp_path, monkeypatch):
    """run(snippet, inputs) -> (reference result, our result). Each side has
    its own job tree as SAGEMAKER_BASE_DIR; `extra_env` goes to both."""
    ref_base = job_tree(tmp_path / "ref")
    our_base = job_tree(tmp_path / "ours")

    def run(snippet, inputs=None, extra_env=None):
        source = PRELUDE + textwrap.dedent(snippet)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        env.update(extra_env or {}, SAGEMAKER_BASE_DIR=ref_base)
        out = tmp_path / "ref-result.json"
        proc = subprocess.run([REFERENCE_PYTHON, "-c", DRIVER, str(out)],
                              input=pickle.dumps((source, inputs)), env=env, cwd=str(tmp_path),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
        assert proc.returncode == 0, proc.stdout.decode(errors="replace")[-3000:]
        with open(out) as f:
            ref = json.load(f)
        for key, value in (extra_env or {}).items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("SAGEMAKER_BASE_DIR", our_base)
        namespace = {"PKG": "training_toolkit", "INPUTS": inputs}
        exec(source, namespace)
        return ref, as_json(namespace["result"])

    return run


MAPPINGS = [
    {},
    {"model_dir": "/opt/ml/model", "batch_size": 25},
    {"lr": 0.001, "big": 1e20, "neg": -3, "zero": 0, "negzero": -0.0, "third": 1 / 3},
    {"nan": float("nan"), "inf": float("inf"), "minf": float("-inf")},
    {"flag": True, "off": False, "none": None},
    {"d": {"b": 2, "a": 1}, "nested": {"x": {"y": [1, 2]}, "u": "é"}},
    {"lst": [1, "two", None, True, 2.5], "tpl": (1, 2), "empty_list": [], "empty_dict": {}},
    {"bytes": b"\xff\x00abc", "ubytes": "héllo".encode("utf-8"), "empty_bytes": b""},
    {"unicode": "héllo wörld", "cjk": "日本語", "emoji": "\U0001F600", "empty": ""},
    {"a": 1, "b": "x", "z": None, "ab": 2, "A": 3},
    {"with-dash": "v", "with space": "v v", "UPPER": "u", "mixed_Case": 1},
    {"": "empty key", "k": ""},
    {1: "int key", 2.5: "float key"},
    {b"bk": b"bv", b"x": 1},
    {"dict_with_none": {"a": None, "b": b"z", "c": [1]}},
    {"quote": 'he said "hi"', "newline": "a\nb", "backslash": "a\\b"},
    {"mixed": 1, 2: "mixed key types"},
]


def test_to_env_vars_matches(both):
    ref, ours = both('''
        mapping = load("mapping")
        result = [attempt(mapping.to_env_vars, m) for m in INPUTS]
    ''', MAPPINGS)
    assert ours == ref


def test_to_cmd_args_matches(both):
    ref, ours = both('''
        mapping = load("mapping")
        result = [attempt(mapping.to_cmd_args, m) for m in INPUTS]
    ''', MAPPINGS)
    assert ours == ref
    # One-letter keys get one dash, dicts become k=v lists, bools stay Python's.
    assert ours[9]["value"][:2] == ["-A", "3"]
    assert ours[5]["value"][:2] == ["-d", "a=1,b=2"]


def test_decode_matches(both):
    ref, ours = both('''
        mapping = load("mapping")
        result = [attempt(mapping._decode, v) for v in INPUTS]
    ''', [None, b"\xe9t\xe9", "ünï", 1, 2.5, True, [1, "a"], {"a": 1}, (1,), b""])
    assert ours == ref


def test_split_by_criteria_matches(both):
    d = {"sagemaker_program": "t.py", "lr": 1, "sagemaker_mpi_enabled": True, "epochs": 3,
         "_tuning_objective_metric": "m", "sm": None}
    cases = [
        (d, None, None), (d, ["lr"], None), (d, ("lr", "missing"), None), (d, {"epochs"}, None),
        (d, None, "sagemaker_"), (d, ["lr", "sagemaker_program"], "sagemaker_"), (d, [], ""),
        (d, None, "sm"), ({}, ["a"], "b"), (d, list(d), None),
    ]
    ref, ours = both('''
        mapping = load("mapping")
        result = []
        for dictionary, keys, prefix in INPUTS:
            split = mapping.split_by_criteria(dictionary, keys, prefix=prefix)
            # Items as lists: the order counts too.
            result.append([type(split).__name__, list(split._fields),
                           list(split.included.items()), list(split.excluded.items())])
        result.append(list(mapping.SplitResultSpec._fields))
    ''', cases)
    assert ours == ref


MAPPING_MIXIN = '''
    import collections.abc
    mapping = load("mapping")

    class Thing(mapping.MappingMixin):
        plain = "not a property"

        def __init__(self):
            self.attribute = "an attribute"

        @property
        def b(self):
            return 2

        @property
        def a(self):
            return {"nested": [1, 2]}

        @property
        def _private(self):
            return "private"

        @property
        def c_none(self):
            return None

        def method(self):
            return "method"

        @classmethod
        def klass(cls):
            return "classmethod"

    class Child(Thing):
        @property
        def z(self):
            return "child"

    thing, child = Thing(), Child()
    result = {
        "properties": thing.properties(),
        "child_properties": child.properties(),
        "len": len(thing),
        "iter": list(thing),
        "dict": dict(thing),
        "str": str(thing),
        "keys": list(thing.keys()),
        "items": [list(item) for item in thing.items()],
        "values": list(thing.values()),
        "getitem": thing["b"],
        "get_property": thing.get("a"),
        "contains": "a" in thing,
        "equal_to_dict": thing == dict(thing),
        "is_mapping": isinstance(thing, collections.abc.Mapping),
        "plain": attempt(thing.__getitem__, "plain"),
        "method": attempt(thing.__getitem__, "method"),
        "klass": attempt(thing.__getitem__, "klass"),
        "hashable": attempt(hash, thing),
    }
'''


def test_mapping_mixin_matches(both):
    ref, ours = both(MAPPING_MIXIN)
    assert ours == ref
    assert ours["properties"] == ["_private", "a", "b", "c_none"]


def test_mapping_mixin_missing_key_is_a_key_error(both):
    """Kept difference: for a name the class lacks altogether, the reference
    raises AttributeError (so `in` and `.get` raise too); ours KeyError, as a
    Mapping should."""
    ref, ours = both(MAPPING_MIXIN + '''
    result = {"missing": attempt(thing.__getitem__, "missing"),
              "get": attempt(thing.get, "missing", "default"),
              "in": attempt(lambda: "missing" in thing)}
    ''')
    assert ref["missing"]["raised"] == "AttributeError"
    assert ours["missing"]["raised"] == "KeyError"
    assert ours["get"] == {"value": "default"} and ours["in"] == {"value": False}


FUNCTIONS = '''
    import collections, functools, inspect
    if PKG == "sagemaker_training" and not hasattr(inspect, "ArgSpec"):
        # What Python < 3.11 had: the reference needs it (see the next test).
        inspect.ArgSpec = collections.namedtuple("ArgSpec", "args varargs keywords defaults")
    functions = load("functions")

    def plain(channel_dirs, model_dir): pass
    def defaults(a, b=1, c="x"): pass
    def star(a, *rest): pass
    def kwargs(a, **options): pass
    def kwonly(a, *, b, c=3): pass
    def nothing(): pass

    class Callable:
        def __init__(self, model_dir, lr=0.1): pass
        def method(self, epochs, lr): pass
        @staticmethod
        def static(epochs): pass

    d = {"channel_dirs": {}, "model_dir": "/opt/ml/model", "other": None, "a": 1, "b": 2,
         "c": 3, "epochs": 10, "lr": 0.5, "self": "s"}
    fns = [plain, defaults, star, kwargs, kwonly, nothing, Callable, Callable("m").method,
           Callable.method, Callable.static, lambda model_dir, a=2: None,
           functools.partial(defaults, 0)]
    result = {
        "matching": [attempt(functions.matching_args, fn, d) for fn in fns],
        "argspec": [attempt(lambda: list(functions.getargspec(fn))) for fn in fns],
        "kwargs_is_same_dict": functions.matching_args(kwargs, d) is d,
        "argspec_fields": list(functions.getargspec(plain)._fields),
    }
'''


def test_functions_match(both):
    ref, ours = both(FUNCTIONS)
    assert ours == ref
    assert ours["matching"][0] == {"value": {"channel_dirs": {}, "model_dir": "/opt/ml/model"}}
    assert ours["kwargs_is_same_dict"] is True


def test_reference_getargspec_fails_on_this_python(both):
    """Kept difference: the reference builds inspect.ArgSpec, gone since
    Python 3.11, so its getargspec and matching_args raise; ours work."""
    ref, ours = both('''
        functions = load("functions")
        def f(a, b=1): pass
        result = [attempt(lambda: list(functions.getargspec(f))),
                  attempt(functions.matching_args, f, {"a": 1, "z": 2})]
    ''')
    if sys.version_info >= (3, 11):
        assert ref[0]["raised"] == "AttributeError" and ref[1]["raised"] == "AttributeError"
    assert ours == [{"value": [["a", "b"], None, None, [1]]}, {"value": {"a": 1}}]


def test_error_wrapper_matches(both):
    ref, ours = both('''
        functions, errors = load("functions"), load("errors")
        def ok(x, y=2): return x + y
        def boom(x): raise ValueError("bad %s" % x)
        result = []
        for cls in (errors.ClientError, errors.ImportModuleError, RuntimeError):
            wrapped = functions.error_wrapper(boom, cls)
            try:
                wrapped(7)
            except Exception as e:
                result.append([type(e).__name__, str(e), type(e.__context__).__name__,
                               e.__traceback__ is not None])
        result.append(functions.error_wrapper(ok, errors.ClientError)(1, y=5))
    ''')
    assert ours == ref


def test_params_constants_match(both):
    ref, ours = both('''
        params = load("params")
        result = {k: v for k, v in vars(params).items() if k.isupper() and not k.startswith("_")}
        modules = load("modules")
        result["modules.DEFAULT_MODULE_NAME"] = modules.DEFAULT_MODULE_NAME
        result["modules.CA_REPOSITORY_ARN_ENV"] = modules.CA_REPOSITORY_ARN_ENV
    ''')
    assert len(ref) > 30
    missing = sorted(set(ref) - set(ours))
    assert not missing, "names of sagemaker_training.params we lack: %s" % missing
    different = {k: (ref[k], ours[k]) for k in ref if ours[k] != ref[k]}
    assert not different, "(reference, ours): %s" % different


ERRORS = '''
    import inspect
    errors = load("errors")
    names = sorted(n for n, c in vars(errors).items()
                   if inspect.isclass(c) and issubclass(c, BaseException)
                   and c.__module__ == errors.__name__)
    # Which of the reference's classes derive from which (ours may add bases).
    subclass_of = {n: sorted(m for m in names if m != n
                             and issubclass(getattr(errors, n), getattr(errors, m)))
                   for n in names}
    shapes = [
        (["python", "train.py", "--lr", "1"], 1, "Traceback...\\ngloo::EnforceNotMet here\\n"),
        ("pip install .", 2, b"ERROR: no such package \\xc3\\xa9\\n", "some info"),
        (["x"], 137, None, "OutOfMemory: Process killed by SIGKILL (signal 9)"),
        (["x"], None),
        (["x"], 3, ""),
    ]
    called = []
    for cls in ("ExecuteUserScriptError", "InstallModuleError", "InstallRequirementsError",
                "_CalledProcessError"):
        for shape in shapes:
            err = getattr(errors, cls)(*shape)
            called.append([str(err), str(err.return_code), err.cmd,
                           err.output.decode() if isinstance(err.output, bytes) else err.output,
                           err.extra_info, isinstance(err, errors.ClientError)])
        err = getattr(errors, cls)(cmd=["c"], return_code=4, output="out", info="i")
        called.append(str(err))
    unsupported = errors.UnsupportedFormatError("application/x-npy")
    result = {
        "subclass_of": subclass_of,
        "called": called,
        "channel": str(errors.ChannelDoesNotExistError("train")),
        "unsupported_names_type": "application/x-npy" in str(unsupported)
                                  and "application/x-npy" in unsupported.message,
        "client": [str(errors.ClientError("plain")), str(errors.ClientError(ValueError("v"))),
                   str(errors.ImportModuleError(ImportError("no module")))],
        "compiler": str(errors.SMTrainingCompilerConfigurationError("bad config")),
    }
'''


def test_errors_match(both):
    ref, ours = both(ERRORS)
    for name, bases in ref["subclass_of"].items():
        assert name in ours["subclass_of"], name
        assert set(bases) <= set(ours["subclass_of"][name]), name
    for key in ("called", "channel", "unsupported_names_type", "client", "compiler"):
        assert ours[key] == ref[key], key
    assert "gloo::EnforceNotMet" in ours["called"][0][0]


def test_write_failure_and_success_files_match(both):
    ref, ours = both('''
        files = load("files")
        output = os.path.join(os.environ["SAGEMAKER_BASE_DIR"], "output")

        def read(name):
            path = os.path.join(output, name)
            return open(path).read() if os.path.exists(path) else None

        files.write_success_file()
        files.write_failure_file("first reason")
        files.write_failure_file("second reason")
        result = {"success": read("success"), "failure": read("failure")}
        os.remove(os.path.join(output, "failure"))
        with open(os.path.join(output, "failure"), "w") as f:
            f.write("the user's own reason")
        files.write_failure_file("ours")
        result["user_failure"] = read("failure")
    ''')
    assert ours == ref == {"success": "", "failure": "first reason",
                           "user_failure": "the user's own reason"}


def test_small_file_helpers_match(both):
    ref, ours = both('''
        files = load("files")
        base = os.environ["SAGEMAKER_BASE_DIR"]
        path = os.path.join(base, "f.txt")
        files.write_file(path, "héllo\\n")
        files.write_file(path + ".bin", b"\\x00\\xff", mode="wb")
        files.write_file(os.path.join(base, "d.json"), '{"a": [1, 2]}')
        with files.tmpdir(prefix="pre", suffix="suf") as tmp:
            made = [os.path.isdir(tmp), os.path.basename(tmp).startswith("pre"),
                    tmp.endswith("suf")]
        with files.tmpdir(directory=base) as tmp2:
            inside = os.path.dirname(tmp2) == base
        result = {"read": files.read_file(path), "bin": list(files.read_file(path + ".bin", "rb")),
                  "json": files.read_json(os.path.join(base, "d.json")), "tmp": made,
                  "removed": not os.path.exists(tmp), "inside": inside,
                  "s3_only": attempt(files.s3_download, "https://bucket/key", "/tmp/x")["raised"]}
    ''')
    assert ours == ref


@pytest.fixture
def sources(tmp_path):
    """A code dir and archives of it, shared (read-only) by both sides."""
    src = tmp_path / "src"
    (src / "pkg" / "sub").mkdir(parents=True)
    (src / "empty_dir").mkdir()
    (src / "train.py").write_text("print('hi')\n")
    (src / "run.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(src / "run.sh", 0o755)
    (src / "pkg" / "__init__.py").write_text("")
    (src / "pkg" / "sub" / "data.bin").write_bytes(bytes(range(256)) * 10)
    (src / "ünïcode name.txt").write_text("ü\n")
    (src / "requirements.txt").write_text("six\n")
    archive = tmp_path / "sourcedir.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for entry in sorted(os.listdir(src)):
            tar.add(src / entry, arcname=entry)
        link = tarfile.TarInfo("pkg/link_to_train")
        link.type, link.linkname = tarfile.SYMTYPE, "../train.py"
        tar.addfile(link)
    flat = tmp_path / "flat.tar.gz"
    make_tar_gz(flat, {"a.py": b"A = 1\n", "dir/b.py": b"B = 2\n"})
    other = tmp_path / "script.py"
    other.write_text("print('a lone script')\n")
    return {"dir": str(src), "tar": str(archive), "flat": str(flat), "file": str(other)}


DOWNLOAD = '''
    files = load("files")
    base = os.environ["SAGEMAKER_BASE_DIR"]
    result = {}
    for label, uri in sorted(INPUTS.items()):
        dest = os.path.join(base, "dest", label)  # missing: download_and_extract creates it
        outcome = attempt(files.download_and_extract, uri, dest)
        result[label] = [outcome, tree(dest) if os.path.isdir(dest) else None]
    busy = os.path.join(base, "busy")
    os.makedirs(busy)
    open(os.path.join(busy, "keep.py"), "w").close()
    files.download_and_extract(INPUTS["tar"], busy)
    result["not_empty"] = tree(busy)
    result["same_dir"] = attempt(files.download_and_extract, os.path.join(base, "dest", "dir"),
                                 os.path.join(base, "dest", "dir"))
'''


def test_download_and_extract_local_matches(both, sources):
    ref, ours = both(DOWNLOAD, sources)
    assert ours == ref
    assert ours["tar"][1]["pkg/link_to_train"] == ["link", "../train.py"]
    assert ours["dir"][1]["run.sh"][2] is True
    assert ours["file"][1] == {"script.py": ["file", "print('a lone script')\n", False]}
    assert ours["not_empty"] == {"keep.py": ["file", "", False]}


def test_download_and_extract_and_s3_download_from_s3_match(both, sources, s3_server):
    uri = upload(s3_server, "compat", "job/sourcedir.tar.gz", open(sources["tar"], "rb").read())
    ref, ours = both('''
        files = load("files")
        base = os.environ["SAGEMAKER_BASE_DIR"]
        dest = os.path.join(base, "code-from-s3")
        files.download_and_extract(INPUTS, dest)
        files.s3_download(INPUTS, os.path.join(base, "object.tar.gz"))
        with open(os.path.join(base, "object.tar.gz"), "rb") as f:
            size = len(f.read())
        result = {"tree": tree(dest), "size": size}
    ''', uri, extra_env={"S3_ENDPOINT_URL": s3_server, "AWS_REGION": "us-east-1"})
    assert ours == ref
    assert ours["size"] == os.path.getsize(sources["tar"])


def test_prepare_matches(both):
    ref, ours = both('''
        import ast, configparser
        modules = load("modules")
        base = os.environ["SAGEMAKER_BASE_DIR"]
        code = os.path.join(base, "prepared")
        os.makedirs(code)
        open(os.path.join(code, "my_mod.py"), "w").write("VALUE = 1\\n")
        modules.prepare(code, "my_mod")
        setup = ast.parse(open(os.path.join(code, "setup.py")).read())
        imports = [[n.module, [a.name for a in n.names]] for n in ast.walk(setup)
                   if isinstance(n, ast.ImportFrom)]
        calls = [n for n in ast.walk(setup) if isinstance(n, ast.Call)]
        setup_kwargs = {k.arg: ast.literal_eval(k.value) for k in calls[0].keywords}
        cfg = configparser.ConfigParser()
        cfg.read(os.path.join(code, "setup.cfg"))
        manifest = [line.split() for line in open(os.path.join(code, "MANIFEST.in"))
                    if line.strip()]
        kept = os.path.join(base, "has_setup")
        os.makedirs(kept)
        open(os.path.join(kept, "setup.py"), "w").write("# the user's\\n")
        modules.prepare(kept, "other")
        result = {
            "files": sorted(os.listdir(code)),
            "imports": imports,
            "setup_call": calls[0].func.id,
            "setup_kwargs": setup_kwargs,
            "setup_cfg": {s: dict(cfg[s]) for s in cfg.sections()},
            "manifest": manifest,
            "kept": [sorted(os.listdir(kept)), open(os.path.join(kept, "setup.py")).read()],
            "has_requirements": [modules.has_requirements(code), modules.has_requirements(kept)],
            "exists": [modules.exists("json"), modules.exists("no_such_module_xyz")],
        }
    ''')
    assert ours == ref
    assert ours["setup_kwargs"]["name"] == "my_mod"


# Environment() on the same job tree: the properties and exported variables
# of the reference, for the resource configs real clients write.
ENVIRONMENT_SNIPPET = '''
import json
base = os.environ["SAGEMAKER_BASE_DIR"]
for name, doc in INPUTS.items():
    with open(os.path.join(base, "input", "config", name), "w") as f:
        json.dump(doc, f)
environment = load("environment")
env = environment.Environment()
props = {p: getattr(env, p) for p in env.properties()}
result = json.loads(json.dumps({"properties": props, "env_vars": env.to_env_vars(),
                                "cmd_args": env.to_cmd_args()}, default=repr)
                    .replace(base, "<BASE>"))
'''

REAL_RC = {"current_host": "algo-2", "current_instance_type": "ml.p4d.24xlarge",
           "current_group_name": "homogeneousCluster", "hosts": ["algo-1", "algo-2"],
           "instance_groups": [{"instance_group_name": "homogeneousCluster",
                                "instance_type": "ml.p4d.24xlarge", "hosts": ["algo-1", "algo-2"]}],
           "network_interface_name": "eth0"}
HETERO_RC = {"current_host": "algo-3", "current_instance_type": "ml.c5.xlarge",
             "current_group_name": "data", "hosts": ["algo-1", "algo-2", "algo-3"],
             "instance_groups": [
                 {"instance_group_name": "train", "instance_type": "ml.p4d.24xlarge",
                  "hosts": ["algo-1", "algo-2"]},
                 {"instance_group_name": "data", "instance_type": "ml.c5.xlarge",
                  "hosts": ["algo-3"]}],
             "network_interface_name": "eth0"}
ENCODED_HPS = {"sagemaker_program": '"train.py"', "sagemaker_submit_directory": '"s3://b/k.tar.gz"',
               "sagemaker_region": '"us-west-2"', "epochs": "3", "lr": "0.1", "name": '"abc"',
               "with-dash": '"x"', "layers": "[1, 2]", "raw": "not json",
               # A mixed set: the argv must be the reference's (True, [1, 2], k=v pairs,
               # -k for one letter), and a tuning trial's static sagemaker_job_name
               # must not be the job's name (TRAINING_JOB_NAME is).
               "flag": "true", "off": "false", "d": '{"k": "v", "a": 1}', "b": "7",
               "nested": '{"x": [1, {"y": null}]}', "none": "null",
               "sagemaker_job_name": '"tuning-job-static"',
               "sagemaker_mpi_enabled": "true", "sagemaker_distribution_instance_groups":
               '["train"]'}
# Where we differ on purpose (docs/compatibility.md): is_modelparallel_enabled is a
# bool (the reference returns the variable's value or None); SM_TRAINING_ENV holds
# more fields; the toolkit exports more variables than the reference.
MORE_FIELDS = {"SM_TRAINING_ENV"}


@pytest.mark.parametrize("documents", [
    {"resourceconfig.json": {"current_host": "algo-1", "hosts": ["algo-1"]},
     "hyperparameters.json": {"sagemaker_program": '"train.py"', "epochs": "3"},
     "inputdataconfig.json": {}},
    {"resourceconfig.json": REAL_RC, "hyperparameters.json": {
        k: v for k, v in ENCODED_HPS.items() if k != "sagemaker_distribution_instance_groups"},
     "inputdataconfig.json": {"train": {"TrainingInputMode": "File"}}},
    {"resourceconfig.json": HETERO_RC, "hyperparameters.json": ENCODED_HPS,
     "inputdataconfig.json": {"train": {"TrainingInputMode": "File"},
                              "eval": {"TrainingInputMode": "Pipe"}}},
], ids=["minimal", "real", "hetero"])
def test_environment_matches(both, documents):
    ref, ours = both(ENVIRONMENT_SNIPPET, documents,
                     extra_env={"TRAINING_JOB_NAME": "job-1", "AWS_REGION": "us-west-2"})
    for name, value in ref["properties"].items():
        if name == "is_modelparallel_enabled":
            assert not value and ours["properties"][name] is False
            continue
        assert ours["properties"][name] == value, name
    for name, value in ref["env_vars"].items():
        if name not in MORE_FIELDS:
            assert ours["env_vars"][name] == value, name
    ref_training_env = json.loads(ref["env_vars"]["SM_TRAINING_ENV"])
    ours_training_env = json.loads(ours["env_vars"]["SM_TRAINING_ENV"])
    for name, value in ref_training_env.items():
        if name != "is_modelparallel_enabled":
            assert ours_training_env[name] == value, name
    assert ours["cmd_args"] == ref["cmd_args"]
    assert ours["properties"]["job_name"] == ref["properties"]["job_name"] == "job-1"


# Both `train`s, the reference's console script and ours, on identical job
# trees: what a user's script and a framework hook see, and how a job ends.
REFERENCE_TRAIN = os.path.join(os.path.dirname(REFERENCE_PYTHON), "train")


def run_trains(tmp_path, files, entry_point="train.py", hyperparameters=None, env=None):
    """-> {"ref": (exit code, failure text, report), "ours": ...}. The report
    is what the script wrote to model/report.json (None if it wrote none)."""
    from jobs import TRAIN, Job

    out = {}
    for side, train in (("ref", REFERENCE_TRAIN), ("ours", TRAIN)):
        # The host is `localhost`: the reference's entry_point.run waits up to
        # 15 minutes for every host name to resolve.
        job = Job(tmp_path / side, files, entry_point=entry_point,
                  hyperparameters=hyperparameters, hosts=("localhost",),
                  current_host="localhost")
        run_env = {k: v for k, v in job.env(**(env or {})).items()
                   if not k.startswith("PYTEST")}
        r = subprocess.run([train], env=run_env, capture_output=True, timeout=120)
        report = (json.loads(job.read("model", "report.json"))
                  if job.exists("model", "report.json") else None)
        failure = job.read("output", "failure") if job.exists("output", "failure") else None
        out[side] = (r.returncode, failure, report, r.stderr.decode("utf-8", "replace"),
                     job.paths.code_dir)
    return out


ARGV_REPORT = """
    import json, os, sys
    import mylib
    with open(os.path.join(os.environ["SM_MODEL_DIR"], "report.json"), "w") as f:
        json.dump({"argv": sys.argv[1:], "user_args": json.loads(os.environ["SM_USER_ARGS"]),
                   "job_name": json.loads(os.environ["SM_TRAINING_ENV"])["job_name"],
                   "pythonpath": os.environ["PYTHONPATH"].split(":")}, f)
"""


def test_train_gives_a_script_the_references_argv_job_name_and_pythonpath(tmp_path):
    """A nested entry point importing the code dir's top-level package, a mixed
    hyperparameter set, and a tuning trial (a static sagemaker_job_name, its own
    TRAINING_JOB_NAME): the script sees the same in both."""
    hps = {"flag": True, "off": False, "lst": [1, 2], "d": {"k": "v", "a": 1}, "n": None,
           "x": 1.5, "s": "a b", "lr": 0.1, "nested": {"o": [1, {"p": "q"}]},
           "sagemaker_job_name": "tuning-static"}
    runs = run_trains(tmp_path, {"scripts/train.py": ARGV_REPORT,
                                 "mylib/__init__.py": ""}, entry_point="scripts/train.py",
                      hyperparameters=hps, env={"TRAINING_JOB_NAME": "tuning-trial-007"})
    (ref_code, _, ref, ref_err, ref_dir), (code, _, ours, err, our_dir) = (runs["ref"],
                                                                           runs["ours"])
    assert ref_code == 0, ref_err[-3000:]
    assert code == 0, err[-3000:]
    assert ours["argv"] == ref["argv"]
    assert ours["argv"][:6] == ["-d", "a=1,k=v", "--flag", "True", "--lr", "0.1"]
    assert ours["user_args"] == ref["user_args"] == ref["argv"]
    assert ours["job_name"] == ref["job_name"] == "tuning-trial-007"
    assert ref["pythonpath"][0] == ref_dir and ours["pythonpath"][0] == our_dir


HOOK_FAILURES = {
    "enoent": ("import errno\n"
               "def main():\n"
               "    raise FileNotFoundError(errno.ENOENT, 'No such file or directory',"
               " '/opt/ml/input/data/train/missing.csv')\n"),
    "generic": "def main():\n    raise RuntimeError('the hook gave up')\n",
    # An error raised from Training Compiler code (a stand-in tensorflow.compiler.xla).
    "xla": "from tensorflow.compiler.xla import bridge\ndef main():\n    bridge.compile()\n",
}


@pytest.mark.parametrize("case,exit_code,label", [
    ("enoent", 2, "Framework Error:"), ("generic", 1, "Framework Error:"),
    ("xla", 1, "SMTrainingCompiler Error:")])
def test_a_raising_framework_hook_ends_as_in_the_reference(tmp_path, case, exit_code, label):
    hooks = tmp_path / "hooks"
    xla = hooks / "tensorflow" / "compiler" / "xla"
    xla.mkdir(parents=True)
    for d in (hooks / "tensorflow", hooks / "tensorflow" / "compiler"):
        (d / "__init__.py").write_text("")
    (xla / "__init__.py").write_text("")
    (xla / "bridge.py").write_text("def compile():\n    raise ValueError('XLA compilation "
                                   "failed: unsupported op')\n")
    (hooks / "my_hook.py").write_text(HOOK_FAILURES[case])
    runs = run_trains(tmp_path, {"train.py": "pass\n"},
                      env={"SAGEMAKER_TRAINING_MODULE": "my_hook:main",
                           "PYTHONPATH": str(hooks)})
    for side in ("ref", "ours"):
        code, failure, _, err, _ = runs[side]
        assert code == exit_code, (side, err[-3000:])
        assert failure.startswith(label), (side, failure)
    failure = runs["ours"][1]
    # Then what the toolkit says: the hook, the exit code and the error.
    assert "the framework hook my_hook:main failed" in failure.splitlines()[0]
    assert failure.splitlines()[1] == "exit code: %d" % exit_code
    last = {"enoent": "FileNotFoundError: [Errno 2] No such file or directory: "
                      "'/opt/ml/input/data/train/missing.csv'",
            "generic": "RuntimeError: the hook gave up",
            "xla": "ValueError: XLA compilation failed: unsupported op"}[case]
    assert last in failure


def test_entry_point_run_takes_a_runner_object(both):
    """entry_point.run(runner_type=<a runner>), as runner.get() accepts one:
    the code is fetched and installed, then that runner runs it."""
    ref, ours = both('''
        import json
        entry_point, process = load("entry_point"), load("process")
        src = os.path.join(os.environ["SAGEMAKER_BASE_DIR"], "src")
        os.makedirs(src)
        with open(os.path.join(src, "train.py"), "w") as f:
            f.write("import json, sys\\n"
                    "json.dump(sys.argv[1:], open('argv.json', 'w'))\\n"
                    "sys.exit(int(sys.argv[2]))\\n")
        code = os.path.join(os.environ["SAGEMAKER_BASE_DIR"], "code")
        result = {}
        for exit_code in ("0", "3"):
            runner = process.ProcessRunner("train.py", ["--exit", exit_code], {}, 1)
            run = attempt(entry_point.run, src, "train.py", ["--ignored"], runner_type=runner)
            result[exit_code] = [run.get("raised"),
                                 json.load(open(os.path.join(code, "argv.json")))]
    ''', extra_env={"SM_STUDIO_LOCAL_MODE": "true"})  # the reference's DNS wait, off
    assert ours == ref == {"0": [None, ["--exit", "0"]],
                           "3": ["ExecuteUserScriptError", ["--exit", "3"]]}
