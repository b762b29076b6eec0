#!/usr/bin/env python3
"""Renders an A/B report.html in headless Chromium and checks that its charts
drew: every arm's line colour must cover enough pixels of the screenshot.

    scripts/check_report_render.py REPORT.html ARM_COUNT [--screenshot OUT.png]

Exit status 0 when every expected colour is present, 1 when a chart did not
render, 2 on bad usage or a missing Chromium. Standard library only (the PNG
is decoded here with zlib).
"""
import argparse
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

# The series colours of core/ab/ab_report.cpp, in order.
COLOURS = [(0x1f, 0x77, 0xb4), (0xd6, 0x27, 0x28), (0x2c, 0xa0, 0x2c), (0x94, 0x67, 0xbd),
           (0xff, 0x7f, 0x0e), (0x17, 0xbe, 0xcf), (0x8c, 0x56, 0x4b), (0xe3, 0x77, 0xc2)]


def decode_png(data):
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, width, height, channels = 8, b"", 0, 0, 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            if depth != 8 or colour not in (2, 6):
                raise ValueError("unexpected PNG format (depth %d, colour type %d)" % (depth, colour))
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
    raw = zlib.decompress(idat)
    stride = width * channels
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            a = line[x - channels] if x >= channels else 0
            b = prev[x]
            c = prev[x - channels] if x >= channels else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        prev = line
    return width, height, channels, rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("report")
    ap.add_argument("arms", type=int)
    ap.add_argument("--screenshot")
    ap.add_argument("--min-pixels", type=int, default=40)
    args = ap.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        print("chromium is not installed (Debian: apt-get install chromium)", file=sys.stderr)
        return 2
    shot = args.screenshot or os.path.join(tempfile.mkdtemp(), "report.png")
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--force-device-scale-factor=1", "--window-size=1100,2600", "--screenshot=" + shot,
                    "file://" + os.path.abspath(args.report)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
    width, height, channels, rows = decode_png(open(shot, "rb").read())
    counts = [0] * args.arms
    for line in rows:
        for x in range(0, width * channels, channels):
            px = (line[x], line[x + 1], line[x + 2])
            for i in range(args.arms):
                c = COLOURS[i % len(COLOURS)]
                if abs(px[0] - c[0]) + abs(px[1] - c[1]) + abs(px[2] - c[2]) < 40:
                    counts[i] += 1
    print("screenshot %s (%dx%d): pixels per arm colour %s" % (shot, width, height, counts))
    if any(n < args.min_pixels for n in counts):
        print("a chart did not render: some arm's colour covers fewer than %d pixels" % args.min_pixels, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
