// transfer_engine_bench: Mooncake-compatible throughput benchmark for Ferry.
//
//   target:     transfer_engine_bench --mode=target [--local_server_name=127.0.0.1:7000]
//   initiator:  transfer_engine_bench --mode=initiator --segment_id=127.0.0.1:7000
//   one command: transfer_engine_bench --loopback
//   curves:      transfer_engine_bench --loopback --sweep --duration=1 (then bench/plot_sweep.py)
//
// Throughput = batches x batch_size x block_size / duration, as Mooncake defines it.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <boost/program_options.hpp>

#include "ferry/engine.hpp"

namespace po = boost::program_options;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
    std::string mode = "initiator";
    bool loopback = false;
    std::string metadata_server = "P2PHANDSHAKE";
    std::string local_server_name;
    std::string segment_id;
    std::string operation = "read";
    std::string protocol = "tcp";
    uint64_t buffer_size = 1ull << 30;
    size_t batch_size = 128;
    uint64_t block_size = 65536;
    double duration = 10;
    unsigned threads = 1;
    std::string report_unit = "GB";
    int report_precision = 2;
    bool verify = false;
    bool json = false;
    std::string config;
    std::vector<std::string> options;
    double wait_for_target = 10;
    bool sweep = false;
    std::string sweep_block_sizes = "4096,16384,65536,262144,1048576";
    std::string sweep_batch_sizes = "1,16,128";
    std::string sweep_threads = "1,2,4";
    std::string sweep_out = "sweep.json";
};

// One measured point of the (block size x batch size x threads) space.
struct Point {
    uint64_t block_size;
    size_t batch_size;
    unsigned threads;
};

struct Outcome {
    double secs = 0;
    uint64_t batches = 0;
    double bytes = 0;
    double throughput = 0; // in o.report_unit per second
    double p50 = 0, p99 = 0;
};

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop = true; }

[[noreturn]] void die(const std::string &what) {
    std::fprintf(stderr, "transfer_engine_bench: %s\n", what.c_str());
    std::exit(1);
}

// Byte expected at `offset` of a buffer filled with `seed`: cheap, position-dependent, and
// different for every block so a misplaced block is caught.
inline uint8_t pattern(uint64_t offset, uint64_t seed) {
    uint64_t x = (offset >> 3) * 0x9E3779B97F4A7C15ull + seed;
    x ^= x >> 29;
    return static_cast<uint8_t>(x >> (8 * (offset & 7)));
}

// pattern() a word at a time: byte k of word w is byte k of the word's little-endian value.
// 1 GiB per side took seconds byte by byte, which every bench run paid before measuring.
void fill(uint8_t *p, uint64_t len, uint64_t seed) {
    uint64_t i = 0;
    if constexpr (std::endian::native == std::endian::little) {
        for (; i + 8 <= len; i += 8) {
            uint64_t x = (i >> 3) * 0x9E3779B97F4A7C15ull + seed;
            x ^= x >> 29;
            std::memcpy(p + i, &x, 8);
        }
    }
    for (; i < len; ++i) p[i] = pattern(i, seed);
}

// Page-aligned, pre-faulted memory, so the first pass does not measure page faults.
struct Buffer {
    explicit Buffer(uint64_t len) : size(len) {
        void *p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        if (p == MAP_FAILED) die("cannot allocate " + std::to_string(len) + " bytes: " + strerror(errno));
        data = static_cast<uint8_t *>(p);
    }
    ~Buffer() { munmap(data, size); }
    uint8_t *data;
    uint64_t size;
};

double unit_divisor(const std::string &unit) {
    if (unit == "GB") return 1e9;
    if (unit == "GiB") return 1024.0 * 1024 * 1024;
    if (unit == "Gb") return 1e9 / 8;
    if (unit == "MB") return 1e6;
    if (unit == "MiB") return 1024.0 * 1024;
    if (unit == "Mb") return 1e6 / 8;
    if (unit == "KB") return 1e3;
    if (unit == "KiB") return 1024.0;
    if (unit == "Kb") return 1e3 / 8;
    die("--report_unit must be one of GB GiB Gb MB MiB Mb KB KiB Kb");
}

ferry::Config engine_config(const Options &o, bool is_target) {
    ferry::Config c;
    if (!o.config.empty()) {
        auto file = ferry::load_yaml_config(o.config);
        if (!file) die(file.error().message);
        c = *file;
    }
    c["metadata"] = o.metadata_server;
    if (is_target && !o.local_server_name.empty()) c["local_server_name"] = o.local_server_name;
    for (const auto &kv : o.options) {
        auto eq = kv.find('=');
        if (eq == std::string::npos || eq == 0) die("--option takes key=value, got '" + kv + "'");
        c[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    return c;
}

std::unique_ptr<ferry::Engine> make_engine(const Options &o, bool is_target) {
    auto e = ferry::Engine::create(engine_config(o, is_target));
    if (!e) die(e.error().message);
    return std::move(*e);
}

struct ThreadResult {
    std::atomic<uint64_t> batches{0};
    std::vector<double> latencies_ms;
    std::string error;
};

void run_initiator_thread(ferry::Engine &engine, const Options &o, const Point &pt, ferry::SegmentId seg,
                          uint8_t *local, uint64_t remote_base, uint64_t span_off, uint64_t span_len,
                          Buffer *verify_buf, Clock::time_point end, ThreadResult &out) {
    const ferry::Opcode op = o.operation == "read" ? ferry::Opcode::Read : ferry::Opcode::Write;
    const uint64_t blocks_in_span = span_len / pt.block_size;
    std::vector<ferry::Request> reqs(pt.batch_size);
    uint64_t next_block = 0;
    while (!g_stop && Clock::now() < end) {
        for (size_t i = 0; i < pt.batch_size; ++i) {
            uint64_t off = span_off + (next_block++ % blocks_in_span) * pt.block_size;
            reqs[i] = {op, local + off, seg, remote_base + off, pt.block_size, o.protocol};
        }
        auto t0 = Clock::now();
        auto b = engine.submit(reqs);
        if (!b) {
            out.error = b.error().message;
            return;
        }
        auto w = engine.wait(*b, std::chrono::seconds(60));
        auto t1 = Clock::now();
        (void)engine.free_batch(*b);
        if (!w) {
            out.error = w.error().message;
            return;
        }
        out.latencies_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        out.batches.fetch_add(1, std::memory_order_relaxed); // read live by the progress line
        if (!o.verify) continue;
        // READ: the bytes must be the target's pattern. WRITE: read them back and compare.
        for (size_t i = 0; i < pt.batch_size; ++i) {
            uint64_t off = reqs[i].remote - remote_base;
            const uint8_t *got = static_cast<const uint8_t *>(reqs[i].local);
            if (op == ferry::Opcode::Write) {
                ferry::Request back{ferry::Opcode::Read, verify_buf->data, seg, remote_base + off, pt.block_size, o.protocol};
                auto rb = engine.submit(std::span(&back, 1));
                if (!rb || !engine.wait(*rb, std::chrono::seconds(60))) {
                    out.error = "verify read-back failed";
                    return;
                }
                (void)engine.free_batch(*rb);
                if (memcmp(verify_buf->data, got, pt.block_size) != 0) {
                    out.error = "verify: remote block at offset " + std::to_string(off) + " differs from what was written";
                    return;
                }
            } else {
                for (uint64_t k = 0; k < pt.block_size; ++k)
                    if (got[k] != pattern(off + k, 1)) {
                        out.error = "verify: byte " + std::to_string(off + k) + " read wrong";
                        return;
                    }
            }
        }
    }
}

double percentile(std::vector<double> v, double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    size_t idx = static_cast<size_t>(std::ceil(p / 100.0 * v.size())) - 1;
    return v[std::min(idx, v.size() - 1)];
}

// The target's segment, waiting up to --wait_for_target seconds for a target started just before
// (`target & initiator`): refused connections (P2PHANDSHAKE) or a segment not yet in etcd.
ferry::SegmentId open_target(const Options &o, ferry::Engine &engine, const std::string &name) {
    auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.wait_for_target));
    bool said = false;
    for (;;) {
        auto seg = engine.open_segment(name);
        if (seg) return *seg;
        bool not_yet = seg.error().code == -ECONNREFUSED || seg.error().code == -ENOENT;
        if (!not_yet || g_stop || Clock::now() >= deadline) die(seg.error().message);
        if (!said)
            std::fprintf(stderr, "transfer_engine_bench: waiting up to %.0f s for segment %s (%s)\n", o.wait_for_target,
                         name.c_str(), seg.error().message.c_str());
        said = true;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
}

std::string size_text(double bytes) {
    const char *units[] = {"B", "KiB", "MiB", "GiB"};
    int u = 0;
    while (bytes >= 1024 && u < 3) bytes /= 1024, ++u;
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g %s", bytes, units[u]);
    return buf;
}

// One point: o.duration seconds of batches from pt.threads threads over `local`. On a terminal
// (and without --json) a progress line shows the throughput so far and the time left.
Outcome measure(const Options &o, const Point &pt, ferry::Engine &engine, ferry::SegmentId seg, uint8_t *local,
                const ferry::RemoteRegion &target_region, std::vector<std::unique_ptr<Buffer>> &verify_bufs,
                const std::string &label) {
    uint64_t usable = std::min(o.buffer_size, target_region.length);
    uint64_t per_thread = usable / pt.threads / pt.block_size * pt.block_size;
    if (per_thread < pt.block_size)
        die("buffer too small: each of " + std::to_string(pt.threads) + " threads needs at least one " +
            std::to_string(pt.block_size) + "-byte block; raise --buffer_size");
    std::vector<ThreadResult> results(pt.threads);
    auto start = Clock::now();
    auto end = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.duration));
    std::vector<std::thread> workers;
    for (unsigned t = 0; t < pt.threads; ++t)
        workers.emplace_back(run_initiator_thread, std::ref(engine), std::cref(o), std::cref(pt), seg, local,
                             target_region.addr, t * per_thread, per_thread, verify_bufs[t].get(), end,
                             std::ref(results[t]));

    const bool live = isatty(STDOUT_FILENO) && !o.json;
    const double div = unit_divisor(o.report_unit);
    while (live && !g_stop && Clock::now() < end) {
        std::this_thread::sleep_for(std::chrono::milliseconds(250));
        uint64_t done = 0;
        for (auto &r : results) done += r.batches.load(std::memory_order_relaxed);
        double secs = std::chrono::duration<double>(Clock::now() - start).count();
        double left = std::max(0.0, o.duration - secs);
        std::printf("\r\033[K%s[%5.1f s] %.*f %s/s so far, %.1f s left", label.c_str(), secs, o.report_precision,
                    done * pt.batch_size * pt.block_size / secs / div, o.report_unit.c_str(), left);
        std::fflush(stdout);
    }
    for (auto &w : workers) w.join();
    Outcome out;
    out.secs = std::chrono::duration<double>(Clock::now() - start).count();
    if (live) {
        std::printf("\r\033[K");
        std::fflush(stdout);
    }
    std::vector<double> lat;
    for (auto &r : results) {
        if (!r.error.empty()) die(r.error);
        out.batches += r.batches;
        lat.insert(lat.end(), r.latencies_ms.begin(), r.latencies_ms.end());
    }
    out.bytes = static_cast<double>(out.batches) * pt.batch_size * pt.block_size;
    out.throughput = out.bytes / out.secs / div;
    out.p50 = percentile(lat, 50);
    out.p99 = percentile(lat, 99);
    return out;
}

std::string point_json(const Options &o, const Point &pt, const Outcome &r) {
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "{\"operation\":\"%s\",\"protocol\":\"%s\",\"block_size\":%llu,\"batch_size\":%zu,\"threads\":%u,"
                  "\"duration_s\":%.3f,\"batches\":%llu,\"bytes\":%.0f,\"throughput\":%.*f,\"unit\":\"%s/s\","
                  "\"batch_latency_p50_ms\":%.3f,\"batch_latency_p99_ms\":%.3f,\"verified\":%s}",
                  o.operation.c_str(), o.protocol.c_str(), static_cast<unsigned long long>(pt.block_size), pt.batch_size,
                  pt.threads, r.secs, static_cast<unsigned long long>(r.batches), r.bytes, o.report_precision,
                  r.throughput, o.report_unit.c_str(), r.p50, r.p99, o.verify ? "true" : "false");
    return buf;
}

std::vector<uint64_t> parse_list(const std::string &flag, const std::string &text) {
    std::vector<uint64_t> out;
    size_t start = 0;
    while (start <= text.size()) {
        size_t end = std::min(text.find(',', start), text.size());
        std::string item = text.substr(start, end - start);
        char *stop = nullptr;
        unsigned long long v = std::strtoull(item.c_str(), &stop, 10);
        if (item.empty() || *stop || v == 0) die("--" + flag + " takes positive integers separated by commas, got '" + text + "'");
        out.push_back(v);
        start = end + 1;
    }
    return out;
}

std::vector<Point> sweep_points(const Options &o) {
    std::vector<Point> points;
    auto threads = parse_list("sweep_threads", o.sweep_threads);
    auto batches = parse_list("sweep_batch_sizes", o.sweep_batch_sizes);
    for (uint64_t t : threads)
        for (uint64_t b : batches)
            for (uint64_t bs : parse_list("sweep_block_sizes", o.sweep_block_sizes)) {
                if (bs > o.buffer_size) die("--sweep_block_sizes: " + std::to_string(bs) + " is larger than --buffer_size");
                points.push_back({bs, static_cast<size_t>(b), static_cast<unsigned>(t)});
            }
    return points;
}

int run_initiator(const Options &o, ferry::Engine &engine, const std::string &segment_name) {
    ferry::SegmentId seg = open_target(o, engine, segment_name);
    auto regions = engine.segment_regions(seg);
    // A target that just started serves its descriptor before its buffer is registered.
    auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.wait_for_target));
    while (regions && regions->empty() && !g_stop && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        (void)engine.close_segment(seg);
        seg = open_target(o, engine, segment_name);
        regions = engine.segment_regions(seg);
    }
    if (!regions) die(regions.error().message);
    if (regions->empty()) die("segment " + segment_name + " has registered no memory");
    const auto &target_region = regions->front();
    std::vector<Point> points = o.sweep ? sweep_points(o) : std::vector<Point>{{o.block_size, o.batch_size, o.threads}};
    uint64_t max_block = 0;
    unsigned max_threads = 0;
    for (auto &p : points) max_block = std::max(max_block, p.block_size), max_threads = std::max(max_threads, p.threads);

    Buffer local(o.buffer_size);
    if (o.operation == "write") fill(local.data, local.size, 2);
    if (auto r = engine.register_memory(local.data, local.size); !r) die(r.error().message);
    std::vector<std::unique_ptr<Buffer>> verify_bufs;
    for (unsigned t = 0; t < max_threads; ++t) {
        verify_bufs.push_back(o.verify && o.operation == "write" ? std::make_unique<Buffer>(max_block) : nullptr);
        if (verify_bufs.back())
            if (auto r = engine.register_memory(verify_bufs.back()->data, max_block); !r) die(r.error().message);
    }

    if (!o.sweep) {
        const Point &pt = points.front();
        Outcome r = measure(o, pt, engine, seg, local.data, target_region, verify_bufs, "");
        if (o.json) {
            std::printf("%s\n", point_json(o, pt, r).c_str());
        } else {
            std::printf("Test completed: duration %.2f, batch count %llu, throughput %.*f %s/s\n", r.secs,
                        static_cast<unsigned long long>(r.batches), o.report_precision, r.throughput, o.report_unit.c_str());
            std::printf("Batch latency: p50 %.3f ms, p99 %.3f ms (%s, %llu-byte blocks, %zu per batch, %u threads%s)\n",
                        r.p50, r.p99, o.operation.c_str(), static_cast<unsigned long long>(pt.block_size), pt.batch_size,
                        pt.threads, o.verify ? ", every byte verified" : "");
        }
        return 0;
    }
    // --sweep: every point for --duration seconds, one line each as it finishes, then the JSON.
    std::string json = "{\"operation\":\"" + o.operation + "\",\"protocol\":\"" + o.protocol + "\",\"points\":[";
    for (size_t i = 0; i < points.size() && !g_stop; ++i) {
        const Point &pt = points[i];
        char label[96];
        std::snprintf(label, sizeof label, "%zu/%zu %s x %zu x %u: ", i + 1, points.size(),
                      size_text(static_cast<double>(pt.block_size)).c_str(), pt.batch_size, pt.threads);
        Outcome r = measure(o, pt, engine, seg, local.data, target_region, verify_bufs, label);
        if (o.json) std::printf("%s\n", point_json(o, pt, r).c_str());
        else
            std::printf("%sthroughput %.*f %s/s, batch p50 %.3f ms, p99 %.3f ms\n", label, o.report_precision,
                        r.throughput, o.report_unit.c_str(), r.p50, r.p99);
        std::fflush(stdout);
        json += (i ? "," : "") + point_json(o, pt, r);
    }
    json += "]}\n";
    FILE *f = std::fopen(o.sweep_out.c_str(), "w");
    if (!f || std::fputs(json.c_str(), f) < 0 || std::fclose(f) != 0)
        die("cannot write " + o.sweep_out + ": " + strerror(errno));
    if (!o.json)
        std::printf("Sweep of %zu points written to %s; plot it: bench/plot_sweep.py %s sweep.png\n", points.size(),
                    o.sweep_out.c_str(), o.sweep_out.c_str());
    return 0;
}

Options parse(int argc, char **argv) {
    Options o;
    po::options_description desc("usage: transfer_engine_bench [options]\n"
                                 "  transfer_engine_bench --loopback                       target and initiator in one process\n"
                                 "  transfer_engine_bench --mode=target --local_server_name=127.0.0.1:7000\n"
                                 "  transfer_engine_bench --mode=initiator --segment_id=127.0.0.1:7000\n"
                                 "  transfer_engine_bench --loopback --sweep --duration=1  then bench/plot_sweep.py sweep.json\n"
                                 "options");
    desc.add_options()("help,h", "show this help")
        ("mode", po::value(&o.mode)->default_value(o.mode), "target | initiator | loopback")
        ("loopback", po::bool_switch(&o.loopback), "target and initiator in this one process (same as --mode=loopback)")
        ("metadata_server", po::value(&o.metadata_server)->default_value(o.metadata_server), "P2PHANDSHAKE (each engine serves its own descriptor; segments are ip:port), "
         "etcd://host:2379[,host:2379...]/prefix, or etcds://host:2379[,...]/prefix for etcd over TLS "
         "(docs/DEPLOYMENT.md; etcd_* keys of --option/--config for certificates and users)")
        ("local_server_name", po::value(&o.local_server_name), "target: ip:port to listen on (default 127.0.0.1, any port); with etcd: the segment's name")
        ("segment_id", po::value(&o.segment_id), "initiator: the target's segment name (ip:port, or its etcd name)")
        ("operation", po::value(&o.operation)->default_value(o.operation), "read | write")
        ("protocol", po::value(&o.protocol)->default_value(o.protocol), "transport to force (tcp, shm, ...)")
        ("buffer_size", po::value(&o.buffer_size)->default_value(o.buffer_size), "bytes registered on each side")
        ("batch_size", po::value(&o.batch_size)->default_value(o.batch_size), "ops per batch")
        ("block_size", po::value(&o.block_size)->default_value(o.block_size), "bytes per op")
        ("duration", po::value(&o.duration)->default_value(o.duration), "seconds")
        ("threads", po::value(&o.threads)->default_value(o.threads), "initiator threads, each with its own batches")
        ("report_unit", po::value(&o.report_unit)->default_value(o.report_unit), "GB GiB Gb MB MiB Mb KB KiB Kb")
        ("report_precision", po::value(&o.report_precision)->default_value(o.report_precision), "digits after the point")
        ("verify", po::bool_switch(&o.verify), "check every byte moved")
        ("json", po::bool_switch(&o.json), "print one JSON object instead of text")
        ("config", po::value(&o.config), "engine YAML config file")
        ("option", po::value(&o.options)->composing(), "engine or transport option key=value, e.g. tcp.lanes=2 (repeatable)")
        ("wait_for_target", po::value(&o.wait_for_target)->default_value(o.wait_for_target),
         "initiator: seconds to wait for a target that is not up yet (0: fail at once)")
        ("sweep", po::bool_switch(&o.sweep), "measure every block size x batch size x threads below, --duration each")
        ("sweep_block_sizes", po::value(&o.sweep_block_sizes)->default_value(o.sweep_block_sizes), "bytes, comma list")
        ("sweep_batch_sizes", po::value(&o.sweep_batch_sizes)->default_value(o.sweep_batch_sizes), "ops per batch, comma list")
        ("sweep_threads", po::value(&o.sweep_threads)->default_value(o.sweep_threads), "threads, comma list")
        ("sweep_out", po::value(&o.sweep_out)->default_value(o.sweep_out), "where --sweep writes its JSON");
    po::variables_map vm;
    try {
        po::store(po::parse_command_line(argc, argv, desc), vm);
        po::notify(vm);
    } catch (const po::error &e) {
        die(std::string(e.what()) + "; see --help");
    }
    if (vm.count("help")) {
        std::cout << desc << "\n"
                  << "Environment:\n"
                  << "  FERRY_PLUGIN_PATH     colon list of plugin directories searched first; a build tree needs none\n"
                  << "                        (build/core/ferry/plugins), an install looks in <libdir>/ferry/plugins\n"
                  << "  FERRY_PLUGINS         load only these plugins (tcp,shm) or all but these (^efa)\n"
                  << "  FERRY_LOG_LEVEL       error, warn (default), info, debug, trace\n"
                  << "  FERRY_AUTH_SECRET     cluster secret (>= 16 bytes) peers must share; FERRY_AUTH_SECRET_FILE: from a file\n"
                  << "  FERRY_HOST_ID         which peers count as the same host (default: machine id + boot id)\n"
                  << "  FERRY_EFA_PROVIDER    libfabric provider for efa.so (default efa; tcp to run without EFA)\n"
                  << "build/core/ferry-info shows which plugins load and why the others do not.\n";
        std::exit(0);
    }
    if (o.loopback) o.mode = "loopback";
    if (o.mode != "target" && o.mode != "initiator" && o.mode != "loopback") die("--mode must be target, initiator or loopback");
    if (o.operation != "read" && o.operation != "write") die("--operation must be read or write");
    if (o.block_size == 0 || o.batch_size == 0 || o.threads == 0 || o.duration <= 0)
        die("--block_size, --batch_size, --threads and --duration must be positive");
    if (o.block_size > o.buffer_size) die("--block_size is larger than --buffer_size");
    if (o.mode == "initiator" && o.segment_id.empty()) die("--mode=initiator needs --segment_id=<target ip:port>");
    unit_divisor(o.report_unit);
    return o;
}

} // namespace

int main(int argc, char **argv) {
    Options o = parse(argc, argv);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGPIPE, SIG_IGN);

    std::unique_ptr<ferry::Engine> target;
    std::unique_ptr<Buffer> target_buf;
    if (o.mode == "target" || o.mode == "loopback") {
        target = make_engine(o, true);
        target_buf = std::make_unique<Buffer>(o.buffer_size);
        fill(target_buf->data, target_buf->size, 1);
        if (auto r = target->register_memory(target_buf->data, target_buf->size); !r) die(r.error().message);
        if (o.mode == "target") {
            std::printf("segment %s ready: %llu bytes registered; Ctrl-C to stop\n", target->segment_name().c_str(),
                        static_cast<unsigned long long>(o.buffer_size));
            std::fflush(stdout);
            while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(200));
            return 0;
        }
    }
    auto initiator = make_engine(o, false);
    return run_initiator(o, *initiator, o.mode == "loopback" ? target->segment_name() : o.segment_id);
}
