// ferry_soak: a long run against many peer processes that checks what a short test cannot:
// no leak (this process's RSS and open descriptors sampled over time stay flat after warm-up),
// no lost or doubled completion (every op of every batch ends Done or Failed, exactly once),
// and no corrupted byte (reads compared with the peers' known contents; writes read back).
//
//   ferry_soak --duration=180 --peers=8 --batch=64 --block=65536 [--protocol=tcp]
//              [--option key=value]... [--max_rss_growth_mb=16]
//
// Each peer is this binary re-executed with --peer: an engine that registers a buffer filled
// with a known pattern and serves until its stdin closes. The initiator cycles through the
// peers submitting batches of reads (first half of each peer's buffer, checked byte for byte)
// and writes (second half, read back and checked every round), closes and reopens one segment
// and registers/unregisters a scratch region every few seconds (churn that would show leaks),
// prints a sample line every --sample_s seconds and a summary line, and exits 1 when any
// completion was lost, any op failed, any byte differed or RSS grew beyond the limit.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <dirent.h>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "ferry/engine.hpp"

using Clock = std::chrono::steady_clock;

namespace {

constexpr uint64_t kPeerBytes = 32ull << 20;

uint8_t pattern(uint64_t i) { return static_cast<uint8_t>((i * 2654435761u) >> 13); }

struct Args {
    double duration = 180;
    int peers = 8;
    int batch = 64;
    uint64_t block = 64 << 10;
    double sample_s = 10;
    std::string protocol = "tcp";
    double max_rss_growth_mb = 16;
    ferry::Config options;
};

bool take(const std::string &a, const char *name, std::string *v) {
    std::string prefix = std::string("--") + name + "=";
    if (a.rfind(prefix, 0) != 0) return false;
    *v = a.substr(prefix.size());
    return true;
}

Args parse(int argc, char **argv) {
    Args o;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i], v;
        if (take(a, "duration", &v)) o.duration = std::stod(v);
        else if (take(a, "peers", &v)) o.peers = std::stoi(v);
        else if (take(a, "batch", &v)) o.batch = std::stoi(v);
        else if (take(a, "block", &v)) o.block = std::stoull(v);
        else if (take(a, "sample_s", &v)) o.sample_s = std::stod(v);
        else if (take(a, "protocol", &v)) o.protocol = v;
        else if (take(a, "max_rss_growth_mb", &v)) o.max_rss_growth_mb = std::stod(v);
        else if (a == "--option" && i + 1 < argc) {
            std::string kv = argv[++i];
            auto eq = kv.find('=');
            if (eq == std::string::npos) {
                std::fprintf(stderr, "--option needs key=value, got '%s'\n", kv.c_str());
                std::exit(2);
            }
            o.options[kv.substr(0, eq)] = kv.substr(eq + 1);
        } else {
            std::fprintf(stderr, "unknown argument '%s'; see the comment at the top of bench/soak.cpp\n", a.c_str());
            std::exit(2);
        }
    }
    if (o.peers < 1 || o.batch < 1 || o.block == 0 || o.block * o.batch > kPeerBytes / 2) {
        std::fprintf(stderr, "need peers >= 1, batch >= 1 and batch * block <= %" PRIu64 " bytes\n", kPeerBytes / 2);
        std::exit(2);
    }
    return o;
}

ferry::Config engine_config(const Args &o) {
    ferry::Config c = o.options;
    c["plugins"] = o.protocol == "tcp" ? "tcp" : o.protocol + ",tcp";
    return c;
}

int peer_main(const Args &o) {
    auto engine = ferry::Engine::create(engine_config(o));
    if (!engine) {
        std::printf("ERROR %s\n", engine.error().message.c_str());
        return 1;
    }
    std::vector<uint8_t> buffer(kPeerBytes);
    for (uint64_t i = 0; i < kPeerBytes; ++i) buffer[i] = pattern(i);
    if (auto r = (*engine)->register_memory(buffer.data(), buffer.size()); !r) {
        std::printf("ERROR %s\n", r.error().message.c_str());
        return 1;
    }
    std::printf("READY %s %" PRIxPTR "\n", (*engine)->segment_name().c_str(),
                reinterpret_cast<uintptr_t>(buffer.data()));
    std::fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {}
    return 0;
}

struct Peer {
    pid_t pid = -1;
    int stdin_fd = -1;
    std::string segment;
    uint64_t base = 0;
    ferry::SegmentId id = 0;
};

bool spawn(const char *self, const std::vector<std::string> &args, Peer &p) {
    std::vector<char *> argv{const_cast<char *>(self)};  // before fork: no malloc in the child
    for (auto &a : args) argv.push_back(const_cast<char *>(a.c_str()));
    argv.push_back(nullptr);
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC)) return false;
    p.pid = fork();
    if (p.pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        execv("/proc/self/exe", argv.data());
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    p.stdin_fd = in[1];
    FILE *f = fdopen(out[0], "r");
    char line[512] = {};
    bool ok = fgets(line, sizeof line, f) != nullptr;
    fclose(f);
    char seg[256] = {};
    uintptr_t base = 0;
    if (!ok || std::sscanf(line, "READY %255s %" SCNxPTR, seg, &base) != 2) {
        std::fprintf(stderr, "peer %d did not start: %s\n", p.pid, line);
        return false;
    }
    p.segment = seg;
    p.base = base;
    return true;
}

uint64_t rss_kib(pid_t pid) {
    std::ifstream in(pid ? "/proc/" + std::to_string(pid) + "/status" : std::string("/proc/self/status"));
    std::string line;
    while (std::getline(in, line))
        if (line.rfind("VmRSS:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10);
    return 0;
}

size_t open_fds() {
    size_t n = 0;
    if (DIR *d = opendir("/proc/self/fd")) {
        while (readdir(d)) ++n;
        closedir(d);
    }
    return n - 2;
}

}  // namespace

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    bool is_peer = argc > 1 && std::strcmp(argv[1], "--peer") == 0;
    std::vector<std::string> peer_args;
    for (int i = is_peer ? 2 : 1; i < argc; ++i) peer_args.push_back(argv[i]);
    std::vector<char *> rest{argv[0]};
    for (auto &a : peer_args) rest.push_back(a.data());
    Args o = parse(static_cast<int>(rest.size()), rest.data());
    if (is_peer) return peer_main(o);

    std::vector<std::string> child_args{"--peer"};
    child_args.insert(child_args.end(), peer_args.begin(), peer_args.end());
    std::vector<Peer> peers(o.peers);
    for (auto &p : peers)
        if (!spawn(argv[0], child_args, p)) return 1;

    auto engine_r = ferry::Engine::create(engine_config(o));
    if (!engine_r) {
        std::fprintf(stderr, "engine: %s\n", engine_r.error().message.c_str());
        return 1;
    }
    auto &engine = *engine_r;
    const uint64_t half = kPeerBytes / 2;
    const uint64_t batch_bytes = o.block * o.batch;
    std::vector<uint8_t> local(2 * batch_bytes), scratch(1 << 20);
    std::vector<uint8_t> expected(kPeerBytes);
    for (uint64_t i = 0; i < kPeerBytes; ++i) expected[i] = pattern(i);
    if (auto r = engine->register_memory(local.data(), local.size()); !r) {
        std::fprintf(stderr, "register: %s\n", r.error().message.c_str());
        return 1;
    }
    for (auto &p : peers) {
        auto s = engine->open_segment(p.segment);
        if (!s) {
            std::fprintf(stderr, "open %s: %s\n", p.segment.c_str(), s.error().message.c_str());
            return 1;
        }
        p.id = *s;
    }

    std::mt19937_64 rng(42);
    std::vector<std::map<uint64_t, std::pair<int, uint8_t>>> written(peers.size());  // offset -> (k, salt)
    uint64_t submitted = 0, done = 0, failed = 0, lost = 0, doubled = 0, mismatches = 0, batches = 0, bytes = 0;
    uint64_t churn = 0;
    auto start = Clock::now();
    auto next_sample = start;
    auto next_churn = start + std::chrono::seconds(5);
    uint64_t rss_warm = 0, rss_end = 0, rss_first = rss_kib(0);
    size_t fds_warm = 0;
    std::string first_error;
    std::printf("soak: %d peers, batch %d x %" PRIu64 " B, %.0f s, protocol %s\n", o.peers, o.batch, o.block,
                o.duration, o.protocol.c_str());
    for (size_t round = 0;; ++round) {
        auto now = Clock::now();
        double elapsed = std::chrono::duration<double>(now - start).count();
        if (now >= next_sample || elapsed >= o.duration) {
            uint64_t rss = rss_kib(0), peer_rss = 0;
            for (auto &p : peers) peer_rss += rss_kib(p.pid);
            std::printf("t=%6.1fs ops=%" PRIu64 " done=%" PRIu64 " failed=%" PRIu64 " lost=%" PRIu64
                        " GB=%.2f rss=%" PRIu64 "KiB peers_rss=%" PRIu64 "KiB fds=%zu\n",
                        elapsed, submitted, done, failed, lost, bytes / 1e9, rss, peer_rss, open_fds());
            std::fflush(stdout);
            // Warm-up: allocator pools and per-peer connections settle in the first quarter.
            if (!rss_warm && elapsed >= o.duration / 4) {
                rss_warm = rss;
                fds_warm = open_fds();
            }
            rss_end = rss;
            next_sample = now + std::chrono::milliseconds(static_cast<int64_t>(o.sample_s * 1000));
        }
        if (elapsed >= o.duration) break;
        if (now >= next_churn) {
            // Close and reopen one peer's segment; register and drop a scratch region.
            Peer &p = peers[churn % peers.size()];
            (void)engine->close_segment(p.id);
            auto s = engine->open_segment(p.segment);
            if (!s) {
                std::fprintf(stderr, "reopen %s: %s\n", p.segment.c_str(), s.error().message.c_str());
                return 1;
            }
            p.id = *s;
            if (!engine->register_memory(scratch.data(), scratch.size()) ||
                !engine->unregister_memory(scratch.data())) {
                std::fprintf(stderr, "scratch region churn failed\n");
                return 1;
            }
            ++churn;
            next_churn = now + std::chrono::seconds(5);
        }
        // One batch per peer, all in flight together: reads into local[0, batch_bytes), writes
        // from local[batch_bytes, 2*batch_bytes) (a fresh pattern each round).
        std::vector<ferry::Request> reqs;
        std::vector<ferry::BatchId> ids;
        std::vector<std::vector<uint64_t>> read_offsets(peers.size());
        uint8_t salt = static_cast<uint8_t>(round);
        for (uint64_t i = 0; i < batch_bytes; ++i) local[batch_bytes + i] = static_cast<uint8_t>(i * 31 + salt);
        for (size_t pi = 0; pi < peers.size(); ++pi) {
            reqs.clear();
            uint64_t write_start = rng();
            for (int k = 0; k < o.batch; ++k) {
                if (k % 2 == 0) {  // read a random block of the read-only half
                    uint64_t off = rng() % (half / o.block) * o.block;
                    read_offsets[pi].push_back(off);
                    reqs.push_back({ferry::Opcode::Read, local.data() + k * o.block, peers[pi].id, peers[pi].base + off,
                                    o.block, ""});
                } else {  // write a block of the written half (distinct blocks within a batch)
                    uint64_t off = half + (write_start + k / 2) % (half / o.block) * o.block;
                    written[pi][off] = {k, salt};
                    reqs.push_back({ferry::Opcode::Write, local.data() + batch_bytes + k * o.block, peers[pi].id,
                                    peers[pi].base + off, o.block, ""});
                }
            }
            auto b = engine->submit(reqs);
            if (!b) {
                std::fprintf(stderr, "submit: %s\n", b.error().message.c_str());
                return 1;
            }
            ids.push_back(*b);
            submitted += reqs.size();
            // Reads of peers share local[0, batch_bytes): wait before the next peer's batch
            // overwrites it, then check. Writes stay in flight across peers.
            auto w = engine->wait(*b, std::chrono::seconds(60));
            for (int k = 0; k < o.batch; ++k) {
                auto st = engine->status(*b, k);
                if (!st || st->state == ferry::OpState::Pending) {
                    ++lost;
                    continue;
                }
                if (st->state == ferry::OpState::Done) ++done;
                else {
                    ++failed;
                    if (first_error.empty()) first_error = st->message;
                }
                bytes += o.block;
            }
            for (int k = 0; k < o.batch; k += 2)
                if (std::memcmp(local.data() + k * o.block, expected.data() + read_offsets[pi][k / 2], o.block) != 0)
                    ++mismatches;
            if (!w && first_error.empty()) first_error = w.error().message;
            // A freed batch must not be freed again or report again.
            if (!engine->free_batch(*b)) ++lost;
            if (engine->free_batch(*b)) ++doubled;
            ++batches;
        }
    }
    double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    // Every block written last with (position k, salt) must hold exactly those bytes.
    std::vector<uint8_t> back(half);
    if (!engine->register_memory(back.data(), back.size())) return 1;
    for (size_t pi = 0; pi < peers.size(); ++pi) {
        ferry::Request r{ferry::Opcode::Read, back.data(), peers[pi].id, peers[pi].base + half, half, ""};
        auto b = engine->submit(std::span(&r, 1));
        if (!b || !engine->wait(*b, std::chrono::seconds(60))) {
            std::fprintf(stderr, "reading back peer %zu failed\n", pi);
            ++mismatches;
            continue;
        }
        (void)engine->free_batch(*b);
        for (auto &[off, what] : written[pi])
            for (uint64_t j = 0; j < o.block; ++j)
                if (back[off - half + j] != static_cast<uint8_t>((what.first * o.block + j) * 31 + what.second)) {
                    ++mismatches;
                    break;
                }
    }
    for (auto &p : peers) {
        close(p.stdin_fd);
        int status = 0;
        waitpid(p.pid, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            std::fprintf(stderr, "peer %d exited with status %d\n", p.pid, status);
            ++mismatches;
        }
    }
    double growth_mb = rss_warm ? (double(rss_end) - double(rss_warm)) / 1024.0 : 0;
    bool ok = lost == 0 && doubled == 0 && failed == 0 && mismatches == 0 && done == submitted &&
              growth_mb <= o.max_rss_growth_mb && open_fds() <= fds_warm + 2;
    std::printf("soak %s: %.1f s, %" PRIu64 " batches, %" PRIu64 " ops submitted, %" PRIu64 " done, %" PRIu64
                " failed, %" PRIu64 " lost, %" PRIu64 " double-freed, %" PRIu64 " mismatches, %" PRIu64
                " segment reopens, rss start %" PRIu64 " KiB, after warm-up %" PRIu64 " KiB, end %" PRIu64
                " KiB (growth %.1f MiB, limit %.0f), fds after warm-up %zu, end %zu\n",
                ok ? "PASSED" : "FAILED", elapsed, batches, submitted, done, failed, lost, doubled, mismatches, churn,
                rss_first, rss_warm, rss_end, growth_mb, o.max_rss_growth_mb, fds_warm, open_fds());
    if (!first_error.empty()) std::printf("first error: %s\n", first_error.c_str());
    return ok ? 0 : 1;
}
