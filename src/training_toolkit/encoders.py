"""sagemaker_training.encoders: arrays to and from NPY, CSV and JSON (and to
recordio-protobuf), as the reference encodes and decodes them.

numpy (and, for sparse input, scipy) is imported by the functions that need
it, not by importing this module.
"""
import csv
import io
import json

from . import content_types, errors


def _numpy():
    import numpy

    return numpy


def array_to_npy(array_like):
    """`array_like` in the NPY format (numpy.save), as bytes."""
    buffer = io.BytesIO()
    _numpy().save(buffer, array_like)
    return buffer.getvalue()


def npy_to_numpy(npy_array):
    """The array in NPY bytes. Pickled (object) arrays are loaded too, as
    the reference loads them: decode only data you trust."""
    return _numpy().load(io.BytesIO(npy_array), allow_pickle=True)


def _to_json_default(value):
    if hasattr(value, "tolist"):
        return value.tolist()
    return json.JSONEncoder().default(value)


def array_to_json(array_like):
    """`array_like` as a JSON string (arrays and numpy scalars as lists and
    numbers)."""
    return json.dumps(array_like, default=_to_json_default)


def json_to_numpy(string_like, dtype=None):
    """The numpy array of a JSON document."""
    return _numpy().array(json.loads(string_like), dtype=dtype)


def csv_to_numpy(string_like, dtype=None):
    """The numpy array of a CSV string, squeezed; converted to `dtype`
    (None: float64 when every cell is a number, else the strings as they are).
    Bad CSV, and a conversion to a given dtype that fails, are ClientErrors."""
    np = _numpy()
    strings = None
    try:
        reader = csv.reader(io.StringIO(string_like), delimiter=",", quotechar='"',
                            doublequote=True, strict=True)
        strings = np.array(list(reader)).squeeze()
        return strings.astype(dtype)
    except ValueError as e:
        if dtype is not None:
            raise errors.ClientError(
                "Error while writing numpy array: {}. dtype is: {}".format(e, dtype)) from e
        if strings is None:  # rows of different lengths
            raise errors.ClientError("Error while decoding csv: {}".format(e)) from e
        return strings
    except Exception as e:  # the reference's one error for bad CSV
        raise errors.ClientError("Error while decoding csv: {}".format(e)) from e


def array_to_csv(array_like):
    """`array_like` as CSV text, one line per row (a 1-D array: one value a line)."""
    np = _numpy()
    array = np.array(array_like)
    if len(array.shape) == 1:
        array = np.reshape(array, (array.shape[0], 1))
    stream = io.StringIO()
    writer = csv.writer(stream, lineterminator="\n", delimiter=",", quotechar='"',
                        doublequote=True, strict=True)
    try:
        writer.writerows(array)
    except csv.Error as e:
        raise errors.ClientError("Error while encoding csv: {}".format(e)) from e
    return stream.getvalue()


def array_to_recordio_protobuf(array_like, labels=None):
    """A 1-D or 2-D numpy array, or a scipy sparse matrix, as recordio-protobuf
    bytes (one Record a row; `labels`, one a row, as the records' labels)."""
    from .recordio import _is_sparse, _write_numpy_to_dense_tensor, _write_spmatrix_to_sparse_tensor

    if len(array_like.shape) == 1:
        array_like = array_like.reshape(1, array_like.shape[0])
    if len(array_like.shape) != 2:
        raise AssertionError("Expecting a 1 or 2 dimensional array")
    buffer = io.BytesIO()
    if _is_sparse(array_like):
        _write_spmatrix_to_sparse_tensor(buffer, array_like, labels)
    else:
        _write_numpy_to_dense_tensor(buffer, array_like, labels)
    return buffer.getvalue()


encoders_map = {
    content_types.NPY: array_to_npy,
    content_types.CSV: array_to_csv,
    content_types.JSON: array_to_json,
}
_decoders_map = {
    content_types.NPY: npy_to_numpy,
    content_types.CSV: csv_to_numpy,
    content_types.JSON: json_to_numpy,
}


def decode(obj, content_type):
    """`obj` (NPY bytes, CSV or JSON text) as a numpy array; another content
    type is an UnsupportedFormatError."""
    try:
        decoder = _decoders_map[content_type]
        return decoder(obj)
    except KeyError:
        raise errors.UnsupportedFormatError(content_type) from None


def encode(array_like, content_type):
    """`array_like` in NPY, CSV or JSON; another content type is an
    UnsupportedFormatError."""
    try:
        encoder = encoders_map[content_type]
        return encoder(array_like)
    except KeyError:
        raise errors.UnsupportedFormatError(content_type) from None
