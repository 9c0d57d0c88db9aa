#!/usr/bin/python3
"""A real Prometheus scrapes real engines: transfer_engine_bench (target and initiator in one
process, tcp.so on loopback) with --metrics_port=0, and Prometheus (Debian's `prometheus`)
started here on loopback with its own configuration. Prometheus must see the engines' traffic,
every query of the Grafana dashboard (docs/grafana/ferry-data-path.json) must evaluate and the
throughput (by transport and by rail), ops and latency panels must have data, Prometheus must
answer for tcp.so's rail (its bind address, 127.0.0.1) with the traffic it carried, and promtool
must accept a scrape with every metric family of the endpoint in it.

  metrics_prometheus_test.py BENCH_BINARY
Prints SKIPPED and exits 77 where prometheus or promtool is not installed."""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DASHBOARD = os.path.join(ROOT, "docs", "grafana", "ferry-data-path.json")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def query(prom, expr):
    body = json.loads(get("http://%s/api/v1/query?%s" % (prom, urllib.parse.urlencode({"query": expr}))))
    if body.get("status") != "success":
        raise AssertionError("query %r: %s" % (expr, body))
    return body["data"]["result"]


def start_prometheus(targets, workdir):
    """Prometheus on a free loopback port; a port taken between the probe and the bind is
    retried with another."""
    cfg = os.path.join(workdir, "prometheus.yml")
    with open(cfg, "w") as f:
        f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
                "scrape_configs:\n  - job_name: ferry\n    static_configs:\n      - targets: [%s]\n"
                % ", ".join('"%s"' % t for t in targets))
    for attempt in range(3):
        port = free_port()
        log = open(os.path.join(workdir, "prometheus.log"), "w")
        proc = subprocess.Popen(["prometheus", "--config.file=" + cfg,
                                 "--storage.tsdb.path=" + os.path.join(workdir, "data%d" % attempt),
                                 "--web.listen-address=127.0.0.1:%d" % port], stdout=log, stderr=subprocess.STDOUT)
        address = "127.0.0.1:%d" % port
        deadline = time.time() + 30
        while time.time() < deadline and proc.poll() is None:
            try:
                if "Ready" in get("http://%s/-/ready" % address, timeout=1):
                    return proc, address
            except OSError:
                pass
            time.sleep(0.2)
        proc.kill()
        proc.wait()
    raise AssertionError("prometheus did not start: " + open(os.path.join(workdir, "prometheus.log")).read()[-2000:])


def main():
    bench = sys.argv[1]
    missing = [p for p in ("prometheus", "promtool") if not shutil.which(p)]
    if missing:
        print("SKIPPED: %s not installed (apt-get install prometheus)" % " and ".join(missing))
        return 77
    checks = 0
    workdir = tempfile.mkdtemp(prefix="ferry_prometheus_")
    engines = subprocess.Popen([bench, "--mode=loopback", "--metrics_port=0", "--duration=60", "--block_size=65536",
                                "--batch_size=16", "--buffer_size=16777216", "--huge_pages=false"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    prom = None
    try:
        addresses = []
        while len(addresses) < 2:
            line = engines.stderr.readline()
            if not line:
                raise AssertionError("transfer_engine_bench ended before printing its metrics addresses")
            m = re.match(r"metrics: http://([0-9.]+:\d+)/metrics", line)
            if m:
                addresses.append(m.group(1))
        prom, prom_address = start_prometheus(addresses, workdir)

        # Both engines scraped, and the initiator's bytes seen (a rate needs a few scrapes).
        deadline = time.time() + 60
        while True:
            up = query(prom_address, "sum(up)")
            rate = query(prom_address, 'sum(rate(ferry_bytes_total{transport="tcp",op="read"}[5s]))')
            if up and float(up[0]["value"][1]) == 2 and rate and float(rate[0]["value"][1]) > 0:
                break
            if time.time() > deadline:
                raise AssertionError("Prometheus never saw both engines and their traffic: up=%s rate=%s" % (up, rate))
            time.sleep(0.5)
        print("ok: Prometheus scrapes both engines; tcp READ rate %.2f GB/s" % (float(rate[0]["value"][1]) / 1e9))
        checks += 1

        # Per rail: the initiator's READs went over tcp.so's one rail, its bind address.
        deadline = time.time() + 30
        while True:
            rail = query(prom_address, 'sum by (rail) (rate(ferry_rail_bytes_total{transport="tcp",op="read"}[5s]))')
            if rail and rail[0]["metric"].get("rail") == "127.0.0.1" and float(rail[0]["value"][1]) > 0:
                break
            if time.time() > deadline:
                raise AssertionError("Prometheus never saw tcp's rail 127.0.0.1 carry READs: %s" % rail)
            time.sleep(0.5)
        gauges = query(prom_address, 'ferry_rail_paused_peers{transport="tcp",rail="127.0.0.1"}')
        if len(gauges) != 2 or any(float(g["value"][1]) != 0 for g in gauges):
            raise AssertionError("ferry_rail_paused_peers: one series per engine, both 0, expected: %s" % gauges)
        print("ok: Prometheus answers per rail; tcp rail 127.0.0.1 READ rate %.2f GB/s, paused for no peer"
              % (float(rail[0]["value"][1]) / 1e9))
        checks += 1

        # The dashboard's queries, with Grafana's variables as Grafana would fill them.
        with open(DASHBOARD) as f:
            dash = json.load(f)
        must_have_data = ("Throughput", "Ops per second", "Op latency", "Connected segments", "Failovers",
                          "Rail failures")
        for panel in dash["panels"]:
            for target in panel["targets"]:
                expr = target["expr"].replace("$__rate_interval", "5s").replace('"$instance"', '".*"')
                result = query(prom_address, expr)
                if panel["title"].startswith(must_have_data) and not result:
                    raise AssertionError("panel %r: %r returned no series" % (panel["title"], expr))
                if panel["title"].startswith("Throughput by rail") and not any(
                        r["metric"].get("rail") == "127.0.0.1" and float(r["value"][1]) > 0 for r in result):
                    raise AssertionError("panel %r: no traffic on rail 127.0.0.1: %s" % (panel["title"], result))
                print("ok: panel %r: %d series" % (panel["title"], len(result)))
                checks += 1
        variable = dash["templating"]["list"][1]["definition"]
        values = json.loads(get("http://%s/api/v1/label/instance/values?%s" % (
            prom_address, urllib.parse.urlencode({"match[]": "ferry_batches_total"}))))["data"]
        if sorted(values) != sorted(addresses):
            raise AssertionError("%s: %s, not the engines %s" % (variable, values, addresses))
        checks += 1

        text = get("http://%s/metrics" % addresses[1])
        check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
        if check.returncode != 0:
            raise AssertionError("promtool check metrics: " + check.stdout + check.stderr)
        rail_families = ("ferry_rail_bytes_total counter", "ferry_rail_completions_total counter",
                         "ferry_rail_failures_total counter", "ferry_rail_pauses_total counter",
                         "ferry_rail_paused_peers gauge", "ferry_rail_throughput_bytes_per_second gauge",
                         "ferry_rail_queued_bytes gauge")
        missing = [f for f in rail_families if "# TYPE %s\n" % f not in text]
        if missing:
            raise AssertionError("the scrape promtool checked lacks %s" % missing)
        print("ok: promtool accepts a scrape, with the per-rail families")
        checks += 1
    except AssertionError as e:
        print("FAILED: %s" % e)
        print("%d passed, 1 failed" % checks)
        return 1
    finally:
        for p in (prom, engines):
            if p and p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    print("%d passed, 0 failed" % checks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
