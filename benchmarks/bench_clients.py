"""Many clients of one handler: N real HTTP clients of the handler's API while events arrive
at a fixed rate; publish → visible latency, the handler's CPU and memory, client errors.

    .venv/bin/python -m benchmarks.bench_clients [--clients 10,100,1000] [--rate 1000]
                                                 [--seconds 30] [--processes 4] [--views V] [--save NAME]
                                                 [--plot docs/handler-clients.png]

Real RabbitMQ, MinIO and ``delvefs eventhandler`` (benchmarks.bench_tree's ``services``), on
loopback. Each client is the mount's own client code (``SyncHandlerClient``, the requests of
delvefs/client/handler/endpoints.py): it registers its view under its own client name, lists
it, and follows its changes by the change stream (``stream_request`` + ``stream_changes``,
what ``delvefs watch`` does), reconnecting from the last version it saw if the stream breaks.
Client i follows view i mod V, where V = min(N, 100) views carve one bucket by key prefix
(``object: "vKK/*"``): 10 clients per view over 100 views at N = 1,000, one client per view
below. Events are MinIO-format ``ObjectCreated`` messages published to the exchange by a
paced publisher process at ``--rate`` events/s for ``--seconds``, each a new key under one of
the V prefixes in turn, so every event reaches N / V clients.

Clients are threads, N / ``--processes`` to a process (1,000 processes do not fit on two
cores): a client's "seen" time includes waiting for its process's GIL behind the other
clients' work, so the latencies are an upper bound of what one mount process would see.

Latency of an (event, client) pair: the client's time.perf_counter() when the change
arrived minus the publisher's when it published the event (CLOCK_MONOTONIC, one clock for
every process). Handler CPU: user + system seconds of its process from the first publish to
the last event seen; RSS at the end and its peak (VmHWM, since the handler's start: it is
restarted for each N on the same state). Errors: every exception a client met (register,
list, stream), and events a client never saw.

Sizing a shard: a second table gives the handler's CPU seconds per 1,000 deliveries (a
delivery is an (event, client) pair due: every event × the clients following its view) and
its RSS, each also as a ratio to the first point, apart for the API's event loop (the main
thread: the streams) and the consumer's threads, and what one core carries at each point's
mix; below it, the handler's CPU split into parts per commit, per event and per delivery (a
fit, valid while the clients keep up: a backlog makes the writes bigger and each delivery
cheaper, or, past the feed's memory, dearer), and what one core would carry at 1 to 1,000
clients per event (docs/PERFORMANCE.md, *Sizing a shard*).
"""
from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import os
import statistics
import sys
import threading
import time
from pathlib import Path

from delvefs.client.handler.api import HandlerError, Resync, SyncHandlerClient
from delvefs.client.handler.http import TransportError
from delvefs.client.handler.endpoints import api_error, decoded_body, stream_changes, stream_request, unreachable
from delvefs.shared.s3 import presigned_list_url
from eventhandler.devtools import HandlerProcess, spec

from .bench_handler import publish_times
from .bench_handler_shards import cpu_seconds
from .bench_mount import RESULTS, log, rss_mib
from .bench_tree import BUCKET, services

BASE = Path(os.environ.get("DELVEFS_BENCH_CLIENTS_DIR", Path.home() / ".cache/delvefs/bench-clients"))
MAX_VIEWS = 100
# clients of one process registering and listing at once: mounts start at different times,
# and a thousand proofs at once would wait for the handler's connections to the store
STARTING = 8
IDLE_S = 5.0  # seconds the handler's CPU is measured with the streams open, before the events


def view_count(clients: int) -> int:
    return min(clients, MAX_VIEWS)


def view_spec(bucket: str, k: int) -> dict:
    return spec(bucket, object=f"v{k:02d}/*")


def event_key(views: int, tag: str, i: int) -> str:
    """Event i's key: a new object under view i mod ``views``'s prefix."""
    return f"v{i % views:02d}/{tag}-{i:07d}"


def expected(view: int, views: int, events: int) -> int:
    """How many of ``events`` events a client of ``view`` sees."""
    return len(range(view, events, views))


def histogram(text: str, name: str) -> list[tuple[float, float]]:
    """A Prometheus histogram's cumulative buckets [(le, count)], summed over its labels."""
    counts: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "_bucket{"):
            le = line.split('le="')[1].split('"')[0]
            bound = float("inf") if le == "+Inf" else float(le)
            counts[bound] = counts.get(bound, 0) + float(line.rsplit(" ", 1)[1])
    return sorted(counts.items())


def bucket_quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """The upper bound of the bucket that holds quantile ``q``."""
    total = buckets[-1][1] if buckets else 0
    return next((le for le, count in buckets if count >= q * total), float("nan"))


def runqueue_wait_s(pid: int) -> float:
    """Seconds the process's threads spent runnable but waiting for a CPU (schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):  # a thread that ended meanwhile
            pass
    return total / 1e9


def loop_cpu_seconds(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of the handler's main thread so far: its API's event loop
    (requests, the change streams and the feed's reads), apart from the consumer's threads."""
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / ticks, int(fields[12]) / ticks


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Client:
    """One client of the handler: registers its view, lists it, follows its stream."""

    def __init__(self, index: int, url: str, token: str, bucket: str, proof: str, views: int):
        self.index, self.view = index, index % views
        self.api = SyncHandlerClient(url, token, timeout=60)
        self.bucket, self.proof = bucket, proof
        self.seen: dict[int, float] = {}  # event index -> when this client first saw it
        self.errors: list[str] = []
        self.setup_s = 0.0
        self.following = threading.Event()  # the stream is open (answered 200)

    def run(self, stop: threading.Event, starting: threading.Semaphore) -> None:
        try:
            with starting:
                t = time.perf_counter()
                (view,) = self.api.register(f"bench-client-{self.index}", [
                    {"name": f"v{self.view:02d}", "spec": view_spec(self.bucket, self.view)}],
                    {self.bucket: self.proof})
                version, _objects = self.api.list_all(view["id"])
                self.setup_s = time.perf_counter() - t
        except HandlerError as exc:
            self.errors.append(f"setup: {type(exc).__name__}: {exc}")
            self.following.set()
            return
        while not stop.is_set():
            try:
                try:
                    version = self.follow(view["id"], version, stop)
                except Resync:  # the change log moved past us: list again
                    self.errors.append("resync")
                    version, _objects = self.api.list_all(view["id"])
            except HandlerError as exc:
                if not stop.is_set():
                    self.errors.append(f"stream: {type(exc).__name__}: {exc}")
                    time.sleep(0.1)  # then reconnect from the last version seen

    def follow(self, view_id: str, version: int, stop: threading.Event) -> int:
        """Read the view's stream until it ends (or ``stop``); the last version seen."""
        request = stream_request(view_id, version)
        resp = self.api.response(request, stream=True)
        try:
            if resp.status_code != 200:
                raise api_error(request.what, resp.status_code, decoded_body(resp))
            self.following.set()
            for change in stream_changes(resp.iter_lines()):
                now = time.perf_counter()
                version = change["v"]
                if change["object"]:
                    self.seen.setdefault(int(change["object"]["etag"][1:]), now)
                if stop.is_set():
                    break
        except TransportError as exc:
            if stop.is_set():
                return version
            raise unreachable(self.api.url, exc) from exc
        finally:
            resp.close()
        return version


def client_process(url: str, token: str, bucket: str, proof: str, views: int, indices: list[int], pipe) -> None:
    """A process of clients (one thread each): "ready" once every stream is open; on
    ("drain", events, timeout) waits until each client saw its events, then sends back
    what they saw and met."""
    sys.setswitchinterval(0.0005)  # the clients wake often, for little work each
    stop = threading.Event()
    starting = threading.Semaphore(STARTING)
    clients = [Client(i, url, token, bucket, proof, views) for i in indices]
    for c in clients:
        threading.Thread(target=c.run, args=(stop, starting), daemon=True).start()
    for c in clients:
        c.following.wait()
    pipe.send("ready")
    cpu0 = time.process_time()
    _, events, timeout = pipe.recv()
    deadline = time.monotonic() + timeout
    while (any(len(c.seen) < expected(c.view, views, events) for c in clients)
           and time.monotonic() < deadline):
        time.sleep(0.05)
    stop.set()
    pipe.send({"cpu_s": time.process_time() - cpu0,
               "clients": [{"index": c.index, "view": c.view, "seen": dict(c.seen), "errors": list(c.errors),
                            "setup_s": c.setup_s} for c in clients]})
    # the threads still reading their streams end with the process


def run_point(amqp_url: str, handler: HandlerProcess, bucket: str, proof: str, clients: int, *,
              rate: float, seconds: float, processes: int, tag: str, views: int | None = None) -> dict:
    """One point of the curve: ``clients`` clients over ``views`` views (default: one per
    client up to 100), ``rate`` events/s for ``seconds``."""
    views = views or view_count(clients)
    n = int(rate * seconds)
    ctx = multiprocessing.get_context("spawn")
    processes = max(1, min(processes, clients))
    pipes, procs = [], []
    for p in range(processes):
        mine, theirs = ctx.Pipe()
        proc = ctx.Process(target=client_process, daemon=True,
                           args=(handler.url, handler.token, bucket, proof, views,
                                 list(range(p, clients, processes)), theirs))
        proc.start()
        pipes.append(mine)
        procs.append(proc)
    t = time.perf_counter()
    for pipe in pipes:
        if pipe.recv() != "ready":
            raise RuntimeError("a client process did not start")
    setup_s = time.perf_counter() - t
    load_before = os.getloadavg()
    pid = handler.proc.pid
    # the handler's CPU with every stream open and no event: what it costs before any work
    idle0 = cpu_seconds(pid)
    time.sleep(IDLE_S)
    idle_cpu = (cpu_seconds(pid) - idle0) / IDLE_S
    cpu0, t0, wait0, loop0 = cpu_seconds(pid), time.perf_counter(), runqueue_wait_s(pid), loop_cpu_seconds(pid)
    with ctx.Pool(1) as pool:  # its own process: the clients must not wait for it (GIL)
        published = pool.apply(publish_times, (amqp_url, n, rate),
                               {"bucket": bucket, "key": functools.partial(event_key, views, tag)})
    for pipe in pipes:
        pipe.send(("drain", n, 30.0))
    answers = [pipe.recv() for pipe in pipes]
    cpu1, t1, wait1, loop1 = cpu_seconds(pid), time.perf_counter(), runqueue_wait_s(pid), loop_cpu_seconds(pid)
    load_after = os.getloadavg()
    # the handler's own part: publish (the sequencer) → batch committed; and its batches
    text = handler.api.metrics()
    committed = histogram(text, "delvefs_event_latency_seconds")
    batches = histogram(text, "delvefs_batch_size")
    for proc in procs:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    timeline, errors, missing, setups, deliveries = [], [], 0, [], 0
    for answer in answers:
        for c in answer["clients"]:
            errors += c["errors"]
            setups.append(c["setup_s"])
            want = range(c["view"], n, views)
            missing += sum(1 for i in want if i not in c["seen"])
            timeline += [(i, (c["seen"][i] - published[i]) * 1000) for i in want if i in c["seen"]]
            deliveries += len(want)
    latencies = [lat for _i, lat in timeline]
    by_second: dict[int, list[float]] = {}
    for i, lat in timeline:
        by_second.setdefault(int(i / rate), []).append(lat)
    latencies.sort()

    def q(p):
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] if latencies else float("nan")
    return {"clients": clients, "views": views, "processes": processes, "events": n, "rate": rate,
            "published_rate": n / (published[-1] - published[0]) if n > 1 else rate,
            "pairs": len(latencies), "p50_ms": q(0.5), "p90_ms": q(0.9), "p99_ms": q(0.99),
            "p999_ms": q(0.999), "max_ms": latencies[-1] if latencies else float("nan"),
            "committed_p50_ms": 1000 * bucket_quantile(committed, 0.5),
            "committed_p99_ms": 1000 * bucket_quantile(committed, 0.99),
            "batches": batches[-1][1] if batches else 0,
            "handler_cpu_s": cpu1 - cpu0, "window_s": t1 - t0, "handler_idle_cpu": idle_cpu,
            # (event, client) pairs due: every event × the clients following its view
            "deliveries": deliveries,
            "cpu_s_per_1000_deliveries": 1000 * (cpu1 - cpu0) / deliveries if deliveries else float("nan"),
            # of it, the API's event loop (the streams' side; the rest is the consumer's)
            "loop_cpu_s": sum(loop1) - sum(loop0),
            "loop_cpu_s_per_1000_deliveries": 1000 * (sum(loop1) - sum(loop0)) / deliveries if deliveries else float("nan"),
            # of it in the kernel (the streams' sends: loopback TCP, waking the clients)
            "loop_system_s": loop1[1] - loop0[1],
            # runnable, but no core free: the machine's share, not the handler's work
            "handler_runqueue_wait_s": wait1 - wait0,
            "handler_rss_mib": rss_mib(pid), "handler_peak_rss_mib": peak_rss_mib(pid),
            "client_cpu_s": sum(a["cpu_s"] for a in answers),
            "errors": len(errors), "error_samples": sorted(set(errors))[:10], "missing": missing,
            "setup_s": setup_s, "setup_p50_s": statistics.median(setups) if setups else float("nan"),
            "load_before": load_before, "load_after": load_after,
            # the median of each second of publishing: a backlog that builds shows as a climb
            "p50_by_second_ms": [statistics.median(by_second[s]) for s in sorted(by_second)]}


def table(rows: list[dict]) -> str:
    lines = ["| clients | views | client processes | events (rate) | (event, client) pairs seen | p50 | p99 "
             "| p99.9 | max | of which publish → committed, p50 / p99 (handler's histogram) | handler CPU "
             "| handler RSS (peak) | client errors | events never seen | load average |",
             "|---:|---:|---:|---|---:|---:|---:|---:|---:|---|---|---|---:|---:|---|"]
    for r in rows:
        lines.append(
            f"| {r['clients']:,} | {r['views']} | {r['processes']} | {r['events']:,} ({r['published_rate']:.0f}/s) "
            f"| {r['pairs']:,} | {r['p50_ms']:.1f} ms | {r['p99_ms']:.1f} ms | {r['p999_ms']:.1f} ms "
            f"| {r['max_ms']:.0f} ms | ≤ {r['committed_p50_ms']:g} / ≤ {r['committed_p99_ms']:g} ms "
            f"| {r['handler_cpu_s']:.1f} s in {r['window_s']:.0f} s ({r['handler_cpu_s'] / r['window_s']:.0%} of a core"
            + (f"; {r['handler_runqueue_wait_s']:.0f} s waiting for one" if "handler_runqueue_wait_s" in r else "")
            + ") "
            f"| {r['handler_rss_mib']:.0f} MiB ({r['handler_peak_rss_mib']:.0f} MiB) | {r['errors']} "
            f"| {r['missing']} | {r['load_before'][0]:.1f} → {r['load_after'][0]:.1f} |")
    return "\n".join(lines)


def deliveries_of(r: dict) -> int:
    return r.get("deliveries", r["events"] * r["clients"] // r["views"])


def per_1000(seconds: float, count: int) -> float:
    return 1000 * seconds / count if count else float("nan")


def cost_table(rows: list[dict]) -> str:
    """The handler's CPU per 1,000 deliveries (all of it, and its API loop's: the streams'
    side) and its memory, each also as a ratio to the first row."""
    lines = ["| clients | views | clients per event | events | deliveries | batches | handler CPU (idle: % of a core) "
             "| CPU s per 1,000 deliveries | ÷ first row | of which API loop (kernel) | loop CPU s per 1,000 deliveries "
             "| ÷ first row | consumer side, CPU s per 1,000 events | one core's worth at this mix: events/s "
             "(deliveries/s) | RSS (peak) | ÷ first row |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|"]
    if not rows:
        return "\n".join(lines)
    base = rows[0]
    nan = float("nan")

    def total(r):
        return per_1000(r["handler_cpu_s"], deliveries_of(r))

    def loop(r):
        return per_1000(r.get("loop_cpu_s", nan), deliveries_of(r))
    for r in rows:
        d = deliveries_of(r)
        lines.append(
            f"| {r['clients']:,} | {r['views']} | {d / max(1, r['events']):g} | {r['events']:,} | {d:,} "
            f"| {r.get('batches', nan):,.0f} | {r['handler_cpu_s']:.1f} s "
            + (f"({r['handler_idle_cpu']:.1%}) " if "handler_idle_cpu" in r else "")
            + f"| {total(r):.3f} s "
            f"| {total(r) / total(base):.2f}× | {r.get('loop_cpu_s', nan):.1f} s "
            + (f"({r['loop_system_s']:.1f} s) " if "loop_system_s" in r else "")
            + f"| {loop(r):.4f} s "
            f"| {loop(r) / loop(base):.2f}× "
            f"| {per_1000(r['handler_cpu_s'] - r.get('loop_cpu_s', nan), r['events']):.3f} s "
            f"| {r['events'] / r['handler_cpu_s']:,.0f} ({d / r['handler_cpu_s']:,.0f}) "
            f"| {r['handler_rss_mib']:.0f} MiB ({r['handler_peak_rss_mib']:.0f} MiB) "
            f"| {r['handler_rss_mib'] / base['handler_rss_mib']:.2f}× |")
    return "\n".join(lines)


def fit2(x1: list[float], x2: list[float], y: list[float]) -> tuple[float, float] | None:
    """Least squares of y = a × x1 + b × x2 (no constant); None when x1 and x2 do not vary
    apart (or a part comes out negative: too noisy to split)."""
    s11, s22 = sum(a * a for a in x1), sum(b * b for b in x2)
    s12 = sum(a * b for a, b in zip(x1, x2))
    det = s11 * s22 - s12 * s12
    if det <= 1e-9 * s11 * s22:
        return None
    s1y, s2y = sum(a * c for a, c in zip(x1, y)), sum(b * c for b, c in zip(x2, y))
    a, b = (s22 * s1y - s12 * s2y) / det, (s11 * s2y - s12 * s1y) / det
    return (a, b) if a >= 0 and b >= 0 else None


def sizing(rows: list[dict]) -> dict | None:
    """The handler's CPU split into parts per commit (a batch of events), per event and per
    delivery, in ms of a core: least-squares fits over the rows of its consumer's threads'
    CPU = commits × c + events × e (decoding, LevelDB, matching, acks) and its API loop's =
    commits × c' + deliveries × d (the feed's read and the wake-up at each commit; each
    stream's wake-up and write). The rows must differ in commits per event (a handler kept
    busy batches more) and in clients per event; else None."""
    rows = [r for r in rows if r["events"] and "loop_cpu_s" in r and r.get("batches")]
    if len(rows) < 2:
        return None
    commits = [r["batches"] for r in rows]
    idle = [r.get("handler_idle_cpu", 0.0) * r["window_s"] for r in rows]
    consumer = fit2(commits, [r["events"] for r in rows],
                    [r["handler_cpu_s"] - r["loop_cpu_s"] - i for r, i in zip(rows, idle)])
    loop = fit2(commits, [deliveries_of(r) for r in rows], [r["loop_cpu_s"] for r in rows])
    if consumer is None or loop is None:
        return None
    return {"per_commit_ms": 1000 * (consumer[0] + loop[0]), "per_event_ms": 1000 * consumer[1],
            "per_delivery_ms": 1000 * loop[1], "idle": max(r.get("handler_idle_cpu", 0.0) for r in rows),
            "consumer_per_commit_ms": 1000 * consumer[0], "loop_per_commit_ms": 1000 * loop[0]}


def sizing_text(rows: list[dict]) -> str:
    fit = sizing(rows)
    if fit is None:
        return "sizing: the rows do not differ enough in commits and clients per event to split the CPU"
    c, e, d = fit["per_commit_ms"] / 1000, fit["per_event_ms"] / 1000, fit["per_delivery_ms"] / 1000
    out = [f"sizing: handler CPU ≈ commits × {1000 * c:.3f} ms (consumer {fit['consumer_per_commit_ms']:.3f}, "
           f"API loop {fit['loop_per_commit_ms']:.3f}) + events × {1000 * e:.3f} ms + deliveries × {1000 * d:.4f} ms "
           f"+ {fit['idle']:.1%} of a core idle; a trickle commits every event, a busy handler batches"]
    for n in (1, 10, 100, 1000):
        worst, batched = (1 - fit["idle"]) / (c + e + n * d), (1 - fit["idle"]) / (e + n * d)
        out.append(f"  one core, {n:,} clients following each event: {worst:,.0f} events/s committed one by one "
                   f"({n * worst:,.0f} deliveries/s), {batched:,.0f} in large batches ({n * batched:,.0f} deliveries/s)")
    return "\n".join(out)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    xs = [r["clients"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for key, label in (("p50_ms", "p50"), ("p99_ms", "p99"), ("p999_ms", "p99.9")):
        ax1.plot(xs, [r[key] for r in rows], marker="o", label=label)
    ax1.axhline(20, color="grey", linestyle=":", linewidth=1)
    ax1.axhline(250, color="grey", linestyle="--", linewidth=1)
    ax1.set_xscale("log")
    ax1.set_yscale("log")
    ax1.set_xlabel("clients following by stream")
    ax1.set_ylabel("publish → visible (ms)")
    ax1.set_title(f"{rows[0]['rate']:.0f} events/s (targets: p50 20 ms, p99 250 ms)")
    ax1.legend(fontsize=8)
    ax2.plot(xs, [100 * r["handler_cpu_s"] / r["window_s"] for r in rows], marker="o", label="CPU (% of a core)")
    ax2.plot(xs, [r["handler_peak_rss_mib"] for r in rows], marker="s", label="peak RSS (MiB)")
    ax2.set_xscale("log")
    ax2.set_xlabel("clients following by stream")
    ax2.set_title("the handler")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    log(f"plot: {path}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", default="10,100,1000", help="comma-separated client counts")
    ap.add_argument("--rate", type=float, default=1000.0, help="events/s")
    ap.add_argument("--seconds", type=float, default=30.0, help="of publishing, per client count")
    ap.add_argument("--processes", type=int, default=4, help="client processes (clients are threads)")
    ap.add_argument("--views", type=int, help="views at every point (default: one per client, at most 100)")
    ap.add_argument("--save", metavar="NAME", help="keep the results as results/clients-NAME.json")
    ap.add_argument("--plot", metavar="PNG", help="write the latency / handler curve")
    args = ap.parse_args(argv)
    rows = []
    with services("bench-clients-", BASE) as (_work, _env, s3, handler):
        proof = presigned_list_url(s3, BUCKET)
        for clients in (int(c) for c in args.clients.split(",")):
            handler.stop()  # a fresh process per point (the same state): its own peak RSS
            handler.start()
            row = run_point(os.environ["DELVEFS_AMQP_URL"], handler, BUCKET, proof, clients,
                            rate=args.rate, seconds=args.seconds, processes=args.processes, tag=f"n{clients}",
                            views=args.views and min(args.views, clients))
            log(f"# {clients} clients: " + json.dumps({k: v for k, v in row.items() if k != "error_samples"}))
            for sample in row["error_samples"]:
                log(f"#   error: {sample}")
            rows.append(row)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"clients-{args.save or 'last'}.json"
    out.write_text(json.dumps(rows, indent=2))
    log(f"results: {out}")
    print(table(rows))
    print()
    print(cost_table(rows))
    print()
    print(sizing_text(rows))
    if args.plot:
        plot(rows, Path(args.plot))
    return 0


if __name__ == "__main__":
    sys.exit(main())
