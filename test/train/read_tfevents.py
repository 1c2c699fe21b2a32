#!/usr/bin/env python3
"""Reads TensorBoard event files and prints their scalar events as JSON, for test_tensorboard.

Written from the formats' specifications, not from dtrain's writer: TFRecord framing (uint64 LE
length, uint32 LE masked CRC-32C of the length, data, uint32 LE masked CRC-32C of the data) and
the protobuf wire format, decoded generically (unknown fields are skipped), applied to
tensorflow.Event / Summary / TensorProto / SummaryMetadata field numbers. Standard library only.
Usage: read_tfevents.py PATH...   (event files, or folders whose events.out.tfevents.* are read
in name order). Exits 1 naming the file and offset at the first bad CRC, truncated record or
malformed protobuf.
"""
import json
import os
import struct
import sys


def crc32c(data):
    """CRC-32C (Castagnoli): reflected polynomial 0x82F63B78, init and final XOR 0xFFFFFFFF."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data):
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


class FormatError(Exception):
    pass


def read_varint(buf, pos):
    result, shift = 0, 0
    while True:
        if pos >= len(buf):
            raise FormatError("varint runs past the end")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise FormatError("varint longer than 10 bytes")


def fields(buf):
    """Every (field number, wire type, value) of a message, in order. Length-delimited values
    are bytes, fixed ones raw little-endian bytes, varints integers. Groups are refused."""
    pos, out = 0, []
    while pos < len(buf):
        key, pos = read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise FormatError("field number 0")
        if wire == 0:
            value, pos = read_varint(buf, pos)
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            if pos + size > len(buf):
                raise FormatError("fixed field runs past the end")
            value, pos = buf[pos:pos + size], pos + size
        elif wire == 2:
            size, pos = read_varint(buf, pos)
            if pos + size > len(buf):
                raise FormatError("length-delimited field runs past the end")
            value, pos = buf[pos:pos + size], pos + size
        else:
            raise FormatError("unsupported wire type %d" % wire)
        out.append((number, wire, value))
    return out


def last(msg, number, default=None):
    found = [v for n, _, v in msg if n == number]
    return found[-1] if found else default


def repeated_floats(msg, number, fmt, size, unpacked_wire):
    """A repeated float/double field, packed (one length-delimited run) or not."""
    values = []
    for n, wire, v in msg:
        if n != number:
            continue
        if wire == 2:
            if len(v) % size:
                raise FormatError("packed run of %d bytes" % len(v))
            values += [x[0] for x in struct.iter_unpack("<" + fmt, v)]
        elif wire == unpacked_wire:
            values.append(struct.unpack("<" + fmt, v)[0])
    return values


def decode_tensor(buf):
    msg = fields(buf)
    dtype = last(msg, 1, 0)
    shape = fields(last(msg, 2, b""))  # TensorShapeProto: dim = 2 (repeated)
    rank = sum(1 for n, _, _ in shape if n == 2)
    if dtype == 1:  # DT_FLOAT: float_val = 5, or tensor_content = 4
        values = repeated_floats(msg, 5, "f", 4, 5)
        content = last(msg, 4)
        if not values and content:
            values = [x[0] for x in struct.iter_unpack("<f", content)]
    elif dtype == 2:  # DT_DOUBLE: double_val = 6
        values = repeated_floats(msg, 6, "d", 8, 1)
    else:
        raise FormatError("tensor of dtype %d is not a scalar summary" % dtype)
    if len(values) != 1:
        raise FormatError("tensor holds %d values, not one" % len(values))
    return {"dtype": dtype, "rank": rank, "value": values[0]}


def decode_metadata(buf):
    msg = fields(buf)
    plugin = fields(last(msg, 1, b""))  # PluginData {plugin_name = 1, content = 2}
    return {"plugin": last(plugin, 1, b"").decode("utf-8"), "data_class": last(msg, 4, 0)}


def decode_value(buf):
    msg = fields(buf)
    out = {"tag": last(msg, 1, b"").decode("utf-8")}
    if last(msg, 2) is not None:  # simple_value (fixed32)
        out.update(kind="simple_value", value=struct.unpack("<f", last(msg, 2))[0])
    elif last(msg, 8) is not None:
        out.update(kind="tensor", **decode_tensor(last(msg, 8)))
    else:
        raise FormatError("value %r has neither simple_value nor tensor" % out["tag"])
    if last(msg, 9) is not None:
        out.update(decode_metadata(last(msg, 9)))
    return out


def decode_event(buf):
    msg = fields(buf)
    wall = last(msg, 1)
    event = {"wall_time": struct.unpack("<d", wall)[0] if wall else 0.0,
             "step": last(msg, 2, 0), "values": []}
    if event["step"] >= 1 << 63:
        event["step"] -= 1 << 64  # int64 as two's complement
    if last(msg, 3) is not None:
        event["file_version"] = last(msg, 3).decode("utf-8")
    summary = last(msg, 5)
    if summary is not None:
        event["values"] = [decode_value(v) for n, _, v in fields(summary) if n == 1]
    return event


def read_records(data, path):
    pos = 0
    while pos < len(data):
        if pos + 12 > len(data):
            raise FormatError("%s: offset %d: truncated record header" % (path, pos))
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        if masked_crc32c(header) != length_crc:
            raise FormatError("%s: offset %d: length CRC mismatch" % (path, pos))
        start, end = pos + 12, pos + 12 + length
        if end + 4 > len(data):
            raise FormatError("%s: offset %d: truncated record of %d bytes" % (path, pos, length))
        body = data[start:end]
        (data_crc,) = struct.unpack("<I", data[end:end + 4])
        if masked_crc32c(body) != data_crc:
            raise FormatError("%s: offset %d: data CRC mismatch" % (path, pos))
        yield pos, body
        pos = end + 4


def read_file(path):
    with open(path, "rb") as f:
        data = f.read()
    events = []
    for offset, body in read_records(data, path):
        try:
            events.append(decode_event(body))
        except (FormatError, struct.error, UnicodeDecodeError) as e:
            raise FormatError("%s: offset %d: bad Event: %s" % (path, offset, e))
    return {"path": path, "name": os.path.basename(path), "events": events}


def main(argv):
    assert crc32c(b"123456789") == 0xE3069283  # the standard check value
    paths = []
    for arg in argv:
        if os.path.isdir(arg):
            paths += [os.path.join(arg, n) for n in sorted(os.listdir(arg))
                      if n.startswith("events.out.tfevents.")]
        else:
            paths.append(arg)
    try:
        result = {"files": [read_file(p) for p in paths]}
    except (FormatError, OSError) as e:
        print("read_tfevents: %s" % e, file=sys.stderr)
        return 1
    json.dump(result, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
