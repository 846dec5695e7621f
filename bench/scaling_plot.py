#!/usr/bin/python3
"""Draws the scaling table (scaling_bench's JSON lines) as an SVG line plot:
aggregate GB/s each ps serves per direction against the number of clients,
one line per transport and ps count.

    bench/scaling_plot.py bench/out/scaling.jsonl bench/out/scaling.svg
"""
import json
import sys

rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
series = {}
for r in rows:
    series.setdefault((r["transport"], r["ps"]), []).append((r["clients"], r["gb_per_s_per_ps"]))

width, height, left, bottom, top, right = 640, 400, 60, 50, 30, 170
clients = sorted({r["clients"] for r in rows})
peak = max([r["gb_per_s_per_ps"] for r in rows] + [0.1]) * 1.1


def x(c):
    i = clients.index(c)
    return left + i * (width - left - right) / max(1, len(clients) - 1)


def y(v):
    return height - bottom - max(v, 0) / peak * (height - bottom - top)


colors = {("grpc", 1): "#999999", ("grpc", 2): "#444444", ("ucx", 1): "#6fa8dc", ("ucx", 2): "#0b5394"}
out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
       f'<rect width="{width}" height="{height}" fill="white"/>',
       f'<text x="{left}" y="18">push+pull of a 4 MiB model: GB/s each ps serves per direction</text>',
       f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="black"/>',
       f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="black"/>',
       f'<text x="{(left + width - right) / 2}" y="{height - 12}" text-anchor="middle">clients (processes)</text>']
for c in clients:
    out.append(f'<text x="{x(c)}" y="{height - bottom + 16}" text-anchor="middle">{c}</text>')
for i in range(6):
    v = peak * i / 5
    out.append(f'<text x="{left - 6}" y="{y(v) + 4}" text-anchor="end">{v:.1f}</text>')
    out.append(f'<line x1="{left}" y1="{y(v)}" x2="{width - right}" y2="{y(v)}" stroke="#eeeeee"/>')
for n, (key, points) in enumerate(sorted(series.items())):
    points.sort()
    color = colors.get(key, "black")
    path = " ".join(f"{x(c)},{y(v)}" for c, v in points)
    out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
    for c, v in points:
        out.append(f'<circle cx="{x(c)}" cy="{y(v)}" r="3" fill="{color}"/>')
    out.append(f'<line x1="{width - right + 15}" y1="{top + 20 * n}" x2="{width - right + 40}" y2="{top + 20 * n}" '
               f'stroke="{color}" stroke-width="2"/>')
    out.append(f'<text x="{width - right + 45}" y="{top + 20 * n + 4}">{key[0]}, {key[1]} ps</text>')
out.append("</svg>")
open(sys.argv[2], "w").write("\n".join(out) + "\n")
