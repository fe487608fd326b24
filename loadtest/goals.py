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
    unit: str  # "x": a ratio; "µs": a difference; another: a quantity in that unit
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
            return (f"{value:.2f}x" if self.unit == "x" else f"{value:+.1f} µs" if self.unit == "µs"
                    else f"{value:.2f} {self.unit}")
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


def against_line(goal, ours, theirs, least):
    """A variant's row (`ours`) against its baseline's (`theirs`), round by round: the baseline's
    CPU per answer over the variant's (at least `least`; None: shown, no goal, and no verdict on
    the bytes either), req/s, wire bytes."""
    if not ours or not theirs:
        return line(goal, None, None)
    wire_text, wire_met = wire_ratio(ours["wire_bytes_runs"], theirs["wire_bytes_runs"])
    return line(goal, Figure(ratios(theirs["cpu_us_runs"], ours["cpu_us_runs"]), "x", at_least=least),
                Figure(ratios(ours["req_s_runs"], theirs["req_s_runs"]), "x"),
                (wire_text, wire_met if least is not None else None))


def defaults_table(results):
    rows = {(row["variant"], row["scenario"]): row for row in results["rows"]}
    lines = list(HEADER)
    for goal, variant, baseline, least in AGAINST_STOCK:
        lines.append(against_line(goal, rows.get((variant, "mix")), rows.get((baseline, "mix")), least))
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
LUA_CPU = 1.1  # OpenResty's binding asks the daemon what the C module asks it: within a tenth of its cost


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
    for host in ("openresty", "openresty-proxied"):
        # issue 28: the Lua binding's daemon hit against the C module's, in the same round
        lua, c_module = rows.get((host, "hit")), rows.get(("nginx", "hit"))
        goal = f"{HIT_HOSTS[host]}: a hit from the daemon within {LUA_CPU}x the CPU of the nginx module's"
        lines.append(line(goal, Figure(ratios(per_run(lua, "cpu_us"), per_run(c_module, "cpu_us")), "x",
                                       at_most=LUA_CPU), Figure(ratios(per_run(lua, "req_s"), per_run(c_module, "req_s")), "x"),
                          "the same bytes") if lua and c_module else line(goal, None, None))
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
    lines.append(three_hosts_line(results.get("hosts")))
    return lines


PLAIN = ["| goal | measured | rounds | met in every round |", "| --- | --- | ---: | :---: |"]


def verdict(met):
    return "" if met is None else "yes" if met else "no"


# the three hosts of fleet_bench.py: what B and C ask the node once A has stored the mix
def three_hosts_line(hosts):
    goal = "three hosts: B and C send the node no cacheable call that A stored"
    if not hosts:
        return f"| {goal} | not in this run | | |"
    fleet, alone = hosts["with the fleet"], hosts["without the fleet"]
    stored = fleet["A"]["daemon_fleet_counters"]["fleet_stores_total"]
    # of the node requests A made, those of calls A did not store into the fleet may reach the node again
    allowed = fleet["A"]["node_requests"] - stored
    others = [fleet[host]["node_requests"] for host in ("B", "C")]
    return (f"| {goal} | node requests of the mix through B and C: {others[0]:,} and {others[1]:,} with the fleet "
            f"(A's {fleet['A']['node_requests']:,} less the {stored:,} it stored: {allowed:,}), "
            f"{alone['B']['node_requests']:,} and {alone['C']['node_requests']:,} without | – "
            f"| {verdict(max(others) <= allowed)} |")


# batch_bench.py: a batch of CALLS calls all cached against the cache off, per host and node delay.
# Each cell's runs follow one another, the cases one after another: rounds are paired by number.
BATCH_REQ_S = 10
BATCH_HOSTS = {"nginx": "nginx", "envoy": "the Envoy Wasm filter", "envoy-native": "the native Envoy module"}


def batch_table(results):
    rows = {(row["host"], row["call_delay_ms"], row["case"]): row for row in results["rows"]}
    lines = list(HEADER)
    for host, name in BATCH_HOSTS.items():
        for delay in sorted({row["call_delay_ms"] for row in results["rows"]}):
            cached, off = rows.get((host, delay, "all cached")), rows.get((host, delay, "cache off"))
            goal = (f"{name}, node {delay} ms per call: a batch of {results['calls']} calls, all cached, at least "
                    f"{BATCH_REQ_S}x the req/s of the cache off")
            if not cached or not off:
                lines.append(line(goal, None, None))
                continue
            lines.append(line(goal, Figure(ratios(per_run(off, "cpu_us"), per_run(cached, "cpu_us")), "x"),
                              Figure(ratios(per_run(cached, "req_s"), per_run(off, "req_s")), "x",
                                     at_least=BATCH_REQ_S)))
    return lines


# herd_bench.py: CLIENTS at once for one block not yet stored, coalescing on (the default lock
# timeout) and off (0), a block per round
def herd_table(results):
    lines = list(PLAIN)
    rows = {(row["host"], row["lock_timeout_ms"]): row for row in results["rows"]}
    for host, name in BATCH_HOSTS.items():
        on = next((row for (h, timeout), row in rows.items() if h == host and timeout > 0), None)
        off = rows.get((host, 0))
        goal = f"{name}: clients at once for one block not yet stored reach the node once"
        if not on:
            lines.append(f"| {goal} | not in this run | | |")
            continue
        goal = f"{name}: {on['clients']} clients at once for one block not yet stored reach the node once"
        counts = on["node_requests_per_round"]
        right = on["every_answer_right"]
        # coalescing off is the comparison: an answer not right there is shown, not judged here
        without = (f" (coalescing off: {', '.join(map(str, off['node_requests_per_round']))}"
                   f"{'' if off['every_answer_right'] else ', **not every answer right**'})" if off else "")
        lines.append(f"| {goal} | node requests per block: {', '.join(map(str, counts))}; "
                     f"{'every answer right' if right else '**an answer wrong**'}{without} | {len(counts)} "
                     f"| {verdict(max(counts) == 1 and right)} |")
    return lines


# scan_bench.py: the hot set's hit rate during a scan of cold keys over its rate before it
SCAN_KEPT = 0.9


def scan_table(results):
    workload, runs = results["workload"], results["runs"]
    kept = {policy: [run["kept"] for run in policy_runs] for policy, policy_runs in runs.items()}
    goal = (f"a scan of {workload['scan']:,} cold keys at {workload['scan_per_s']:,} a second leaves the hot set's "
            f"({workload['hot']:,} keys, {workload['hot_per_s']} a second) hit rate at least {SCAN_KEPT} of its rate "
            "before it")
    lines = list(PLAIN)
    for policy, name in (("protected", "with the protected share"), ("fifo", "first in, first out")):
        if policy not in kept:
            lines.append(f"| {goal}: {name} | not in this run | | |")
            continue
        lowest, highest = min(kept[policy]), max(kept[policy])
        spread = f"{lowest:.2f}" if f"{lowest:.2f}" == f"{highest:.2f}" else f"{lowest:.2f} to {highest:.2f}"
        met = lowest >= SCAN_KEPT if policy == "protected" else None  # first in, first out: for comparison
        lines.append(f"| {goal}: {name} | {spread} | {len(kept[policy])} | {verdict(met)} |")
    return lines


# cached_bench.py: the daemon's store with the WAL off against on, a run of each per round
def wal_table(results):
    off, on = results["runs"]["off"], results["runs"]["on"]
    lines = list(PLAIN)
    for goal, key in (("the daemon writes without the WAL: puts/s, off over on", "puts_s"),
                      ("the daemon writes without the WAL: disk bytes per payload byte, off over on",
                       "bytes_per_payload_byte")):
        figure = Figure(ratios([run[key] for run in off], [run[key] for run in on]), "x")
        lines.append(f"| {goal} | {figure.text()} | {len(off)} | |")
    return lines


# witness_bench.py: a big witness over the shaped link, and many SSZ clients of it at once
def witness_table(results):
    lines = list(PLAIN)
    link = results.get("link", {})
    by_way = {(row["host"], row["size_mb"], row["way"]): row for row in link.get("rows", [])}
    for (host, size, way), row in by_way.items():
        if way != "ssz" or (host, size, "json") not in by_way:
            continue
        json_row = by_way[(host, size, "json")]
        sooner = json_row["seconds"] / row["seconds"]
        lines.append(f"| {host}: a {size} MB witness over a {link['link']} link, shaped with {link['qdisc']}: SSZ sooner "
                     f"than JSON | {row['seconds']:.2f} s against {json_row['seconds']:.2f} s: {sooner:.2f}x sooner "
                     f"| 1 | {verdict(sooner > 1)} |")
    if "skipped" in link:
        lines.append(f"| a witness over the {link['link']} link | not measured: {link['skipped']} | | |")
    for host, seen in results["loopback"].get("concurrent", {}).items():
        bound = seen["budget"] * 1.1
        lines.append(f"| {host}: {seen['clients']} SSZ clients of the 300 MB witness at once stay within the "
                     f"{seen['budget'] / (1 << 30):g} GiB transcode budget plus 10 % | peak RSS +{seen['rss_above_idle'] / 1e6:,.0f} "
                     f"MB; {seen['ssz']} answered SSZ, {seen['json']} JSON as it came (past the budget), "
                     f"{seen['wrong']} wrong | 1 | {verdict(seen['rss_above_idle'] <= bound and not seen['wrong'])} |")
    return lines


# dictionary_bench.py: bytes per answer of each client against identity's
def dictionary_table(results):
    lines = ["| client | small answers (under 1 KiB): bytes per answer, of identity | every answer: bytes per answer, "
             "of identity |", "| --- | --- | --- |"]
    for row in results["rows"]:
        lines.append(f"| {row['client']} | {row['small_bytes_per_answer']:,.0f} B, {row['small_of_identity']:.3f} "
                     f"| {row['bytes_per_answer']:,.0f} B, {row['of_identity']:.3f} |")
    lines.append(f"\n{results['small_answers']:,} of the {results['answers']:,} answers are under 1 KiB.")
    return lines


# fleet_sim.py: many hosts on one fleet, the load spread over them round-robin
def fleet_sim_table(results):
    lines = list(PLAIN)
    hosts = (f"{results['hosts']} hosts ({results['envoy_native_hosts']} of them Envoy's native module), "
             "round-robin")
    mix = results["mix"]
    per_call = mix["node_requests_per_stored_call"]
    met = per_call == 1 and not mix["wrong"] and not mix["calls_both_bypassed_and_looked_up"]
    lines.append(f"| {hosts}: the mix asks the node once per call a store kept | {mix['node_requests_for_stored']:,} "
                 f"node requests for {mix['stored_calls']:,} calls stored"
                 + (f": {per_call:.3f} per call" if per_call is not None else "")
                 + f" ({mix['fleet_rounds_unanswered']} fleet rounds unanswered; besides, "
                 f"{mix['node_requests_not_looked_up_or_refused']:,} requests passed by or of the "
                 f"{mix['refused_calls']:,} calls the stores refused, each to the node); {mix['wrong']} wrong of "
                 f"{mix['requests']:,} | 1 | {verdict(met)} |")
    herd = results["herds"]
    counts = [block["node_requests"] for block in herd["blocks"]]
    right = all(block["every_answer_right"] for block in herd["blocks"])
    lines.append(f"| {hosts}: {herd['clients']} clients at once for a block not yet stored reach the node once "
                 f"| node requests per block: {', '.join(map(str, counts)) or 'no block in this run'}; "
                 f"{'every answer right' if right else '**an answer wrong**'} | {len(counts)} "
                 f"| {verdict(bool(counts) and max(counts) == 1 and right)} |")
    latency = results["latency"]
    fleet, local = latency["fleet_hit_ms"], latency["local_hit_ms"]
    goal = "a fleet hit's latency against a hit from the host's own daemon, one request at a time"
    if fleet and local:
        lines.append(f"| {goal} | p50 {fleet['p50']:.2f} ms against {local['p50']:.2f} ms "
                     f"({fleet['p50'] / local['p50']:.2f}x), p99 {fleet['p99']:.2f} ms against {local['p99']:.2f} ms "
                     f"({fleet['p99'] / local['p99']:.2f}x); {fleet['count']:,} calls at {latency['hosts_measured']} "
                     "hosts | 1 | |")
    else:
        lines.append(f"| {goal} | not in this run | | |")
    memory = results["memory"]
    if memory["bytes_per_entry"] is not None:
        lines.append(f"| Redis memory per entry (MEMORY USAGE; a replica holds the same again) "
                     f"| {memory['bytes_per_entry']:,.0f} B for values of {memory['value_bytes_per_entry']:,.0f} B "
                     f"on average ({memory['entries']:,} entries) | 1 | |")
    else:
        lines.append("| Redis memory per entry | not in this run | | |")
    killed = results["master_killed"]
    held, asked = killed["killed_master_entries"], killed["stored_calls_asked_of_node"]
    whole = killed["cluster_whole_after_s"]
    lines.append(f"| the master holding the most entries killed under the mix: no wrong answer, and the node asked "
                 f"for no more stored calls than the entries the master held | {killed['wrong']} wrong of "
                 f"{killed['requests']:,}; {asked:,} stored calls asked of the node "
                 f"({killed['node_requests_for_stored']:,} requests: while its master is down, every host asked a "
                 f"call asks its node), against the {held:,} entries the master held; the cluster whole again "
                 + (f"{whole:.1f} s after the kill" if whole is not None else "only after the mix")
                 + f" | 1 | {verdict(not killed['wrong'] and asked <= held)} |")
    lines.append(f"| latency between hosts | {results['latency_between_hosts']} | | |")
    return lines


# transcode_core.py: the transcoder's criterion medians, run by run (a GB is 10^9 bytes, a GiB 2^30)
GIB = 1 << 30
TRANSCODE = [
    # (goal, group, least GiB/s)
    ("witnesses JSON -> SSZ at least 2.5 GB/s", "witness json->ssz", 2.5e9 / GIB),
    ("blocks JSON -> SSZ at least 1.5 GB/s", "block json->ssz", 1.5e9 / GIB),
    ("witnesses SSZ -> JSON at least 1 GB/s", "witness ssz->json", 1e9 / GIB),
    ("blocks SSZ -> JSON at least 1 GB/s", "block ssz->json", 1e9 / GIB),
]
TRANSCODE_OVER_SERDE = 25
WITNESS_SSZ_OF_JSON = 0.51


def gib_s(figures):
    return figures["bytes"] / figures["median_ns"] * 1e9 / GIB


def transcode_table(results):
    runs = results["runs"]
    lines = list(PLAIN)
    for goal, group, least in TRANSCODE:
        figure = Figure([gib_s(run["groups"][group]["rpcedge"]) for run in runs], "GiB/s", at_least=least)
        lines.append(f"| {goal} ({least:.2f} GiB/s) | {figure.text()} | {len(runs)} | {verdict(figure.met())} |")
    for group in ("witness json->ssz", "block json->ssz"):
        over = Figure([run["groups"][group]["serde + ssz_rs"]["median_ns"] / run["groups"][group]["rpcedge"]["median_ns"]
                       for run in runs], "x", at_least=TRANSCODE_OVER_SERDE)
        lines.append(f"| {group.replace('->', ' -> ').replace('json', 'JSON').replace('ssz', 'SSZ')}: at least "
                     f"{TRANSCODE_OVER_SERDE}x the serde + ssz_rs path | {over.text()} | {len(runs)} "
                     f"| {verdict(over.met())} |")
    ratio = runs[0]["witness_ssz_bytes"] / runs[0]["witness_json_bytes"]
    lines.append(f"| a witness's SSZ at most {WITNESS_SSZ_OF_JSON}x its JSON | {runs[0]['witness_ssz_bytes']:,} B against "
                 f"{runs[0]['witness_json_bytes']:,} B: {ratio:.3f}x | – | {verdict(ratio <= WITNESS_SSZ_OF_JSON)} |")
    return lines


# what instructions.json's variants are; a variant named here or not, its bare host is its name's first word
INSTRUCTION_VARIANTS = {
    "nginx": "nginx, bare",
    "nginx-rpcedge-default": "nginx + rpcedge defaults",
    "envoy": "Envoy, bare",
    "envoy-rpcedge-native-default": "Envoy + rpcedge native defaults",
    "envoy-rpcedge-wasm-default": "Envoy + rpcedge Wasm defaults",
    "nginx-rpcedge-cache": "nginx + rpcedge, a hit from the daemon",
    "nginx-rpcedge-cache-hot": "nginx + rpcedge, a hit from the hot tier",
    "envoy-rpcedge-native-cache": "Envoy native, a hit from the daemon",
    "envoy-rpcedge-native-cache-hot": "Envoy native, a hit from the hot tier",
    "envoy-rpcedge-wasm-cache": "Envoy Wasm, a hit from the daemon",
    "envoy-rpcedge-wasm-cache-hot": "Envoy Wasm, a hit from the hot tier",
}
CORE_PATH_LABELS = {"untouched": "a whole untouched exchange",
                    "one_shot_30k": "a whole one-shot compression of a 34 KiB answer"}


def instructions_table(results):
    """Instructions per request under callgrind: each variant's median over the runs (the lower
    middle of an even number; the lowest and highest where there were several), and the difference
    to its bare host in the same run. On the hit path the bare host forwards the call to the node
    and a `-cache` variant asks the daemon; neither the node's nor the daemon's instructions are
    counted, so there the difference is the host's side of a hit against its side of a forward."""
    lines = ["| path | what | instructions, median (lowest to highest run) | against the bare host |",
             "| --- | --- | ---: | ---: |"]
    for path, label in CORE_PATH_LABELS.items():
        if path in results["core"]:
            lines.append(f"| core | {label} (one count) | {results['core'][path]:,} | – |")
    for path, measured in results["paths"].items():
        medians, runs = measured["proxies"], measured.get("runs", {})
        for variant, median in medians.items():
            spread = (f" ({min(runs[variant]):,} to {max(runs[variant]):,})"
                      if len(runs.get(variant, ())) > 1 else "")
            bare = variant.split("-")[0]
            over = f"{median - medians[bare]:+,}" if bare != variant and bare in medians else "–"
            lines.append(f"| {path}: {measured['requests']} | {INSTRUCTION_VARIANTS.get(variant, variant)} "
                         f"| {median:,}{spread} | {over} |")
    return lines


# A browser's Accept-Encoding (zstd, br, gzip) on bench.py's mix, into results/browser/: (goal,
# variant, baseline, least CPU ratio: the baseline's CPU per answer over the variant's; None: shown,
# no goal)
BROWSER = [
    ("nginx + rpcedge: a browser's answers (zstd) cost no more CPU than a gzip-only client's, in no more wire bytes",
     "nginx-rpcedge-browser", "nginx-rpcedge-default", 1.0),
    ("native Envoy module: a browser's answers (zstd) cost no more CPU than a gzip-only client's, in no more wire "
     "bytes", "envoy-rpcedge-native-browser", "envoy-rpcedge-native-default", 1.0),
    ("nginx + rpcedge, a br-only client, against nginx's brotli module (quality 4)", "nginx-rpcedge-br", "nginx-brotli4",
     None),
    ("native Envoy module, a br-only client, against Envoy's brotli compressor", "envoy-rpcedge-native-br",
     "envoy-brotli", None),
    ("native Envoy module, a browser (zstd), against Envoy's zstd compressor", "envoy-rpcedge-native-browser",
     "envoy-zstd", None),
]


def browser_table(results):
    rows = {row["variant"]: row for row in results["rows"] if row["scenario"] == "mix"}
    return [*HEADER, *(against_line(goal, rows.get(variant), rows.get(baseline), least)
                       for goal, variant, baseline, least in BROWSER)]


# what libFuzzer said of each target (fuzz_runs.py)
def fuzz_table(results):
    lines = ["| target | runs | seconds | runs/s | inputs at start | cov at start | cov at end |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for target, found in results["targets"].items():
        lines.append(f"| {target} | {found['runs']:,} | {found['seconds']} | {found['runs_per_s']:,} "
                     f"| {found['inputs_at_start']:,} | {found['cov_start']:,} | {found['cov_end']:,} |")
    lines.extend(f"| {target} | failed | | | | | |" for target in results["failed"])
    return lines
