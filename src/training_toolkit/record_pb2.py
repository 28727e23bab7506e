"""sagemaker_training.record_pb2: the recordio-protobuf messages (package
`aialgs.data`, proto2), as protobuf message classes.

The schema, written below field by field as a FileDescriptorProto (the
reference compiles record.proto with protoc; this is the same schema):

    message Float32Tensor { repeated float  values = 1 [packed=true];
                            repeated uint64 keys   = 2 [packed=true];
                            repeated uint64 shape  = 3 [packed=true]; }
    message Float64Tensor { repeated double values = 1 [packed=true]; keys, shape as above }
    message Int32Tensor   { repeated int32  values = 1 [packed=true]; keys, shape as above }
    message Bytes         { repeated bytes value = 1; optional string content_type = 2; }
    message Value         { oneof value { Float32Tensor float32_tensor = 2;
                                          Float64Tensor float64_tensor = 3;
                                          Int32Tensor int32_tensor = 7;
                                          Bytes bytes = 9; } }
    message Record        { map<string, Value> features = 1; map<string, Value> label = 2;
                            optional string uid = 3; optional string metadata = 4;
                            optional string configuration = 5; }

The file goes into a private DescriptorPool, not protobuf's default one: the
reference's record_pb2 adds "record.proto" and "aialgs.data.*" to the default
pool, as may any other package that ships this schema, and adding them there
twice raises. In a pool of our own, both modules import in one process, in
either order. The classes are still real protobuf messages (same full names,
same bytes); only a lookup in the default pool (symbol_database.Default())
finds the reference's, not ours.

protobuf is needed here only: install `training-toolkit[recordio]`.
"""
try:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
except ImportError as e:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError("training_toolkit.record_pb2 (recordio-protobuf) needs protobuf: "
                      "pip install 'training-toolkit[recordio]' (or protobuf)") from e

_FIELD = descriptor_pb2.FieldDescriptorProto
_PACKAGE = "aialgs.data"


def _add(message, name, number, type_, repeated=False, type_name=None, packed=False,
         oneof=None):
    field = message.field.add(name=name, number=number, type=type_,
                              label=_FIELD.LABEL_REPEATED if repeated else _FIELD.LABEL_OPTIONAL)
    if type_name:
        field.type_name = ".%s.%s" % (_PACKAGE, type_name)
    if packed:
        field.options.packed = True
    if oneof is not None:
        field.oneof_index = oneof
    return field


def _file():
    f = descriptor_pb2.FileDescriptorProto(name="record.proto", package=_PACKAGE,
                                           syntax="proto2")
    f.options.java_package = "com.amazonaws.aialgorithms.proto"
    f.options.java_outer_classname = "RecordProtos"
    for name, values in (("Float32Tensor", _FIELD.TYPE_FLOAT),
                         ("Float64Tensor", _FIELD.TYPE_DOUBLE),
                         ("Int32Tensor", _FIELD.TYPE_INT32)):
        tensor = f.message_type.add(name=name)
        _add(tensor, "values", 1, values, repeated=True, packed=True)
        _add(tensor, "keys", 2, _FIELD.TYPE_UINT64, repeated=True, packed=True)
        _add(tensor, "shape", 3, _FIELD.TYPE_UINT64, repeated=True, packed=True)

    bytes_ = f.message_type.add(name="Bytes")
    _add(bytes_, "value", 1, _FIELD.TYPE_BYTES, repeated=True)
    _add(bytes_, "content_type", 2, _FIELD.TYPE_STRING)

    value = f.message_type.add(name="Value")
    value.oneof_decl.add(name="value")
    for name, number, type_name in (("float32_tensor", 2, "Float32Tensor"),
                                    ("float64_tensor", 3, "Float64Tensor"),
                                    ("int32_tensor", 7, "Int32Tensor"), ("bytes", 9, "Bytes")):
        _add(value, name, number, _FIELD.TYPE_MESSAGE, type_name=type_name, oneof=0)

    record = f.message_type.add(name="Record")
    for name, number in (("features", 1), ("label", 2)):
        # map<string, Value>: a repeated nested entry message, as protoc writes it.
        entry = record.nested_type.add(name=name.capitalize() + "Entry")
        entry.options.map_entry = True
        _add(entry, "key", 1, _FIELD.TYPE_STRING)
        _add(entry, "value", 2, _FIELD.TYPE_MESSAGE, type_name="Value")
        _add(record, name, number, _FIELD.TYPE_MESSAGE, repeated=True,
             type_name="Record." + entry.name)
    for name, number in (("uid", 3), ("metadata", 4), ("configuration", 5)):
        _add(record, name, number, _FIELD.TYPE_STRING)
    return f


def _message_class(descriptor):
    try:
        cls = message_factory.GetMessageClass(descriptor)  # protobuf >= 4.22 (3.22 on 3.x)
    except AttributeError:
        cls = message_factory.MessageFactory(descriptor.file.pool).GetPrototype(descriptor)
    cls.__module__ = __name__  # where pickle finds the class again
    return cls


_pool = descriptor_pool.DescriptorPool()
_pool.AddSerializedFile(_file().SerializeToString())
DESCRIPTOR = _pool.FindFileByName("record.proto")

Float32Tensor = _message_class(DESCRIPTOR.message_types_by_name["Float32Tensor"])
Float64Tensor = _message_class(DESCRIPTOR.message_types_by_name["Float64Tensor"])
Int32Tensor = _message_class(DESCRIPTOR.message_types_by_name["Int32Tensor"])
Bytes = _message_class(DESCRIPTOR.message_types_by_name["Bytes"])
Value = _message_class(DESCRIPTOR.message_types_by_name["Value"])
Record = _message_class(DESCRIPTOR.message_types_by_name["Record"])
