#!/usr/bin/python3
"""An independent reader of TensorBoard event files (issue 44), for the tests:
the TFRecord framing (little-endian uint64 length, its masked CRC-32C, the
payload, the payload's masked CRC-32C) checked with Debian's python3-crc32c,
and every payload decoded by Debian's protoc against tfevents_check.proto
(TensorBoard's field numbers). Nothing of dflash-host's writer is used.

    read_tfevents.py EVENTS_FILE    → JSON on stdout:
    {"records": N, "file_version": "brain.Event:2", "torn_tail": false,
     "steps": [[step, wall_time, {tag: value, ...}], ...]}
Exit status 2 when a record's CRC does not match (a corrupt file, not a torn tail).
"""
import json
import os
import struct
import subprocess
import sys

import crc32c


def masked(data):
    c = crc32c.crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records(path):
    with open(path, "rb") as f:
        data = f.read()
    at, out = 0, []
    while at < len(data):
        if len(data) - at < 12:
            return out, True
        (length,) = struct.unpack_from("<Q", data, at)
        (length_crc,) = struct.unpack_from("<I", data, at + 8)
        if length_crc != masked(data[at:at + 8]):
            sys.exit(f"{path}: the length CRC of the record at byte {at} does not match")
        if len(data) - at - 16 < length:
            return out, True
        payload = data[at + 12:at + 12 + length]
        (payload_crc,) = struct.unpack_from("<I", data, at + 12 + length)
        if payload_crc != masked(payload):
            print(f"{path}: the payload CRC of the record at byte {at} does not match", file=sys.stderr)
            sys.exit(2)
        out.append(payload)
        at += 16 + length
    return out, False


def decode(payload, proto_dir):
    text = subprocess.run(["protoc", "--proto_path=" + proto_dir, "--decode=dflash_check.Event", "tfevents_check.proto"],
                          input=payload, capture_output=True, check=True, cwd=proto_dir).stdout.decode()
    event = {"step": 0, "wall_time": 0.0, "values": {}}
    tag = None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("wall_time:"):
            event["wall_time"] = float(line.split(":", 1)[1])
        elif line.startswith("step:"):
            event["step"] = int(line.split(":", 1)[1])
        elif line.startswith("file_version:"):
            event["file_version"] = json.loads(line.split(":", 1)[1].strip())
        elif line.startswith("tag:"):
            tag = json.loads(line.split(":", 1)[1].strip())
            event["values"][tag] = 0.0  # proto3 leaves a zero simple_value out
        elif line.startswith("simple_value:"):
            value = line.split(":", 1)[1].strip()
            event["values"][tag] = float(value) if value not in ("nan", "inf", "-inf") else float(value)
    return event


def main():
    path = sys.argv[1]
    proto_dir = os.path.dirname(os.path.abspath(__file__))
    payloads, torn = records(path)
    events = [decode(p, proto_dir) for p in payloads]
    result = {"records": len(events), "torn_tail": torn,
              "file_version": events[0].get("file_version") if events else None,
              "steps": [[e["step"], e["wall_time"], e["values"]] for e in events if "file_version" not in e]}
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
