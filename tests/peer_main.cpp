// ferry_test_peer: a target engine in its own process for the two-process tests.
// Prints "READY <segment> <buffer address> <size>", then answers commands on stdin:
//   sum    -> "SUM <fnv1a-64 of the buffer>"
//   unreg  -> unregisters the buffer, "OK"
//   free   -> --managed only: frees the buffer (free_shared), then maps fresh memory filled with
//             0xee where it was (a re-used address), "OK"
//   notify <segment> <text>  -> sends a notification, "OK" or "ERROR <code> <message>"
//   writenotify <segment> <hex addr> <length> <byte> <text>
//          -> WRITEs length bytes of value byte there, waits, then notifies; "OK" or "ERROR ..."
//   batchnotify <segment> <byte> <text> <hex addr>:<length> ...
//          -> one WRITE of value byte per range, submitted with the notification <text>
//             (submit_with_notification), then waits; "OK" or "ERROR <code> <message>"
//   flood <segment> <count> -> sends count notifications as fast as it can;
//          "FLOODED <queued> <refused with ENOBUFS> <other failures>"
//   take   -> "TAKEN <n> <from>|<text> ..." (notifications received so far)
//   quit   -> exits
// Options: --access r|w|rw sets the buffer's remote access rights (default rw); --managed
// allocates the buffer with alloc_shared (a managed buffer, which shm.so hands to peers).
#include <sys/mman.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "ferry/engine.hpp"
#include "peer_pattern.hpp"

int main(int argc, char **argv) {
    uint64_t size = 8 << 20;
    ferry::Config config{{"plugins", "tcp"}};
    ferry::MemoryOptions memory;
    bool managed = false;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--size" && i + 1 < argc) size = std::strtoull(argv[++i], nullptr, 0);
        else if (a == "--managed") managed = true;
        else if (a == "--access" && i + 1 < argc) {
            std::string rights = argv[++i];
            memory.access = (rights.find('r') != std::string::npos ? ferry::kRemoteRead : 0) |
                            (rights.find('w') != std::string::npos ? ferry::kRemoteWrite : 0);
        } else if (a == "--option" && i + 1 < argc) {
            std::string kv = argv[++i];
            auto eq = kv.find('=');
            config[kv.substr(0, eq)] = kv.substr(eq + 1);
        }
    }
    auto engine = ferry::Engine::create(config);
    if (!engine) {
        std::printf("ERROR %s\n", engine.error().message.c_str());
        return 1;
    }
    std::vector<uint8_t> plain;
    std::span<uint8_t> buffer;
    if (managed) {
        auto p = (*engine)->alloc_shared(size, memory.access);
        if (!p) {
            std::printf("ERROR %s\n", p.error().message.c_str());
            return 1;
        }
        buffer = {static_cast<uint8_t *>(*p), size};
    } else {
        plain.resize(size);
        buffer = plain;
    }
    for (uint64_t i = 0; i < size; ++i) buffer[i] = ferry::test::peer_pattern(i);
    if (auto r = managed ? ferry::Result<void>{} : (*engine)->register_memory(buffer.data(), size, memory); !r) {
        std::printf("ERROR %s\n", r.error().message.c_str());
        return 1;
    }
    std::printf("READY %s %" PRIxPTR " %" PRIu64 "\n", (*engine)->segment_name().c_str(),
                reinterpret_cast<uintptr_t>(buffer.data()), size);
    std::fflush(stdout);
    std::string cmd;
    while (std::getline(std::cin, cmd)) {
        if (cmd == "sum") {
            std::printf("SUM %" PRIx64 "\n", ferry::test::fnv1a(buffer.data(), buffer.size()));
        } else if (cmd == "free" && managed) {
            auto r = (*engine)->free_shared(buffer.data());
            // The same addresses, re-used: a peer's late copy must never land here.
            void *again = mmap(buffer.data(), size, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
            if (again == buffer.data()) std::memset(again, 0xee, size);
            std::printf("%s\n", !r ? r.error().message.c_str() : again == buffer.data() ? "OK" : "ERROR remap");
        } else if (cmd == "unreg") {
            auto r = (*engine)->unregister_memory(buffer.data());
            std::printf("%s\n", r ? "OK" : r.error().message.c_str());
        } else if (cmd.rfind("notify ", 0) == 0 || cmd.rfind("writenotify ", 0) == 0) {
            std::istringstream in(cmd);
            std::string verb, segment, text, addr;
            uint64_t length = 0;
            unsigned value = 0;
            in >> verb >> segment;
            if (verb == "writenotify") in >> addr >> length >> value;
            in >> text;
            auto reply = [&]() -> ferry::Result<void> {
                auto seg = (*engine)->open_segment(segment);
                if (!seg) return std::unexpected(seg.error());
                if (verb == "writenotify") {
                    std::memset(buffer.data(), static_cast<int>(value), length);
                    ferry::Request w{ferry::Opcode::Write, buffer.data(), *seg,
                                     std::strtoull(addr.c_str(), nullptr, 16), length};
                    auto batch = (*engine)->submit(std::span(&w, 1));
                    if (!batch) return std::unexpected(batch.error());
                    auto done = (*engine)->wait(*batch);
                    (void)(*engine)->free_batch(*batch);
                    if (!done) return done;
                }
                return (*engine)->send_notification(*seg,
                                                    {reinterpret_cast<const uint8_t *>(text.data()), text.size()});
            }();
            if (reply) std::printf("OK\n");
            else std::printf("ERROR %d %s\n", reply.error().code, reply.error().message.c_str());
        } else if (cmd.rfind("batchnotify ", 0) == 0) {
            std::istringstream in(cmd);
            std::string verb, segment, text, range;
            unsigned value = 0;
            in >> verb >> segment >> value >> text;
            auto reply = [&]() -> ferry::Result<void> {
                auto seg = (*engine)->open_segment(segment);
                if (!seg) return std::unexpected(seg.error());
                std::vector<ferry::Request> writes;
                while (in >> range) {
                    auto colon = range.find(':');
                    uint64_t length = std::strtoull(range.c_str() + colon + 1, nullptr, 0);
                    if (length > size) return ferry::fail(-EINVAL, "range longer than the peer's buffer");
                    writes.push_back({ferry::Opcode::Write, buffer.data(), *seg,
                                      std::strtoull(range.substr(0, colon).c_str(), nullptr, 16), length, ""});
                }
                std::memset(buffer.data(), static_cast<int>(value), size);
                auto batch = (*engine)->submit_with_notification(
                    writes, *seg, {reinterpret_cast<const uint8_t *>(text.data()), text.size()});
                if (!batch) return std::unexpected(batch.error());
                auto done = (*engine)->wait(*batch);
                (void)(*engine)->free_batch(*batch);
                return done;
            }();
            if (reply) std::printf("OK\n");
            else std::printf("ERROR %d %s\n", reply.error().code, reply.error().message.c_str());
        } else if (cmd.rfind("flood ", 0) == 0) {
            std::istringstream in(cmd);
            std::string verb, segment;
            size_t count = 0, queued = 0, refused = 0, other = 0;
            in >> verb >> segment >> count;
            auto seg = (*engine)->open_segment(segment);
            std::vector<uint8_t> message(1024, 'f');
            for (size_t i = 0; seg && i < count; ++i) {
                auto r = (*engine)->send_notification(*seg, message);
                if (r) ++queued;
                else if (r.error().code == -ENOBUFS) ++refused;
                else ++other;
            }
            std::printf("FLOODED %zu %zu %zu\n", queued, refused, seg ? other : count);
        } else if (cmd == "take") {
            auto notes = (*engine)->take_notifications();
            std::printf("TAKEN %zu", notes.size());
            for (auto &n : notes)
                std::printf(" %s|%.*s", n.from.c_str(), static_cast<int>(n.message.size()),
                            reinterpret_cast<const char *>(n.message.data()));
            std::printf("\n");
        } else if (cmd == "quit") {
            break;
        } else {
            std::printf("ERROR unknown command %s\n", cmd.c_str());
        }
        std::fflush(stdout);
    }
    return 0;
}
