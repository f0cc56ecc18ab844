"""Lay out the queue engine's graph (seed 001) for an SVG drawing made on the server.

Queues are boxes, selectors are arrows from their queue to where they deliver (another
queue, a consumer, a job type, a bounce), dead-letter queues hang off dashed arrows.
Columns are the longest path from a queue nobody feeds, so the flow reads left to right.
"""

from __future__ import annotations

from typing import Any

COL_W, ROW_H, BOX_W, BOX_H, MARGIN = 250, 100, 180, 66, 20


def _dest_node(sel: dict[str, Any]) -> tuple[str, str, str]:
    """(key, kind, label) of a selector's destination."""
    kind = str(sel["dest_kind"])
    if kind == "queue" and sel.get("dest_key"):
        return str(sel["dest_key"]), "queue", str(sel["dest"])
    dest = str(sel.get("dest") or "")
    return f"{kind}:{sel['queue_key']}:{dest}", kind, f"{kind} {dest}".strip()


def layout(state: dict[str, Any]) -> dict[str, Any]:
    nodes: dict[str, dict[str, Any]] = {}
    for q in state["queues"]:
        nodes[q["key"]] = {"key": q["key"], "kind": "queue", "label": q["name"], "queue": q}
    edges: list[dict[str, Any]] = []
    for s in state["selectors"]:
        key, kind, label = _dest_node(s)
        nodes.setdefault(key, {"key": key, "kind": kind, "label": label, "queue": None})
        edges.append({"src": s["queue_key"], "dst": key, "selector": s, "dashed": False})
    for q in state["queues"]:
        if q.get("dead_letter"):
            prefix = q["key"][: len(q["key"]) - len(q["name"])]
            dst = prefix + str(q["dead_letter"])
            if dst in nodes:
                edges.append({"src": q["key"], "dst": dst, "selector": None, "dashed": True})
    column = _columns(nodes, edges)
    rows: dict[int, int] = {}
    for key in sorted(nodes, key=lambda k: (column[k], nodes[k]["kind"] != "queue", k)):
        c = column[key]
        r = rows.get(c, 0)
        rows[c] = r + 1
        nodes[key].update(x=MARGIN + c * COL_W, y=MARGIN + r * ROW_H, w=BOX_W, h=BOX_H)
    for e in edges:
        a, b = nodes[e["src"]], nodes[e["dst"]]
        e.update(x1=a["x"] + BOX_W, y1=a["y"] + BOX_H / 2, x2=b["x"], y2=b["y"] + BOX_H / 2)
        if b["x"] <= a["x"]:  # a back edge or same column: leave from the bottom
            e.update(x1=a["x"] + BOX_W / 2, y1=a["y"] + BOX_H, x2=b["x"] + BOX_W / 2, y2=b["y"])
        s = e["selector"]
        e["label"] = (
            f"{s['name']} · {s['mode']} · credits {s['credits']}/{s['granted']}"
            if s
            else "dead letters"
        )
        e["lx"] = (e["x1"] + e["x2"]) / 2
        e["ly"] = (e["y1"] + e["y2"]) / 2 - 6
    width = MARGIN * 2 + (max(column.values(), default=0) + 1) * COL_W
    height = MARGIN * 2 + max(rows.values(), default=1) * ROW_H
    return {"nodes": list(nodes.values()), "edges": edges, "width": width, "height": height}


def _columns(nodes: dict[str, dict[str, Any]], edges: list[dict[str, Any]]) -> dict[str, int]:
    """Longest path from a source, bounded by the node count so that cycles end."""
    column = dict.fromkeys(nodes, 0)
    forward = [e for e in edges if not e["dashed"] and e["src"] != e["dst"]]
    for _ in range(len(nodes)):
        changed = False
        for e in forward:
            if column[e["dst"]] < column[e["src"]] + 1 and column[e["src"]] + 1 < len(nodes):
                column[e["dst"]] = column[e["src"]] + 1
                changed = True
        if not changed:
            break
    for e in edges:  # a dead-letter queue sits one column right of the queues it serves
        if e["dashed"] and not any(f["dst"] == e["dst"] for f in forward):
            column[e["dst"]] = max(column[e["dst"]], column[e["src"]] + 1)
    return column
