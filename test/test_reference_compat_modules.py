"""The modules framework toolkits may import beyond entry_point, environment,
runner and errors (docs/framework-imports.md), against the reference
(sagemaker-training 5.1.4) on the same inputs: encoders, content_types,
recordio and record_pb2, timeout, _entry_point_type, the runner classes'
modules (process, mpi, smdataparallel, torch_distributed, pytorch_xla) and
cli.train. Each snippet runs on both sides through test_reference_compat's
`both` fixture (PKG is the package, `load(name)` imports PKG.name).
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from jobs import Job
from test_reference_compat import both  # noqa: F401 - the fixture

# What the surveyed framework toolkits import (docs/framework-imports.md),
# and the modules offered with them.
NAMES = {
    "entry_point": ["run", "install"],
    "environment": ["Environment", "read_hyperparameters"],
    "mapping": ["to_cmd_args", "to_env_vars"],
    "errors": ["ClientError", "ExecuteUserScriptError"],
    "runner": ["RunnerType", "ProcessRunnerType", "MPIRunnerType", "SMDataParallelRunnerType",
               "TorchDistributedRunnerType", "PyTorchXLARunnerType", "get"],
    "encoders": ["array_to_npy", "npy_to_numpy", "array_to_json", "json_to_numpy",
                 "csv_to_numpy", "array_to_csv", "array_to_recordio_protobuf", "decode",
                 "encode", "encoders_map"],
    "content_types": ["JSON", "CSV", "OCTET_STREAM", "ANY", "NPY", "UTF8_TYPES"],
    "recordio": ["_write_numpy_to_dense_tensor", "_write_spmatrix_to_sparse_tensor",
                 "_write_recordio", "_read_recordio", "_resolve_type", "_kmagic", "padding"],
    "record_pb2": ["Record", "Value", "Float32Tensor", "Float64Tensor", "Int32Tensor", "Bytes"],
    "timeout": ["timeout", "TimeoutError"],
    "_entry_point_type": ["get", "PYTHON_PACKAGE", "PYTHON_PROGRAM", "COMMAND",
                          "_EntryPointType"],
    "process": ["ProcessRunner", "python_executable", "DEFAULT_ERROR_CLASS"],
    "mpi": ["MasterRunner", "WorkerRunner", "DEFAULT_ERROR_CLASS"],
    "smdataparallel": ["SMDataParallelRunner", "DEFAULT_ERROR_CLASS"],
    "torch_distributed": ["TorchDistributedRunner", "TORCH_DISTRIBUTED_MODULE", "MASTER_PORT"],
    "pytorch_xla": ["PyTorchXLARunner"],
    "cli.train": ["main"],
}
NEW_MODULES = ["encoders", "content_types", "recordio", "record_pb2", "timeout",
               "_entry_point_type", "process", "mpi", "smdataparallel", "torch_distributed",
               "pytorch_xla", "cli", "cli.train"]
HEAVY = ("numpy", "scipy", "boto3", "botocore", "google.protobuf", "paramiko", "psutil",
         "torch", "six", "training_toolkit.fetch", "training_toolkit.supervise")

# Arrays as both sides build them (numpy is in both interpreters), and how a
# result travels back: dtype, shape and the values' repr (NaN-safe).
ARRAYS = '''
import numpy as np

def arrays():
    return {
        "int64": np.arange(6).reshape(2, 3),
        "float64": np.array([[0.1, -2.5, 1e300], [float("nan"), float("inf"), -0.0]]),
        "float32": np.array([0.1, 1e20, -3.25], dtype=np.float32),
        "bool": np.array([True, False]),
        "scalar": np.array(7.5),
        "strings": np.array([["a,b", 'q"'], ["x\\ny", ""]]),
        "cube": np.zeros((2, 2, 2), dtype=np.int32),
        "empty": np.zeros((0, 3)),
        "list": [[1, 2], [3, 4]],
        "ragged": [1, [2, 3]],
        "nested_scalars": [np.float32(1.5), np.int64(2)],
    }

def described(value):
    if isinstance(value, dict) and "value" in value:
        return {"value": described(value["value"])}
    if hasattr(value, "dtype") and hasattr(value, "shape"):
        return {"dtype": str(value.dtype), "shape": list(value.shape),
                "values": repr(value.tolist())}
    if isinstance(value, (bytes, bytearray)):
        return {"hex": bytes(value).hex()}
    return value
'''


def with_prelude(both, prelude, snippet, inputs=None):
    """both(), with definitions (at column 0) before an indented snippet."""
    return both(prelude + textwrap.dedent(snippet), inputs)


def test_surveyed_modules_and_names_exist_on_both_sides(both):
    ref, ours = both('''
        result = {}
        for module, names in INPUTS.items():
            m = load(module)
            result[module] = [n for n in names if not hasattr(m, n)]
    ''', NAMES)
    assert ref == {m: [] for m in NAMES}, ref  # the list names only the reference's names
    assert ours == ref


def test_runner_classes_have_the_references_names_bases_and_call_shapes(both):
    classes = {"process": ["ProcessRunner"], "mpi": ["MasterRunner", "WorkerRunner"],
               "smdataparallel": ["SMDataParallelRunner"],
               "torch_distributed": ["TorchDistributedRunner"],
               "pytorch_xla": ["PyTorchXLARunner"]}
    ref, ours = both('''
        import inspect
        base = load("process").ProcessRunner
        result = {}
        for module, names in INPUTS.items():
            for name in names:
                cls = getattr(load(module), name)
                result[name] = {
                    "is_a_process_runner": issubclass(cls, base),
                    "init": list(inspect.signature(cls.__init__).parameters),
                    "run": list(inspect.signature(cls.run).parameters),
                }
        xla = load("pytorch_xla").PyTorchXLARunner
        result["xla_ports"] = [xla.MESH_SERVICE_PORT, xla.WORKER_PORT]
        result["xla_not_a_host"] = attempt(xla, "t.py", [], {}, 1, "algo-1", "algo-9",
                                           ["algo-1"], 0)
        tdr = load("torch_distributed")
        result["torchrun"] = [tdr.TORCH_DISTRIBUTED_MODULE, tdr.MASTER_PORT]
        errors = load("errors")
        result["default_errors"] = [
            getattr(load(m), "DEFAULT_ERROR_CLASS") is errors.ExecuteUserScriptError
            for m in ("process", "mpi", "smdataparallel")]
        result["python"] = load("process").python_executable() == sys.executable
    ''', classes)
    assert ours == ref
    assert ref["TorchDistributedRunner"]["run"] == ["self", "capture_error", "wait"]


def test_content_types_match(both):
    ref, ours = both('''
        ct = load("content_types")
        result = {k: getattr(ct, k) for k in dir(ct) if k.isupper()}
    ''')
    assert ours == ref
    assert ref["UTF8_TYPES"] == ["application/json", "text/csv"]


def test_npy_round_trips_match(both):
    ref, ours = with_prelude(both, ARRAYS, '''
        enc, ct = load("encoders"), load("content_types")
        result = {}
        for name, a in arrays().items():
            data = attempt(enc.array_to_npy, a)
            out = {"npy": described(data),
                   "encode": described(attempt(enc.encode, a, ct.NPY))}
            if "value" in data:
                out["back"] = described(attempt(enc.npy_to_numpy, data["value"]))
                out["decode"] = described(attempt(enc.decode, data["value"], ct.NPY))
            result[name] = out
    ''')
    assert ours == ref
    assert ref["float64"]["back"]["value"]["dtype"] == "float64"


def test_json_round_trips_match(both):
    ref, ours = with_prelude(both, ARRAYS, '''
        enc, ct = load("encoders"), load("content_types")
        result = {}
        for name, a in arrays().items():
            text = attempt(enc.array_to_json, a)
            out = {"json": text, "encode": attempt(enc.encode, a, ct.JSON)}
            if "value" in text:
                out["back"] = described(attempt(enc.json_to_numpy, text["value"]))
                out["float32"] = described(attempt(enc.json_to_numpy, text["value"],
                                                   dtype="float32"))
                out["decode"] = described(attempt(enc.decode, text["value"], ct.JSON))
            result[name] = out
        result["objects"] = [attempt(enc.array_to_json, v) for v in
                             ({"a": np.arange(2)}, object(), {1, 2}, "s", None)]
        result["bad"] = [attempt(enc.json_to_numpy, v) for v in ("[1,", "", "[[1], [2, 3]]")]
    ''')
    # object()'s message names its address; the error class is what counts.
    for side in (ref, ours):
        side["objects"][1].pop("str", None)
    assert ours == ref
    assert ref["float64"]["json"] == {"value": "[[0.1, -2.5, 1e+300], [NaN, Infinity, -0.0]]"}
    assert ref["objects"][1] == {"raised": "TypeError"}


def test_csv_round_trips_match(both):
    texts = ["1,2\n3,4", "a,b\n1,2", "", "1", '"1,2",3\n4,5', "1,\"2\n", "nan,inf\n-1e5,2",
             "1,2\n3,4\n", "1\n2\n3", " 1 , 2 ", "1;2", b"1,2"]
    ref, ours = with_prelude(both, ARRAYS, '''
        enc, ct = load("encoders"), load("content_types")
        result = {"decode": [], "encode": {}}
        for text in INPUTS:
            result["decode"].append([described(attempt(enc.csv_to_numpy, text)),
                                     described(attempt(enc.csv_to_numpy, text, dtype="float32")),
                                     described(attempt(enc.csv_to_numpy, text, dtype=int)),
                                     described(attempt(enc.decode, text, ct.CSV))])
        for name, a in arrays().items():
            text = attempt(enc.array_to_csv, a)
            out = {"csv": text, "encode": attempt(enc.encode, a, ct.CSV)}
            if "value" in text:
                out["back"] = described(attempt(enc.csv_to_numpy, text["value"]))
            result["encode"][name] = out
    ''', texts)
    assert ours == ref
    assert ref["decode"][0][0] == {"value": {"dtype": "float64", "shape": [2, 2],
                                             "values": "[[1.0, 2.0], [3.0, 4.0]]"}}
    assert ref["encode"]["int64"]["csv"] == {"value": "0,1,2\n3,4,5\n"}


def test_ragged_csv_is_a_client_error_where_the_reference_crashes(both):
    """The one encoder difference, on purpose: rows of different lengths
    without a dtype end the reference's csv_to_numpy with an
    UnboundLocalError (its own bug); ours says what is wrong, as a ClientError."""
    ref, ours = both('''
        enc = load("encoders")
        result = [attempt(enc.csv_to_numpy, "1,2\\n3"), attempt(enc.csv_to_numpy, "1,2\\n3",
                                                                 dtype=float)]
    ''')
    assert ref[0]["raised"] == "UnboundLocalError"
    assert ours[0]["raised"] == "ClientError"
    assert ours[0]["str"].startswith("Error while decoding csv: setting an array element")
    assert ours[1] == ref[1]


def test_unsupported_content_types_match(both):
    ref, ours = both('''
        enc = load("encoders")
        result = [attempt(enc.encode, [1], "application/x-recordio-protobuf"),
                  attempt(enc.decode, b"", "text/plain"), attempt(enc.encode, [1], None)]
    ''')
    # errors.UnsupportedFormatError words the rest of its message without the
    # reference's stray indentation and doubled "to" (test_compat_api's concern).
    for side in (ref, ours):
        for case in side:
            case["str"] = case["str"].split("\n")[0]
    assert ours == ref
    assert ref[0] == {"raised": "UnsupportedFormatError", "str": "Content type "
                      "application/x-recordio-protobuf is not supported by this framework."}


RECORDIO = ARRAYS + '''
import io

def parsed(data):
    """Each record of recordio-protobuf bytes, read with this side's own
    recordio and record_pb2."""
    recordio, pb = load("recordio"), load("record_pb2")
    out = []
    for payload in recordio._read_recordio(io.BytesIO(data)):
        record = pb.Record()
        used = record.ParseFromString(payload)
        entry = {"used": used, "size": len(payload)}
        for part in ("features", "label"):
            for key, value in getattr(record, part).items():
                kind = value.WhichOneof("value")
                tensor = getattr(value, kind)
                entry["%s/%s" % (part, key)] = [kind, repr(list(tensor.values)),
                                                list(tensor.keys), list(tensor.shape)]
        out.append(entry)
    return out

def recordio_cases():
    import scipy.sparse as sp

    dense = np.array([[1.5, 0.0, -2.0], [0.1, 1e300, float("nan")]])
    sparse = sp.csr_matrix(np.array([[0, 1.5, 0, 2], [0, 0, 0, 0], [3, 0, 0, -4.25]]))
    return {
        "float64": (dense, None),
        "float32 + int labels": (dense.astype(np.float32), np.array([1, 0])),
        "int64 + float32 labels": (np.arange(6).reshape(3, 2), np.array([0.5, 1, 2],
                                                                         dtype=np.float32)),
        "1-D": (np.array([1.0, 2.0, 3.0]), None),
        "labels by column count": (np.ones((1, 3)), np.array([1.0, 2.0, 3.0])),
        "sparse float64 + labels": (sparse, np.array([1.0, 0.0, 1.0])),
        "sparse float32": (sparse.astype(np.float32), None),
        "sparse int64": (sparse.astype(np.int64), np.array([7, 8, 9])),
        "sparse csc": (sparse.tocsc(), None),
        "sparse coo with duplicates": (sp.coo_matrix(([1.0, 2.0, 5.0], ([0, 0, 1], [2, 2, 0])),
                                                     shape=(2, 3)), None),
        "empty rows": (np.zeros((2, 0)), None),
        "cube": (np.zeros((2, 2, 2)), None),
        "bool": (np.array([[True]]), None),
        "int out of int32": (np.array([[2 ** 40]]), None),
        "2-D labels": (np.ones((2, 2)), np.ones((2, 1))),
        "labels of another length": (np.ones((2, 3)), np.ones(5)),
        "bool labels": (np.ones((2, 2)), np.array([True, False])),
        "list": ([[1.0]], None),
    }
'''


def test_recordio_protobuf_encoding_matches(both):
    ref, ours = with_prelude(both, RECORDIO, '''
        enc = load("encoders")
        result = {}
        for name, (array, labels) in recordio_cases().items():
            data = attempt(enc.array_to_recordio_protobuf, array, labels)
            result[name] = {"bytes": described(data)}
            if "value" in data:
                result[name]["records"] = parsed(data["value"])
    ''')
    assert ours == ref
    assert ref["sparse float64 + labels"]["records"][0]["features/values"] == [
        "float64_tensor", "[1.5, 2.0]", [1, 3], [4]]
    assert ref["bool"]["bytes"]["raised"] == "ValueError"


def test_recordio_writers_and_reader_match(both):
    ref, ours = with_prelude(both, RECORDIO, '''
        import struct
        recordio = load("recordio")
        result = {"resolve": [attempt(recordio._resolve_type, np.dtype(t)) for t in
                              ("int64", "float64", "float32", "int32", "bool", "float16")],
                  "magic": recordio._kmagic, "padding": {str(k): v.hex() for k, v in
                                                         recordio.padding.items()}}
        frames = io.BytesIO()
        for payload in (b"", b"a", b"ab", b"abc", b"abcd", b"abcde"):
            recordio._write_recordio(frames, payload)
        result["frames"] = frames.getvalue().hex()
        result["read"] = [p.hex() for p in recordio._read_recordio(io.BytesIO(frames.getvalue()))]
        result["truncated header"] = [p.hex() for p in recordio._read_recordio(
            io.BytesIO(frames.getvalue() + b"\\x0a\\x23"))]
        bad = io.BytesIO(struct.pack("I", 1234) + struct.pack("I", 0))
        result["bad magic"] = attempt(lambda: list(recordio._read_recordio(bad)))
        result["bad magic"].pop("str", None)
        dense, sparse = io.BytesIO(), io.BytesIO()
        recordio._write_numpy_to_dense_tensor(dense, np.eye(2), np.array([1.0, 2.0]))
        result["dense"] = dense.getvalue().hex()
        result["dense of sparse"] = attempt(recordio._write_spmatrix_to_sparse_tensor,
                                            io.BytesIO(), np.eye(2))
        result["dense vector"] = attempt(recordio._write_numpy_to_dense_tensor, io.BytesIO(),
                                         np.ones(3))
        import scipy.sparse as sp
        recordio._write_spmatrix_to_sparse_tensor(sparse, sp.eye(3, format="csr"))
        result["sparse"] = sparse.getvalue().hex()
    ''')
    assert ours == ref


def test_record_messages_behave_alike(both):
    ref, ours = both('''
        pb = load("record_pb2")
        result = {}

        def case(name, fn):
            result[name] = attempt(fn)

        def empty_key():
            r = pb.Record()
            r.features[""].float32_tensor.values.extend([])
            return [r.SerializeToString().hex(), r.features[""].WhichOneof("value")]
        case("empty key, empty extend", empty_key)

        def touched():
            # One key a map: protobuf writes several in its hash table's order.
            r, s = pb.Record(), pb.Record()
            r.features["a"]
            v = s.features["b"].float64_tensor  # reading a sub-message sets nothing
            return [r.SerializeToString().hex(), s.SerializeToString().hex(),
                    s.features["b"].WhichOneof("value"), len(v.values)]
        case("touched only", touched)

        def full():
            r = pb.Record(uid="u")
            r.features["values"].int32_tensor.values.extend([-1, 2, 2 ** 31 - 1, -2 ** 31])
            r.features["values"].int32_tensor.keys.extend([0, 2 ** 64 - 1])
            r.label["values"].float32_tensor.values.extend([1 / 3, 1e300, float("-inf")])
            r.label["values"].float32_tensor.shape.append(3)
            r.metadata, r.configuration = "", "é\\n"
            data = r.SerializeToString()
            back = pb.Record.FromString(data)
            return [data.hex(), back == r, str(r), str(back), back.HasField("uid"),
                    back.HasField("metadata"), r.ByteSize()]
        case("full record", full)

        def switch():
            v = pb.Value()
            stale = v.float32_tensor
            v.bytes.content_type = "a"
            first = [v.WhichOneof("value"), v.SerializeToString().hex()]
            v.int32_tensor.values.append(2)
            return first + [v.WhichOneof("value"), v.HasField("bytes"), v.SerializeToString().hex()]
        case("oneof switch", switch)

        def bytes_value():
            b = pb.Bytes()
            b.value.extend([b"\\x00\\xff", b"x"])
            b.content_type = "text/plain"
            v = pb.Value()
            v.bytes.MergeFrom(b)
            return [v.SerializeToString().hex(), str(v), list(v.bytes.value)]
        case("bytes", bytes_value)

        def unknown_fields():
            r = pb.Record()
            used = r.ParseFromString(b"\\x08\\x01\\x1a\\x01u\\x30\\x05")
            return [used, r.uid, r.SerializeToString().hex()]
        case("unknown fields", unknown_fields)

        def unpacked():
            t = pb.Int32Tensor()
            t.ParseFromString(b"\\x08\\x05\\x08\\x7f\\x0a\\x02\\x01\\x02")
            return [list(t.values), t.SerializeToString().hex()]
        case("unpacked repeated", unpacked)

        def merge():
            a = pb.Record(uid="a")
            a.features["x"].float64_tensor.values.append(1)
            b = pb.Record(metadata="m")
            b.features["x"].float64_tensor.values.append(2)
            a.MergeFrom(b)
            c = pb.Record()
            c.CopyFrom(a)
            return [list(a.features["x"].float64_tensor.values), a.uid, a.metadata, c == a]
        case("merge and copy", merge)

        def clear():
            r = pb.Record(uid="u")
            r.features["x"].int32_tensor.values.append(1)
            r.ClearField("uid")
            first = [r.HasField("uid"), r.SerializeToString().hex()]
            r.Clear()
            return first + [r.SerializeToString().hex(), len(r.features)]
        case("clear", clear)

        for name, fn in {
            "int32 overflow": lambda: pb.Int32Tensor().values.append(2 ** 31),
            "int32 from float": lambda: pb.Int32Tensor().values.append(1.0),
            "int32 from bool": lambda: pb.Int32Tensor().values.append(True),
            "uint64 negative": lambda: pb.Float32Tensor().keys.append(-1),
            "float from str": lambda: pb.Float64Tensor().values.append("x"),
            "float32 of a big double": lambda: list(pb.Float32Tensor(values=[1e300]).values),
            "assign repeated": lambda: setattr(pb.Float32Tensor(), "values", [1]),
            "assign message": lambda: setattr(pb.Value(), "bytes", pb.Bytes()),
            "no such field": lambda: setattr(pb.Record(), "nope", 1),
            "map entry assigned": lambda: pb.Record().features.__setitem__("k", pb.Value()),
            "map key not a string": lambda: pb.Record().features[1],
            "bytes from str": lambda: pb.Bytes().value.append("s"),
            "string from bytes": lambda: pb.Record(uid=b"x").uid,
            "corrupt": lambda: pb.Record().ParseFromString(b"\\x0a\\x05"),
            "which oneof of nothing": lambda: pb.Value().WhichOneof("value"),
            "has a repeated field": lambda: pb.Float32Tensor().HasField("values"),
            "no such oneof": lambda: pb.Value().WhichOneof("nope"),
            "merge another type": lambda: pb.Record().MergeFrom(pb.Value()),
            "text of an empty entry": lambda: str(pb.Record(features={"a": pb.Value()})),
            "text of empty members": lambda: str(pb.Value(bytes=pb.Bytes(content_type=""))),
            "deep copy": lambda: __import__("copy").deepcopy(pb.Record(uid="u")) == pb.Record(
                uid="u"),
            "bytearray input": lambda: pb.Record.FromString(bytearray(b"\x1a\x01u")).uid,
        }.items():
            case(name, fn)

        from google.protobuf import descriptor_pb2, json_format, message, text_format

        def several_keys():
            # Each side writes map entries in its own map's order, so they are
            # compared as sets here; deterministic=True writes them by key.
            r = pb.Record()
            for key in ("b", "a", "c", "", "é"):
                r.features[key].float64_tensor.values.append(len(key))
                r.label[key].int32_tensor.values.append(len(key))
            back = pb.Record.FromString(r.SerializeToString())
            return [sorted(back.features), sorted(back.label), back == r, r.ByteSize(),
                    sorted((k, list(v.float64_tensor.values)) for k, v in back.features.items()),
                    r.SerializeToString(deterministic=True).hex(),
                    json_format.MessageToJson(r, sort_keys=True),
                    text_format.Parse(str(r), pb.Record()) == r]
        case("several map keys", several_keys)

        def real_messages():
            return [[c.__name__, issubclass(c, message.Message), c.DESCRIPTOR.full_name]
                    for c in (pb.Float32Tensor, pb.Float64Tensor, pb.Int32Tensor, pb.Bytes,
                              pb.Value, pb.Record)]
        case("protobuf messages", real_messages)

        def decode_error():
            try:
                pb.Value.FromString(b"\\x12\\x05")
            except message.DecodeError as e:
                return [type(e).__module__, type(e).__name__]
        case("protobuf's DecodeError", decode_error)

        def descriptor():
            proto = descriptor_pb2.FileDescriptorProto()
            pb.DESCRIPTOR.CopyToProto(proto)
            proto.ClearField("syntax")  # "proto2" or unset: the same
            return [pb.DESCRIPTOR.name, pb.DESCRIPTOR.package, str(proto)]
        case("descriptor", descriptor)
    ''')
    # Our classes name their module training_toolkit.record_pb2; the
    # reference's say "record_pb2" (see the pickling test below).
    merge = ours["merge another type"]
    merge["str"] = merge["str"].replace("training_toolkit.record_pb2.", "record_pb2.")
    assert ours == ref
    assert ref["full record"]["value"][1] is True
    assert ref["protobuf's DecodeError"]["value"] == ["google.protobuf.message", "DecodeError"]
    assert "map_entry: true" in ref["descriptor"]["value"][2]


def test_record_messages_pickle_where_the_references_do_not(both):
    """A difference, on purpose: the reference builds its classes under the
    module name "record_pb2" (protoc's), which cannot be imported, so pickle
    fails on them; ours say training_toolkit.record_pb2, and pickle."""
    ref, ours = both('''
        import pickle
        pb = load("record_pb2")
        r = pb.Record(uid="u")
        r.features["x"].float32_tensor.values.append(1.5)
        result = [pb.Record.__module__,
                  attempt(lambda: pickle.loads(pickle.dumps(r)) == r),
                  attempt(lambda: __import__("copy").deepcopy(r) == r)]
    ''')
    assert ref[0] == "record_pb2" and ref[1]["raised"] == "PicklingError"
    assert ours[0] == "training_toolkit.record_pb2" and ours[1] == {"value": True}
    assert ours[2] == ref[2] == {"value": True}


@pytest.mark.parametrize("first", ["sagemaker_training", "training_toolkit"])
def test_ours_and_the_references_record_pb2_import_in_one_process(first):
    """The reference adds record.proto and aialgs.data.* to protobuf's default
    pool; ours are in a private pool, so both import in either order, and
    each reads the other's bytes."""
    from test_reference_compat import REFERENCE_PYTHON

    second = {"sagemaker_training": "training_toolkit"}.get(first, "sagemaker_training")
    code = textwrap.dedent('''
        import importlib
        from google.protobuf import descriptor_pool
        modules = {name: importlib.import_module(name + ".record_pb2") for name in %r}
        ours, ref = modules["training_toolkit"], modules["sagemaker_training"]
        r = ours.Record(uid="u")
        r.label["y"].int32_tensor.values.append(3)
        s = ref.Record.FromString(r.SerializeToString())
        default = descriptor_pool.Default().FindMessageTypeByName("aialgs.data.Record")
        print(ours.Record.FromString(s.SerializeToString()) == r,
              ours.Record is not ref.Record, default is ref.Record.DESCRIPTOR,
              ours.DESCRIPTOR.pool is not descriptor_pool.Default())
    ''' % ([first, second],))
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(__file__), "..", "src"))
    out = subprocess.run([REFERENCE_PYTHON, "-c", code], capture_output=True, text=True,
                         env=env, cwd=os.path.dirname(__file__))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True"] * 4


def test_record_pb2_without_protobuf_says_what_to_install():
    code = textwrap.dedent('''
        import sys
        sys.modules["google.protobuf"] = None  # as if protobuf were not installed
        import numpy
        from training_toolkit import encoders
        for attempt in (lambda: __import__("training_toolkit.record_pb2"),
                        lambda: encoders.array_to_recordio_protobuf(numpy.eye(2))):
            try:
                attempt()
            except ImportError as e:
                print(e)
    ''')
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    lines = out.stdout.splitlines()
    assert len(lines) == 2 and lines[0] == lines[1], out.stdout
    assert "pip install 'training-toolkit[recordio]' (or protobuf)" in lines[0]


def test_timeout_matches(both):
    ref, ours = both('''
        import signal, time
        t = load("timeout")
        result = {}
        started = time.monotonic()
        try:
            with t.timeout(seconds=0.2):
                time.sleep(3)
            result["slow"] = "finished"
        except t.TimeoutError as e:
            result["slow"] = [type(e).__name__, str(e), isinstance(e, OSError),
                              [c.__name__ for c in type(e).__mro__]]
        result["slow_took_under_2s"] = time.monotonic() - started < 2
        with t.timeout(seconds=0.3):
            pass
        time.sleep(0.5)  # the timer was cleared on the way out
        result["fast"] = "no alarm afterwards"
        with t.timeout():
            time.sleep(0.1)
        result["no limit"] = "finished"
        try:
            with t.timeout(seconds=0.05, minutes=0, hours=0):
                time.sleep(2)
        except t.TimeoutError as e:
            result["sum"] = str(e)
        try:
            with t.timeout(seconds=5):
                raise KeyError("inner")
        except KeyError as e:
            result["inner error"] = str(e)
        result["timer after"] = signal.getitimer(signal.ITIMER_REAL)[0]
        result["handler left"] = signal.getsignal(signal.SIGALRM) not in (signal.SIG_DFL, None)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
    ''')
    assert ours == ref
    assert ref["slow"][:2] == ["TimeoutError", "timed out after 0.2 seconds"]
    assert ref["slow"][2] is False


def test_entry_point_type_get_matches(both):
    ref, ours = both('''
        import tempfile
        ept = load("_entry_point_type")
        root = tempfile.mkdtemp()
        dirs = {}
        for name, files in {"empty": [], "setup": ["setup.py"], "pyproject": ["pyproject.toml"],
                            "script": ["train.py", "run.sh"]}.items():
            dirs[name] = os.path.join(root, name)
            os.makedirs(dirs[name])
            for f in files:
                open(os.path.join(dirs[name], f), "w").close()
        dirs["missing"] = os.path.join(root, "missing")
        result = {}
        for name, path in dirs.items():
            for entry in ("train.py", "run.sh", "train", "pkg.module", "x.py.sh", ""):
                got = attempt(ept.get, path, entry)
                got.pop("str", None)  # the message names this side's temp dir
                if "value" in got:
                    got["value"] = [got["value"].name, got["value"].value,
                                    type(got["value"]).__name__]
                result["%s/%s" % (name, entry)] = got
        result["members"] = [[m.name, m.value] for m in ept._EntryPointType]
        result["aliases"] = [ept.PYTHON_PACKAGE is ept._EntryPointType.PYTHON_PACKAGE,
                             ept.PYTHON_PROGRAM is ept._EntryPointType.PYTHON_PROGRAM,
                             ept.COMMAND is ept._EntryPointType.COMMAND]
    ''')
    assert ours == ref
    assert ref["pyproject/train.py"]["value"][0] == "PYTHON_PROGRAM"  # setup.py only
    assert ref["missing/train.py"] == {"raised": "FileNotFoundError"}


def test_process_runner_runs_the_entry_point_on_both_sides(both):
    ref, ours = both('''
        import json
        code = os.path.join(os.environ["SAGEMAKER_BASE_DIR"], "code")
        with open(os.path.join(code, "train.py"), "w") as f:
            f.write("import json, sys\\n"
                    "json.dump(sys.argv[1:], open('argv.json', 'w'))\\n"
                    "sys.exit(int(sys.argv[2]))\\n")
        process = load("process")
        result = {}
        for code_to_exit in ("0", "3"):
            run = attempt(process.ProcessRunner("train.py", ["--exit", code_to_exit], {}, 1).run,
                          wait=True, capture_error=True)
            result[code_to_exit] = {"raised": run.get("raised"),
                                    "argv": json.load(open(os.path.join(code, "argv.json")))}
            if run.get("raised"):
                result[code_to_exit]["says exit code 3"] = "3" in run["str"]
    ''')
    assert ours == ref
    assert ref["3"] == {"raised": "ExecuteUserScriptError", "argv": ["--exit", "3"],
                        "says exit code 3": True}


def test_cli_train_main_runs_train_on_both_sides(both):
    """cli.train.main() is `train`: here, a job without an entry point, which
    both end with a failure file and a non-zero exit."""
    ref, ours = both('''
        import subprocess
        base = os.environ["SAGEMAKER_BASE_DIR"]
        proc = subprocess.run([sys.executable, "-c", "import %s.cli.train as t; t.main()" % PKG],
                              capture_output=True)
        result = {"failed": proc.returncode != 0,
                  "failure file": os.path.exists(os.path.join(base, "output", "failure"))}
    ''')
    assert ours == ref == {"failed": True, "failure file": True}


# record_pb2 is protobuf's message classes, and recordio imports it at its
# top, as the reference's does; encoders import recordio only when called.
ALLOWED_HEAVY = {"record_pb2": ["google.protobuf"], "recordio": ["google.protobuf"]}


@pytest.mark.parametrize("module", NEW_MODULES)
def test_new_modules_import_nothing_heavy(module):
    code = ("import sys, training_toolkit.%s; print(' '.join(m for m in %r if m in sys.modules))"
            % (module, HEAVY))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ALLOWED_HEAVY.get(module, [])


def test_dense_encoding_does_not_import_scipy():
    code = ("import sys, numpy; from training_toolkit import encoders; "
            "encoders.array_to_recordio_protobuf(numpy.eye(2)); "
            "encoders.encode([1], 'text/csv'); print('scipy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_cli_package_keeps_its_names():
    from training_toolkit import cli
    from training_toolkit.cli import console_main, main, parser

    assert callable(console_main) and cli.main is main and callable(parser)
    out = subprocess.run([sys.executable, "-m", "training_toolkit.cli", "--help"],
                         capture_output=True, text=True)
    assert out.returncode == 0 and "training-toolkit" in out.stdout


@pytest.fixture
def mpi_job(tmp_path, monkeypatch):
    """make(**hyperparameters): a fresh two-host job tree, as algo-1, made
    the current one."""
    made = []

    def make(**hyperparameters):
        made.append(None)
        job = Job(tmp_path / str(len(made)), {"train.py": "print('hi')\n"},
                  hyperparameters=hyperparameters, hosts=("algo-1", "algo-2"))
        monkeypatch.setenv("SAGEMAKER_BASE_DIR", job.base)
        return job
    return make


def test_runner_classes_plan_through_the_toolkits_runners(mpi_job):
    from training_toolkit import mpi, process, runner, smdataparallel, torch_distributed

    mpi_job(sagemaker_mpi_enabled=True)
    master = mpi.MasterRunner("train.py", ["--x", "1"], {"A": "1"}, 3, "algo-1",
                              ["algo-1", "algo-2"], "-x FOO=1", "eth0", num_processes=5)
    assert runner.get(master) is master  # a reference-style runner is used as it is
    launch = master.plan()
    argv = list(launch.command.argv)
    assert launch.runner == "mpi" and launch.role == "master"
    assert argv[argv.index("-np") + 1] == "5" and "algo-1:3,algo-2:3" in argv
    assert "FOO=1" in argv and launch.command.env["A"] == "1"

    worker = mpi.WorkerRunner("train.py", [], {}, 1, "algo-1", "algo-2").plan()
    assert worker.runner == "mpi"

    mpi_job(sagemaker_distributed_dataparallel_enabled=True)
    assert mpi.WorkerRunner("train.py", [], {}, 1, "algo-1", "algo-1").plan().runner == "smddp"
    smddp = smdataparallel.SMDataParallelRunner("train.py", [], {}, 2, "algo-1",
                                                ["algo-1", "algo-2"], "-x BAR=2", "eth0").plan()
    assert smddp.runner == "smddp" and "BAR=2" in smddp.command.argv

    torchrun = torch_distributed.TorchDistributedRunner(
        "train.py", [], {}, 4, "algo-1", ["algo-1", "algo-2"], "algo-1", "eth0").plan()
    assert torchrun.runner == "torchrun" and "4" in torchrun.command.argv
    single = process.ProcessRunner("train.py", ["--y"], {}, 1).plan()
    assert single.runner == "process" and single.command.argv[-2:] == ("train.py", "--y")


def test_given_cluster_values_that_differ_are_logged(mpi_job, capfd):
    from training_toolkit import mpi
    from training_toolkit.environment import Environment

    mpi_job(sagemaker_mpi_enabled=True)
    runner = mpi.MasterRunner("train.py", [], {}, 1, "algo-9", ["algo-1", "algo-2"], "", "eth0")
    runner._check_cluster(Environment())
    err = capfd.readouterr().err
    assert "master_hostname 'algo-9' was given; the job's is 'algo-1'" in err
    assert "distribution_hosts" not in err  # same hosts, whatever their order


def test_a_hook_using_process_runner_runs_under_train(tmp_path):
    """A toolkit that fetches and installs the code itself, then runs it with
    the reference's ProcessRunner class: `train` exits with the script's code."""
    hook = tmp_path / "hookpkg"
    hook.mkdir()
    (hook / "myhook.py").write_text(
        "from training_toolkit import entry_point, environment, files, process\n"
        "def main():\n"
        "    env = environment.Environment()\n"
        "    files.download_and_extract(env.module_dir, environment.code_dir)\n"
        "    entry_point.install(env.user_entry_point, environment.code_dir)\n"
        "    process.ProcessRunner(env.user_entry_point, env.to_cmd_args(), env.to_env_vars(),\n"
        "                          1).run(wait=True, capture_error=True)\n")
    job = Job(tmp_path, {"train.py": "import sys, json, os\n"
                                     "json.dump(sys.argv[1:], open(os.path.join("
                                     "os.environ['SM_MODEL_DIR'], 'argv.json'), 'w'))\n"
                                     "sys.exit(int(sys.argv[2]))"},
              hyperparameters={"code": 4})
    r = job.run(env=job.env(SAGEMAKER_TRAINING_MODULE="myhook:main", PYTHONPATH=str(hook)),
                timeout=60)
    assert r.returncode == 4, r.stderr.decode()
    assert json.loads(job.read("model", "argv.json")) == ["--code", "4"]
    assert r.returncode == 4, r.stderr.decode()
    assert job.failure().startswith("ExecuteUserScriptError: exit code 4")


def test_scipy_sparse_arrays_are_encoded_where_the_reference_fails(both):
    """A difference, on purpose: the reference reads rows with the sparse
    matrices' getrow(), which scipy's sparse arrays (csr_array) lack; ours
    writes them as the csr_matrix of the same values."""
    ref, ours = both('''
        import numpy as np, scipy.sparse as sp
        enc = load("encoders")
        values = np.array([[0, 1.5], [2.0, 0]])
        result = [attempt(lambda: enc.array_to_recordio_protobuf(sp.csr_array(values)).hex()),
                  attempt(lambda: enc.array_to_recordio_protobuf(sp.csr_matrix(values)).hex())]
    ''')
    assert ref[0]["raised"] == "AttributeError"
    assert ours[0] == ours[1] == ref[1]
