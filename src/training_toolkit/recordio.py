"""sagemaker_training.recordio: numpy arrays and scipy sparse matrices as
recordio-protobuf (one `record_pb2.Record` per row, each in a RecordIO frame:
magic, length, payload padded to 4 bytes, as MXNet reads them), and the
frames read back.

numpy is imported by the functions that need it, never here; scipy never: a
scipy sparse matrix can only exist once scipy.sparse is imported.
"""
import struct
import sys

from .record_pb2 import Record

_kmagic = 0xCED7230A
# Zero bytes that pad a record to a multiple of 4, by how many are missing.
padding = {amount: bytes(amount) for amount in range(4)}
_TENSORS = {"Int32": "int32_tensor", "Float64": "float64_tensor", "Float32": "float32_tensor"}


def _is_sparse(array):
    sparse = sys.modules.get("scipy.sparse")
    return sparse is not None and sparse.issparse(array)


def _resolve_type(dtype):
    """The tensor an array of `dtype` goes to: numpy's default int (int64
    here) -> Int32, float64 -> Float64, float32 -> Float32; else ValueError."""
    import numpy as np

    for candidate, name in ((int, "Int32"), (float, "Float64"), ("float32", "Float32")):
        if dtype == np.dtype(candidate):
            return name
    raise ValueError("Unsupported dtype {} on array".format(dtype))


def _tensor(resolved_type, values):
    tensor = _TENSORS.get(resolved_type)
    return None if tensor is None else getattr(values["values"], tensor)


def _write_feature_tensor(resolved_type, record, vector):
    tensor = _tensor(resolved_type, record.features)
    if tensor is not None:
        tensor.values.extend(vector)


def _write_label_tensor(resolved_type, record, scalar):
    tensor = _tensor(resolved_type, record.label)
    if tensor is not None:
        tensor.values.extend([scalar])


def _write_keys_tensor(resolved_type, record, vector):
    tensor = _tensor(resolved_type, record.features)
    if tensor is not None:
        tensor.keys.extend(vector)


def _write_shape(resolved_type, record, scalar):
    tensor = _tensor(resolved_type, record.features)
    if tensor is not None:
        tensor.shape.extend([scalar])


def _check_shapes(array, labels):
    """The tensor types of features and labels, once both shapes are right."""
    if len(array.shape) != 2:
        raise ValueError("Array must be a Matrix")
    label_type = None
    if labels is not None:
        if len(labels.shape) != 1:
            raise ValueError("Labels must be a Vector")
        if labels.shape[0] not in array.shape:
            raise ValueError("Label shape {} not compatible with array shape {}".format(
                labels.shape, array.shape))
        label_type = _resolve_type(labels.dtype)
    return _resolve_type(array.dtype), label_type


def _write_numpy_to_dense_tensor(file, array, labels=None):
    """One Record per row of the 2-D numpy `array` (its label, labels[i],
    beside it), each framed into `file`."""
    feature_type, label_type = _check_shapes(array, labels)
    record = Record()
    for index, row in enumerate(array):
        record.Clear()
        _write_feature_tensor(feature_type, record, row)
        if labels is not None:
            _write_label_tensor(label_type, record, labels[index])
        _write_recordio(file, record.SerializeToString())


def _write_spmatrix_to_sparse_tensor(file, array, labels=None):
    """One Record per row of the scipy sparse `array`: its stored values, their
    column indices as keys, and the column count as shape."""
    import numpy as np

    if not _is_sparse(array):
        raise TypeError("Array must be sparse")
    feature_type, label_type = _check_shapes(array, labels)
    csr = array.tocsr()
    n_rows, n_cols = csr.shape
    record = Record()
    for row in range(n_rows):
        record.Clear()
        start, stop = csr.indptr[row], csr.indptr[row + 1]
        _write_feature_tensor(feature_type, record, csr.data[start:stop])
        _write_keys_tensor(feature_type, record, csr.indices[start:stop].astype(np.uint64))
        if labels is not None:
            _write_label_tensor(label_type, record, labels[row])
        _write_shape(feature_type, record, n_cols)
        _write_recordio(file, record.SerializeToString())


def _write_recordio(f, data):
    """`data` as one RecordIO frame written to the file-like `f`."""
    length = len(data)
    f.write(struct.pack("I", _kmagic))
    f.write(struct.pack("I", length))
    f.write(data)
    f.write(padding[-length % 4])


def _read_recordio(f):
    """The payloads of the RecordIO frames in `f`, one by one, until a frame
    header cannot be read; a frame with a wrong magic is an AssertionError."""
    while True:
        try:
            (magic,) = struct.unpack("I", f.read(4))
        except struct.error:
            return
        if magic != _kmagic:
            raise AssertionError("not a RecordIO frame: magic %#x" % magic)
        (length,) = struct.unpack("I", f.read(4))
        yield f.read(length)
        pad = -length % 4
        if pad:
            f.read(pad)
