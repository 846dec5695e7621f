#!/usr/bin/python3
"""Reads TensorBoard event files without shoal or TensorFlow.

The schema is built here from TensorFlow's field numbers (event.proto and
summary.proto), with python3-protobuf; the CRC32C is computed here too. For
each file under the folder given, it prints one JSON line: the path, the
records read, whether the last one was cut short, the file_version, and every
scalar as [tag, step, value]. Any bad CRC or unparsable record exits 1.

  read_tfevents.py DIR [--cut-copy]   # --cut-copy: also read a copy of each
                                      # file cut in the middle of its last record
"""
import json
import os
import struct
import sys

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def event_class():
    f = descriptor_pb2.FileDescriptorProto(name="tf_event_reader.proto", package="tensorflow", syntax="proto3")
    T = descriptor_pb2.FieldDescriptorProto
    value = f.message_type.add(name="Value")
    value.field.add(name="tag", number=1, type=T.TYPE_STRING, label=T.LABEL_OPTIONAL)
    value.field.add(name="simple_value", number=2, type=T.TYPE_FLOAT, label=T.LABEL_OPTIONAL)
    summary = f.message_type.add(name="Summary")
    summary.field.add(name="value", number=1, type=T.TYPE_MESSAGE, label=T.LABEL_REPEATED,
                      type_name=".tensorflow.Value")
    event = f.message_type.add(name="Event")
    event.field.add(name="wall_time", number=1, type=T.TYPE_DOUBLE, label=T.LABEL_OPTIONAL)
    event.field.add(name="step", number=2, type=T.TYPE_INT64, label=T.LABEL_OPTIONAL)
    event.field.add(name="file_version", number=3, type=T.TYPE_STRING, label=T.LABEL_OPTIONAL, oneof_index=0)
    event.field.add(name="summary", number=5, type=T.TYPE_MESSAGE, label=T.LABEL_OPTIONAL,
                    type_name=".tensorflow.Summary", oneof_index=0)
    event.oneof_decl.add(name="what")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return message_factory.MessageFactory(pool).GetPrototype(pool.FindMessageTypeByName("tensorflow.Event"))


Event = event_class()


def read(data, path):
    out = {"path": path, "records": 0, "truncated": False, "file_version": None, "scalars": []}
    at = 0
    while at < len(data):
        if len(data) - at < 12:
            out["truncated"] = True
            break
        header = data[at:at + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[at + 8:at + 12])
        if masked(crc32c(header)) != header_crc:
            sys.exit(f"{path}: bad length CRC at byte {at}")
        if len(data) - at < 12 + length + 4:
            out["truncated"] = True  # a killed writer's last record: TensorBoard drops it too
            break
        payload = data[at + 12:at + 12 + length]
        (payload_crc,) = struct.unpack("<I", data[at + 12 + length:at + 16 + length])
        if masked(crc32c(payload)) != payload_crc:
            sys.exit(f"{path}: bad data CRC at byte {at}")
        event = Event()
        event.ParseFromString(payload)
        if event.WhichOneof("what") == "file_version":
            out["file_version"] = event.file_version
        for v in event.summary.value:
            out["scalars"].append([v.tag, event.step, v.simple_value])
        out["records"] += 1
        at += 16 + length
    return out


def main():
    root = sys.argv[1]
    cut = "--cut-copy" in sys.argv
    for folder, _, files in sorted(os.walk(root)):
        for name in sorted(files):
            if not name.startswith("events.out.tfevents."):
                continue
            path = os.path.join(folder, name)
            data = open(path, "rb").read()
            print(json.dumps(read(data, path)))
            if cut:
                result = read(data[:len(data) - 3], path + " (cut)")
                print(json.dumps(result))


if __name__ == "__main__":
    main()
