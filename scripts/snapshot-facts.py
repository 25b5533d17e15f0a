#!/usr/bin/env python3
"""Figures of PyTorch memory snapshots computed from the pickle alone, as expected values for gpuheap's tests
(cli/tests/pools_and_history.rs): no gpuheap code, a plain Unpickler whose find_class refuses every global.

    scripts/snapshot-facts.py FILE...

Per device: history entries; the peak of live requested bytes and the first event after which it is reached
(blocks alive before the first event: final-state live blocks the history does not create, plus blocks freed
before any alloc of theirs); PyTorch's peak reserved bytes from the segment events (initial segments = final
state + frees - allocs of the history, counted by address) and the first event reaching it; per memory pool
(`segment_pool_id`) of the final state: segments, reserved, allocated (blocks not `inactive`), hole bytes
(`inactive` blocks) and the largest hole; every run of segment_free/segment_unmap events with its bytes, the
reserved bytes before it, the event after it, and what its frames name (`empty_cache`/`emptyCache`, or
`DeviceCachingAllocator::malloc`).
"""
import json
import pickle
import sys


class Plain(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refused global {module}.{name}")


def caller(frames):
    names = [f.get("name", "") for f in frames or []]
    if any(n == "empty_cache" or "emptyCache" in n for n in names):
        return "empty_cache"
    if any("CachingAllocator::malloc" in n or "release_cached_blocks" in n for n in names):
        return "malloc"
    return None


def device_facts(segments, trace):
    live_final = {b["address"]: b for s in segments for b in s["blocks"] if b["state"] != "inactive"}
    # Initial blocks: freed before any alloc in the history, or live at the end and not created by it.
    live, initial, allocated = {}, 0, set()
    for e in trace:
        a = e["addr"]
        if e["action"] == "alloc":
            live[a] = e["size"]
            allocated.add(a)
        elif e["action"] == "free_completed":
            if a in live:
                del live[a]
            else:
                initial += e["size"]
    initial += sum(b["requested_size"] for a, b in live_final.items() if a not in live)
    cur, peak_live, peak_live_event = initial, initial, None
    sizes = {}
    for i, e in enumerate(trace):
        if e["action"] == "alloc":
            sizes[e["addr"]] = e["size"]
            cur += e["size"]
            if cur > peak_live:
                peak_live, peak_live_event = cur, i
        elif e["action"] == "free_completed":
            cur -= sizes.pop(e["addr"], e["size"])
    final_reserved = sum(s["total_size"] for s in segments)
    delta = sum(e["size"] if e["action"] in ("segment_alloc", "segment_map") else -e["size"]
                for e in trace if e["action"] in ("segment_alloc", "segment_map", "segment_free", "segment_unmap"))
    r = final_reserved - delta
    peak_res, peak_res_event, before = r, None, []
    for i, e in enumerate(trace):
        before.append(r)
        if e["action"] in ("segment_alloc", "segment_map"):
            r += e["size"]
        elif e["action"] in ("segment_free", "segment_unmap"):
            r -= e["size"]
        if r > peak_res:
            peak_res, peak_res_event = r, i
    pools = {}
    for s in segments:
        p = pools.setdefault(str(tuple(s.get("segment_pool_id", (0, 0)))),
                             {"segments": 0, "reserved": 0, "allocated": 0, "hole_bytes": 0, "largest_hole": 0})
        p["segments"] += 1
        p["reserved"] += s["total_size"]
        for b in s["blocks"]:
            if b["state"] == "inactive":
                p["hole_bytes"] += b["size"]
                p["largest_hole"] = max(p["largest_hole"], b["size"])
            else:
                p["allocated"] += b["size"]
    runs, i = [], 0
    while i < len(trace):
        if trace[i]["action"] in ("segment_free", "segment_unmap"):
            j = i
            while j + 1 < len(trace) and trace[j + 1]["action"] in ("segment_free", "segment_unmap"):
                j += 1
            nxt = trace[j + 1] if j + 1 < len(trace) else None
            runs.append({
                "first": i, "last": j, "bytes": sum(e["size"] for e in trace[i:j + 1]),
                "reserved_before": before[i],
                "next": (j + 1, nxt["action"], nxt["size"]) if nxt else None,
                "callers": sorted({str(caller(e.get("frames"))) for e in trace[i:j + 1]}),
            })
            i = j + 1
        else:
            i += 1
    return {
        "entries": len(trace), "peak_live": peak_live, "peak_live_event": peak_live_event,
        "initial_reserved": final_reserved - delta, "peak_reserved": peak_res, "peak_reserved_event": peak_res_event,
        "final_reserved": final_reserved, "pools": pools, "releases": runs,
    }


def main():
    for path in sys.argv[1:]:
        with open(path, "rb") as f:
            snap = Plain(f).load()
        if isinstance(snap, list):
            snap = {"segments": snap, "device_traces": []}
        traces = snap.get("device_traces") or []
        devices = sorted({s.get("device", 0) for s in snap["segments"]} | {d for d, t in enumerate(traces) if t})
        out = {d: device_facts([s for s in snap["segments"] if s.get("device", 0) == d],
                               traces[d] if d < len(traces) else []) for d in devices}
        print(json.dumps({"file": path.rsplit("/", 1)[-1], "devices": out}, indent=1))


if __name__ == "__main__":
    main()
