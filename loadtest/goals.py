"""The goals BENCHMARKS.md judges by the load tests, as tables rendered from their result files
(tools/render_tables.py). Each figure is a ratio (or a difference) taken round by round from one
run's interleaved rounds: the n-th run of a case over the n-th run of its baseline, both measured
within the same minute. A table gives the median and the lowest and highest round, and calls a
goal met only where its worst round meets it (issue 66). The proxy's CPU per answer is the
primary figure; req/s, which this shared machine moves more, comes second.
"""

import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Figure:
    """One figure of a goal, round by round, and its bound where the goal sets one."""
    rounds: list
    unit: str  # "x": a ratio; "µs": a difference
    at_least: float = None
    at_most: float = None

    def worst(self):
        return min(self.rounds) if self.at_least is not None else max(self.rounds)

    def met(self):
        """Whether the worst round meets the bound (None: no bound)."""
        if self.at_least is not None:
            return self.worst() >= self.at_least
        if self.at_most is not None:
            return self.worst() <= self.at_most
        return None

    def text(self):
        def number(value):
            return f"{value:.2f}x" if self.unit == "x" else f"{value:+.1f} µs"
        low, high = min(self.rounds), max(self.rounds)
        bound = (f"; goal ≥ {number(self.at_least)}" if self.at_least is not None
                 else f"; goal ≤ {number(self.at_most)}" if self.at_most is not None else "")
        return f"{number(statistics.median(self.rounds))} ({number(low)} to {number(high)}){bound}"


def ratios(top, bottom):
    """Round by round: the n-th of `top` over the n-th of `bottom`."""
    if len(top) != len(bottom) or not top:
        raise ValueError(f"rounds differ: {len(top)} against {len(bottom)}")
    return [a / b for a, b in zip(top, bottom)]


def differences(top, bottom):
    if len(top) != len(bottom) or not top:
        raise ValueError(f"rounds differ: {len(top)} against {len(bottom)}")
    return [a - b for a, b in zip(top, bottom)]


HEADER = ["| goal | proxy CPU per answer, median (lowest to highest round) | req/s, median (lowest to highest) "
          "| wire bytes | rounds | met in every round |",
          "| --- | --- | --- | --- | ---: | :---: |"]


def line(goal, cpu, req_s, wire="–"):
    """A table line: `cpu` and `req_s` Figures (or None where the run lacks the cases), `wire` a
    (text, met) pair or "–"."""
    if cpu is None:
        return f"| {goal} | not in this run | | | | |"
    wire_text, wire_met = wire if isinstance(wire, tuple) else (wire, None)
    verdicts = [v for v in (cpu.met(), req_s.met() if req_s else None, wire_met) if v is not None]
    met = "yes" if verdicts and all(verdicts) else "no" if verdicts else ""
    return (f"| {goal} | {cpu.text()} | {req_s.text() if req_s else '–'} | {wire_text} | {len(cpu.rounds)} "
            f"| {met} |")


def wire_ratio(values, bases):
    """Wire bytes per answer against the baseline's, round by round: not more in any round."""
    rounds = ratios(values, bases)
    low, high = min(rounds), max(rounds)
    text = f"{low:.3f}x" if f"{low:.3f}" == f"{high:.3f}" else f"{low:.3f}x to {high:.3f}x"
    return text, high <= 1


# The defaults against the stock compressors (bench.py's results.json): (goal, variant, baseline,
# least CPU ratio: baseline's CPU per answer over the variant's) on the mix ...
AGAINST_STOCK = [
    ("nginx defaults: the mix at most 1/2.2 of nginx gzip 6's CPU per answer, no more wire bytes",
     "nginx-rpcedge-default", "nginx-gzip6", 2.2),
    ("native Envoy defaults: the mix at most 1/1.5 of Envoy's compressor's CPU per answer, no more wire bytes",
     "envoy-rpcedge-native-default", "envoy-gzip", 1.5),
    ("Wasm Envoy defaults: the mix at most 1/1.2 of Envoy's compressor's CPU per answer, no more wire bytes",
     "envoy-rpcedge-wasm-default", "envoy-gzip", 1.2),
]
# ... and (goal, variant, bare proxy, most µs more) on answers it leaves untouched (small)
UNTOUCHED = [
    ("nginx defaults: untouched answers within 5 µs of bare nginx's CPU", "nginx-rpcedge-default", "nginx", 5),
    ("native Envoy defaults: untouched answers within 10 µs of bare Envoy's CPU",
     "envoy-rpcedge-native-default", "envoy", 10),
    ("Wasm Envoy defaults: untouched answers within 20 µs of bare Envoy's CPU", "envoy-rpcedge-wasm-default",
     "envoy", 20),
]


def defaults_table(results):
    rows = {(row["variant"], row["scenario"]): row for row in results["rows"]}
    lines = list(HEADER)
    for goal, variant, baseline, least in AGAINST_STOCK:
        ours, theirs = rows.get((variant, "mix")), rows.get((baseline, "mix"))
        if not ours or not theirs:
            lines.append(line(goal, None, None))
            continue
        lines.append(line(goal, Figure(ratios(theirs["cpu_us_runs"], ours["cpu_us_runs"]), "x", at_least=least),
                          Figure(ratios(ours["req_s_runs"], theirs["req_s_runs"]), "x"),
                          wire_ratio(ours["wire_bytes_runs"], theirs["wire_bytes_runs"])))
    for goal, variant, bare, most in UNTOUCHED:
        ours, theirs = rows.get((variant, "small")), rows.get((bare, "small"))
        if not ours or not theirs:
            lines.append(line(goal, None, None))
            continue
        lines.append(line(goal, Figure(differences(ours["cpu_us_runs"], theirs["cpu_us_runs"]), "µs", at_most=most),
                          Figure(ratios(ours["req_s_runs"], theirs["req_s_runs"]), "x")))
    return lines


# cache_bench.py's hosts and the case in which each serves a hit's bytes without rpcedge
HIT_HOSTS = {"nginx": "nginx", "envoy-native": "the native Envoy module", "envoy": "the Envoy Wasm filter",
             "openresty": "OpenResty's Lua binding", "openresty-proxied": "OpenResty's Lua binding, proxy_pass form"}
BARE = ("static file (gzip_static)", "direct_response")
HIT_CPU = 1.5  # a hit within 1.5x the CPU of the same bytes served without rpcedge
CODINGS = ("gzip", "zstd", "br", "identity")


def per_run(row, key):
    return [run[key] for run in row["runs"]]


def hit_line(goal, hit, bare):
    if not hit or not bare:
        return line(goal, None, None)
    return line(goal, Figure(ratios(per_run(hit, "cpu_us"), per_run(bare, "cpu_us")), "x", at_most=HIT_CPU),
                Figure(ratios(per_run(hit, "req_s"), per_run(bare, "req_s")), "x"), "the same bytes")


def cache_table(results):
    """Each hit against the same bytes served without rpcedge (a static file; Envoy: a
    direct_response), at most HIT_CPU times its CPU; the warm mix against bare nginx."""
    rows = {(row["proxy"], row["case"]): row for row in results["rows"]}
    lines = list(HEADER)
    for host, name in HIT_HOSTS.items():
        bare = next((rows[(host, case)] for case in BARE if (host, case) in rows), None)
        for case, where in (("hit, hot tier", "from the hot tier"), ("hit", "from the daemon")):
            if host.startswith("openresty") and case == "hit, hot tier":
                continue  # the Lua binding keeps no hot tier
            lines.append(hit_line(f"{name}: the mix's hits {where}", rows.get((host, case)), bare))
    for host in ("nginx", "envoy-native"):
        bare = "static file" if host == "nginx" else "direct_response"
        for coding in CODINGS:
            for case, where in (("big hit, hot tier", "from the hot tier"), ("big hit", "from the daemon")):
                # these cases count the daemon's CPU with the proxy's, the bare case's (idle) too
                lines.append(hit_line(f"{HIT_HOSTS[host]}: hits of 100 KiB and more {where}, {coding} "
                                      "(proxy and daemon CPU)",
                                      rows.get((host, f"{case}, {coding}")), rows.get((host, f"big {bare}, {coding}"))))
    for delay in sorted({row["call_delay_ms"] for row in results["rows"] if "call_delay_ms" in row}):
        case = f"warm mix, node {delay} ms"
        warm, bare = rows.get(("nginx + rpcedge, cache warm", case)), rows.get(("bare nginx", case))
        goal = f"nginx: the load test's mix, cache warm, node {delay} ms per call: more req/s than bare nginx, fewer bytes"
        if not warm or not bare:
            lines.append(line(goal, None, None))
            continue
        lines.append(line(goal, Figure(ratios(per_run(warm, "cpu_us"), per_run(bare, "cpu_us")), "x"),
                          Figure(ratios(per_run(warm, "req_s"), per_run(bare, "req_s")), "x", at_least=1),
                          wire_ratio(per_run(warm, "body_bytes"), per_run(bare, "body_bytes"))))
    return lines


# fleet_bench.py's fleet.json: Redis's memory per entry against the smallest form a host keeps of
# it, and a fleet hit's CPU against a local daemon hit's (proxy, daemon and Redis), per coding. A
# round's figure adds the proxy's n-th round to the daemon's n-th, which ran minutes apart: within
# each part the rounds are interleaved, across the two they are paired by number only.
FLEET_BYTES = 1.2
FLEET_CPU = 2


def fleet_table(results):
    lines = ["| goal | measured | rounds | met in every round |", "| --- | --- | ---: | :---: |"]
    memory = results.get("memory", {})
    goal = f"Redis memory per entry at most {FLEET_BYTES}x the smallest form the host keeps of it"
    if "used_memory_to_smallest_form" in memory:
        ratio = memory["used_memory_to_smallest_form"]
        lines.append(f"| {goal} | {memory['used_memory_bytes_per_entry']:,.0f} B per entry against "
                     f"{memory['smallest_form_bytes_mean']:,.0f} B, {ratio:.2f}x ({memory['entries']:,} entries) | – "
                     f"| {'yes' if ratio <= FLEET_BYTES else 'no'} |")
    else:
        lines.append(f"| {goal} | not in this run | | |")
    codings = results.get("together", {}).get("codings", {})
    for coding in CODINGS:
        goal = f"{coding} clients: a fleet hit within {FLEET_CPU}x the CPU of a local daemon hit (proxy, daemon, Redis)"
        if coding not in codings:
            lines.append(f"| {goal} | not in this run | | |")
            continue
        figures = codings[coding]
        ratio = Figure(figures["ratio_rounds"], "x", at_most=FLEET_CPU)
        lines.append(f"| {goal} | {figures['fleet_hit_cpu_us']:.0f} µs against {figures['local_hit_cpu_us']:.0f} µs "
                     f"(medians): {ratio.text()} | {len(ratio.rounds)} | {'yes' if ratio.met() else 'no'} |")
    return lines
