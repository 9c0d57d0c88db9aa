// transfer_engine_bench: Mooncake-compatible throughput benchmark for Ferry.
//
//   target:     transfer_engine_bench --mode=target [--local_server_name=127.0.0.1:7000]
//   initiator:  transfer_engine_bench --mode=initiator --segment_id=127.0.0.1:7000
//   one command: transfer_engine_bench --loopback
//   curves:      transfer_engine_bench --loopback --sweep --duration=1 (then bench/plot_sweep.py)
//   GPU memory:  add --use_vram [--gpu_id=N] on either side (bench_memory.hpp)
//   a file:      transfer_engine_bench --protocol=file --segment_id=file:/path [--pattern=random]
//                (the remote address is the file offset; --inflight_batches keeps the queue full)
//
// Throughput = batches x batch_size x block_size / duration, as Mooncake defines it. The flags
// are bench_options.cpp's (what Mooncake's mean here: bench_mooncake_flags.cpp); this file runs
// the target and the initiator.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "bench_memory.hpp"
#include "bench_options.hpp"
#include "ferry/engine.hpp"
#include "huge_pages.hpp"

using Clock = std::chrono::steady_clock;
using bench::Buffer;
using bench::Options;

namespace {

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
    double throughput = 0;  // in o.report_unit per second
    double p50 = 0, p99 = 0;
    std::string transport;  // what carried the first batch's first op
};

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop = true; }

[[noreturn]] void die(const std::string &what) {
    std::fprintf(stderr, "transfer_engine_bench: %s\n", what.c_str());
    std::exit(1);
}

template <class T>
T check(ferry::Result<T> r) {
    if (!r) die(r.error().message);
    if constexpr (!std::is_void_v<T>) return std::move(*r);
}

constexpr uint64_t kTargetSeed = 1, kInitiatorSeed = 2;

std::unique_ptr<ferry::Engine> make_engine(const Options &o, bench::Role role) {
    auto engine = check(ferry::Engine::create(check(bench::engine_config(o, role))));
    if (auto at = engine->metrics_address(); !at.empty()) {
        std::fprintf(stderr, "metrics: http://%s/metrics\n", at.c_str());
        std::fflush(stderr);
    }
    return engine;
}

// The GPUs --use_vram puts buffers on: --gpu_id, or every one with -1 (Mooncake's meaning).
std::vector<int> gpu_devices(const Options &o, bench::GpuRuntime &gpu) {
    int n = gpu.device_count();  // -1: the runtime cannot count
    if (o.gpu_id == -1) {
        if (n < 0) die("--gpu_id=-1: the GPU runtime cannot count its devices; give --gpu_id=N");
        std::vector<int> all(n);
        for (int i = 0; i < n; ++i) all[i] = i;
        return all;
    }
    if (n >= 0 && o.gpu_id >= n)
        die("--gpu_id=" + std::to_string(o.gpu_id) + ": this host has " + std::to_string(n) +
            (gpu.kind() == ferry::MemoryKind::Cuda ? " CUDA" : " HIP") + " device(s), 0.." + std::to_string(n - 1));
    return {o.gpu_id};
}

// Each side's buffers: one in host memory, or one per GPU of gpu_devices(), registered, and
// filled with `seed`'s pattern when `fill`. Unregistered before they are freed.
struct Registered {
    ferry::Engine &engine;
    std::vector<std::unique_ptr<Buffer>> buffers;
    ~Registered() {
        for (auto &b : buffers)
            if (!b->engine_registered()) (void)engine.unregister_memory(b->data());
    }
    int64_t huge_page_bytes() const {
        int64_t n = 0;
        for (auto &b : buffers) n += std::max<int64_t>(0, b->huge_page_bytes());
        return n;
    }
    uint64_t bytes() const {
        uint64_t n = 0;
        for (auto &b : buffers) n += b->size();
        return n;
    }
    std::vector<std::string> where() const {
        std::vector<std::string> out;
        for (auto &b : buffers) out.push_back(b->location());
        return out;
    }
};

std::unique_ptr<Registered> make_buffers(const Options &o, ferry::Engine &engine, bench::GpuRuntime *gpu, uint64_t seed,
                                         bool fill) {
    std::vector<std::unique_ptr<Buffer>> made;
    if (!gpu)
        made.push_back(check(o.shared_buffers ? Buffer::shared(engine, o.buffer_size)
                                              : Buffer::host(o.buffer_size, o.huge_pages)));
    else
        for (int d : gpu_devices(o, *gpu)) made.push_back(check(Buffer::device(*gpu, d, o.buffer_size)));
    auto out = std::unique_ptr<Registered>(new Registered{engine, {}});
    for (auto &b : made) {
        if (fill) check(b->fill(seed));
        if (b->engine_registered()) {
            out->buffers.push_back(std::move(b));
            continue;
        }
        if (auto r = engine.register_memory(b->data(), b->size(), b->memory_options()); !r)
            die("registering " + std::to_string(b->size()) + " bytes of " + b->location() +
                " memory: " + r.error().message);
        out->buffers.push_back(std::move(b));
    }
    return out;
}

std::string locations(const std::vector<std::string> &names) {
    std::string s;
    for (auto &n : names) s += (s.empty() ? "" : ",") + n;
    return s;
}

struct ThreadResult {
    std::atomic<uint64_t> batches{0};
    std::vector<double> latencies_ms;
    std::string error;
    std::string transport;
};

// What one initiator thread works on: its span [span_off, span_off + span_len) of a local
// buffer and of a remote region, at the same offsets in both (so --verify knows each byte).
struct Lane {
    Buffer *local;
    uint64_t remote_base;
    uint64_t span_off, span_len;
    Buffer *readback;               // WRITE --verify: host memory the remote block is read into
    std::vector<uint8_t> *scratch;  // READ --verify of GPU memory: the block copied to the host
};

// The first wrong byte of the block at `off`, as an error, or empty.
std::string verify_block(ferry::Engine &engine, const Options &o, const Point &pt, ferry::SegmentId seg,
                         const Lane &lane, uint64_t off) {
    if (o.operation == "write") {  // read it back from the target and compare with what was sent
        ferry::Request back{ferry::Opcode::Read,    lane.readback->data(), seg,
                            lane.remote_base + off, pt.block_size,         o.transport};
        auto rb = engine.submit(std::span(&back, 1));
        if (!rb) return "verify read-back: " + rb.error().message;
        auto w = engine.wait(*rb, std::chrono::seconds(60));
        (void)engine.free_batch(*rb);
        if (!w) return "verify read-back: " + w.error().message;
        if (auto bad = bench::find_mismatch(lane.readback->data(), pt.block_size, off, kInitiatorSeed))
            return "verify: remote byte " + std::to_string(*bad) + " differs from what was written";
        return {};
    }
    const uint8_t *got = lane.local->data() + off;
    if (lane.local->on_gpu()) {
        if (auto r = lane.local->read(off, lane.scratch->data(), pt.block_size); !r)
            return "verify: copying the block from " + lane.local->location() + ": " + r.error().message;
        got = lane.scratch->data();
    }
    if (auto bad = bench::find_mismatch(got, pt.block_size, off, kTargetSeed))
        return "verify: byte " + std::to_string(*bad) +
               " read wrong (a target started with --init_mem=false, or one "
               "an earlier --operation=write run overwrote, holds other bytes)";
    return {};
}

void run_initiator_thread(ferry::Engine &engine, const Options &o, const Point &pt, ferry::SegmentId seg, Lane lane,
                          Clock::time_point end, ThreadResult &out, unsigned index) {
    const ferry::Opcode op = o.operation == "read" ? ferry::Opcode::Read : ferry::Opcode::Write;
    const uint64_t blocks_in_span = lane.span_len / pt.block_size;
    // --inflight_batches: a new batch is submitted as soon as the oldest one ended, so the queue
    // below (a file's io_uring, a NIC's) never drains between batches, as fio's iodepth keeps it.
    struct Slot {
        std::vector<ferry::Request> reqs;
        ferry::BatchId id = 0;
        Clock::time_point t0;
    };
    std::vector<Slot> slots(o.inflight_batches);
    for (auto &s : slots) s.reqs.resize(pt.batch_size);
    std::mt19937_64 rng(0x9e3779b97f4a7c15ull * (index + 1));
    uint64_t next_block = 0;
    auto post = [&](Slot &s) {
        for (size_t i = 0; i < pt.batch_size; ++i) {
            uint64_t block = o.pattern == "random" ? rng() % blocks_in_span : next_block++ % blocks_in_span;
            uint64_t off = lane.span_off + block * pt.block_size;
            s.reqs[i] = {op, lane.local->data() + off, seg, lane.remote_base + off, pt.block_size, o.transport};
        }
        s.t0 = Clock::now();
        auto b = engine.submit(s.reqs);
        if (!b) {
            out.error = b.error().message;
            return false;
        }
        s.id = *b;
        return true;
    };
    size_t head = 0, posted = 0;
    // At least one batch, so a thread started late on a loaded machine still measures something;
    // then batches while time is left, and the ones in flight drained at the end.
    for (bool first = true;;) {
        while (posted < slots.size() && !g_stop && (first || Clock::now() < end)) {
            if (!post(slots[(head + posted) % slots.size()])) return;
            ++posted, first = false;
        }
        if (!posted) break;
        Slot &s = slots[head];
        head = (head + 1) % slots.size(), --posted;
        auto w = engine.wait(s.id, std::chrono::seconds(60));
        auto t1 = Clock::now();
        if (w && out.transport.empty())
            if (auto st = engine.status(s.id, 0)) out.transport = st->transport;
        (void)engine.free_batch(s.id);
        if (!w) {
            out.error = w.error().message;
            return;
        }
        out.latencies_ms.push_back(std::chrono::duration<double, std::milli>(t1 - s.t0).count());
        out.batches.fetch_add(1, std::memory_order_relaxed);  // read live by the progress line
        if (!o.verify) continue;
        for (size_t i = 0; i < pt.batch_size; ++i)
            if (auto e = verify_block(engine, o, pt, seg, lane, s.reqs[i].remote - lane.remote_base); !e.empty()) {
                out.error = e;
                return;
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
    auto deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.wait_for_target));
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

// Everything a measurement runs over: the target's regions and this side's buffers.
struct Setup {
    ferry::SegmentId seg;
    std::vector<ferry::RemoteRegion> regions;
    std::vector<std::unique_ptr<Buffer>> &local;
    std::vector<std::unique_ptr<Buffer>> &readback;
    std::vector<std::vector<uint8_t>> &scratch;
    uint64_t usable;  // bytes of every local buffer and remote region the threads share out
};

// One point: o.duration seconds of batches from pt.threads threads. Thread t works on local
// buffer t % buffers and remote region t % regions (Mooncake's mapping for --gpu_id=-1), on
// its own span. On a terminal (and without --json) a live line shows the throughput so far.
Outcome measure(const Options &o, const Point &pt, ferry::Engine &engine, Setup &s, const std::string &label) {
    uint64_t per_thread = s.usable / pt.threads / pt.block_size * pt.block_size;
    if (per_thread < pt.block_size)
        die("buffer too small: each of " + std::to_string(pt.threads) + " threads needs at least one " +
            std::to_string(pt.block_size) + "-byte block; raise --buffer_size");
    std::vector<ThreadResult> results(pt.threads);
    auto start = Clock::now();
    auto end = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.duration));
    std::vector<std::thread> workers;
    for (unsigned t = 0; t < pt.threads; ++t) {
        Lane lane{s.local[t % s.local.size()].get(),
                  s.regions[t % s.regions.size()].addr,
                  t * per_thread,
                  per_thread,
                  s.readback.empty() ? nullptr : s.readback[t].get(),
                  &s.scratch[t]};
        workers.emplace_back(run_initiator_thread, std::ref(engine), std::cref(o), std::cref(pt), s.seg, lane, end,
                             std::ref(results[t]), t);
    }
    const bool live = isatty(STDOUT_FILENO) && !o.json;
    const double div = bench::unit_divisor(o.report_unit);
    while (live && !g_stop && Clock::now() < end) {
        std::this_thread::sleep_for(std::chrono::milliseconds(250));
        uint64_t done = 0;
        for (auto &r : results) done += r.batches.load(std::memory_order_relaxed);
        double secs = std::chrono::duration<double>(Clock::now() - start).count();
        std::printf("\r\033[K%s[%5.1f s] %.*f %s/s so far, %.1f s left", label.c_str(), secs, o.report_precision,
                    done * pt.batch_size * pt.block_size / secs / div, o.report_unit.c_str(),
                    std::max(0.0, o.duration - secs));
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
        if (out.transport.empty()) out.transport = r.transport;
    }
    out.bytes = static_cast<double>(out.batches) * pt.batch_size * pt.block_size;
    out.throughput = out.bytes / out.secs / div;
    out.p50 = percentile(lat, 50);
    out.p99 = percentile(lat, 99);
    return out;
}

// --protocol as typed, or "auto" where --auto_discovery lets the engine pick ("transport" then
// says which one carried the ops).
std::string protocol_text(const Options &o) { return o.transport.empty() ? "auto" : o.protocol; }

std::string point_json(const Options &o, const Point &pt, const Outcome &r, const std::string &memory) {
    char buf[768];
    std::snprintf(buf, sizeof buf,
                  "{\"operation\":\"%s\",\"protocol\":\"%s\",\"transport\":\"%s\",%s,\"block_size\":%llu,"
                  "\"batch_size\":%zu,\"threads\":%u,\"duration_s\":%.3f,\"batches\":%llu,\"bytes\":%.0f,"
                  "\"throughput\":%.*f,\"unit\":\"%s/s\",\"batch_latency_p50_ms\":%.3f,\"batch_latency_p99_ms\":%.3f,"
                  "\"verified\":%s}",
                  o.operation.c_str(), protocol_text(o).c_str(), r.transport.c_str(), memory.c_str(),
                  static_cast<unsigned long long>(pt.block_size), pt.batch_size, pt.threads, r.secs,
                  static_cast<unsigned long long>(r.batches), r.bytes, o.report_precision, r.throughput,
                  o.report_unit.c_str(), r.p50, r.p99, o.verify ? "true" : "false");
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
        if (item.empty() || *stop || v == 0)
            die("--" + flag + " takes positive integers separated by commas, got '" + text + "'");
        out.push_back(v);
        start = end + 1;
    }
    return out;
}

std::vector<Point> sweep_points(const Options &o) {
    std::vector<Point> points;
    for (uint64_t t : parse_list("sweep_threads", o.sweep_threads))
        for (uint64_t b : parse_list("sweep_batch_sizes", o.sweep_batch_sizes))
            for (uint64_t bs : parse_list("sweep_block_sizes", o.sweep_block_sizes)) {
                if (bs > o.buffer_size)
                    die("--sweep_block_sizes: " + std::to_string(bs) + " is larger than --buffer_size");
                points.push_back({bs, static_cast<size_t>(b), static_cast<unsigned>(t)});
            }
    return points;
}

// The regions the target registered, waiting for a target that serves its descriptor before
// its buffers are registered.
std::vector<ferry::RemoteRegion> target_regions(const Options &o, ferry::Engine &engine, ferry::SegmentId &seg,
                                                const std::string &name) {
    seg = open_target(o, engine, name);
    auto regions = engine.segment_regions(seg);
    auto deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.wait_for_target));
    while (regions && regions->empty() && !g_stop && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        (void)engine.close_segment(seg);
        seg = open_target(o, engine, name);
        regions = engine.segment_regions(seg);
    }
    if (!regions) die(regions.error().message);
    if (regions->empty()) die("segment " + name + " has registered no memory");
    return *regions;
}

// A forced transport this engine has not loaded fails every request: say so before starting.
void check_transport(const Options &o, const ferry::Engine &engine) {
    if (o.transport.empty()) return;
    std::string loaded;
    for (auto &t : engine.transports()) {
        if (t.name == o.transport) return;
        loaded += (loaded.empty() ? "" : ", ") + t.name;
    }
    die("--protocol=" + o.protocol + ": transport " + o.transport + " is not loaded here (loaded: " +
        (loaded.empty() ? "none" : loaded) + "); ferry-info says why, --auto_discovery uses what loaded");
}

int run_initiator(const Options &o, ferry::Engine &engine, const std::string &segment_name, bench::GpuRuntime *gpu) {
    check_transport(o, engine);
    ferry::SegmentId seg;
    std::vector<ferry::RemoteRegion> regions = target_regions(o, engine, seg, segment_name);
    std::vector<std::string> target_where;
    uint64_t usable = o.buffer_size;
    for (auto &r : regions) {
        target_where.push_back(bench::location_name(r.kind, r.device));
        usable = std::min(usable, r.length);
    }
    std::vector<Point> points = o.sweep ? sweep_points(o) : std::vector<Point>{{o.block_size, o.batch_size, o.threads}};
    uint64_t max_block = 0;
    unsigned max_threads = 0;
    for (auto &p : points)
        max_block = std::max(max_block, p.block_size), max_threads = std::max(max_threads, p.threads);

    const bool write = o.operation == "write";
    auto local = make_buffers(o, engine, gpu, kInitiatorSeed, write && (o.init_mem || o.verify));
    std::vector<std::string> local_where = local->where();
    Registered readback{engine, {}};
    std::vector<std::vector<uint8_t>> scratch(max_threads);
    for (unsigned t = 0; o.verify && t < max_threads; ++t) {
        if (write) {
            readback.buffers.push_back(check(Buffer::host(max_block)));
            check(engine.register_memory(readback.buffers.back()->data(), max_block));
        } else if (gpu) {
            scratch[t].resize(max_block);
        }
    }
    Setup setup{seg, regions, local->buffers, readback.buffers, scratch, usable};
    const std::string memory = "\"initiator_memory\":\"" + locations(local_where) + "\",\"target_memory\":\"" +
                               locations(target_where) +
                               "\",\"initiator_huge_page_bytes\":" + std::to_string(local->huge_page_bytes());

    if (!o.sweep) {
        const Point &pt = points.front();
        Outcome r = measure(o, pt, engine, setup, "");
        if (o.json) {
            std::printf("%s\n", point_json(o, pt, r, memory).c_str());
        } else {
            std::printf("Test completed: duration %.2f, batch count %llu, throughput %.*f %s/s\n", r.secs,
                        static_cast<unsigned long long>(r.batches), o.report_precision, r.throughput,
                        o.report_unit.c_str());
            std::printf(
                "Batch latency: p50 %.3f ms, p99 %.3f ms (%s over %s, %llu-byte blocks, %zu per batch, %u threads%s)\n",
                r.p50, r.p99, o.operation.c_str(), r.transport.c_str(), static_cast<unsigned long long>(pt.block_size),
                pt.batch_size, pt.threads, o.verify ? ", every byte verified" : "");
            std::printf("Memory: initiator %s, target %s; initiator's huge pages: %lld of %llu MiB (THP '%s')\n",
                        locations(local_where).c_str(), locations(target_where).c_str(),
                        static_cast<long long>(local->huge_page_bytes() >> 20),
                        static_cast<unsigned long long>(local->bytes() >> 20), ferry::thp_mode().c_str());
        }
        return 0;
    }
    // --sweep: every point for --duration seconds, one line each as it finishes, then the JSON.
    std::string json =
        "{\"operation\":\"" + o.operation + "\",\"protocol\":\"" + protocol_text(o) + "\"," + memory + ",\"points\":[";
    for (size_t i = 0; i < points.size() && !g_stop; ++i) {
        const Point &pt = points[i];
        char label[96];
        std::snprintf(label, sizeof label, "%zu/%zu %s x %zu x %u: ", i + 1, points.size(),
                      size_text(static_cast<double>(pt.block_size)).c_str(), pt.batch_size, pt.threads);
        Outcome r = measure(o, pt, engine, setup, label);
        if (o.json) std::printf("%s\n", point_json(o, pt, r, memory).c_str());
        else
            std::printf("%sthroughput %.*f %s/s, batch p50 %.3f ms, p99 %.3f ms\n", label, o.report_precision,
                        r.throughput, o.report_unit.c_str(), r.p50, r.p99);
        std::fflush(stdout);
        if (i) json += ',';
        json += point_json(o, pt, r, memory);
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

}  // namespace

int main(int argc, char **argv) {
    Options o = bench::parse_options(argc, argv);
    for (auto &n : o.notes) std::fprintf(stderr, "transfer_engine_bench: note: %s\n", n.c_str());
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGPIPE, SIG_IGN);

    std::unique_ptr<bench::GpuRuntime> gpu;  // declared first: outlives every buffer on it
    if (o.use_vram) {
        std::string why;
        gpu = bench::GpuRuntime::open(why);
        if (!gpu) die("--use_vram: no GPU runtime found (" + why + "); run without --use_vram or install the driver");
    }
    std::unique_ptr<ferry::Engine> target;
    std::unique_ptr<Registered> target_bufs;  // declared after its engine: unregistered first
    if (o.mode == "target" || o.mode == "loopback") {
        target = make_engine(o, bench::Role::Target);
        target_bufs = make_buffers(o, *target, gpu.get(), kTargetSeed, o.init_mem);
        if (o.mode == "target") {
            std::vector<std::string> where = target_bufs->where();
            std::printf("segment %s ready: %llu bytes registered in %s memory; Ctrl-C to stop\n",
                        target->segment_name().c_str(), static_cast<unsigned long long>(o.buffer_size),
                        locations(where).c_str());
            std::fflush(stdout);
            while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(200));
            return 0;
        }
    }
    auto initiator = make_engine(o, o.mode == "loopback" ? bench::Role::LoopbackInitiator : bench::Role::Initiator);
    int rc = run_initiator(o, *initiator, o.mode == "loopback" ? target->segment_name() : o.segment_id, gpu.get());
    return rc;
}
