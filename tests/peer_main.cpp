// ferry_test_peer: a target engine in its own process for the two-process tests.
// Prints "READY <segment> <buffer address> <size>", then answers commands on stdin:
//   sum    -> "SUM <fnv1a-64 of the buffer>"
//   unreg  -> unregisters the buffer, "OK"
//   quit   -> exits
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "ferry/engine.hpp"
#include "peer_pattern.hpp"

int main(int argc, char **argv) {
    uint64_t size = 8 << 20;
    ferry::Config config{{"plugins", "tcp"}};
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--size" && i + 1 < argc) size = std::strtoull(argv[++i], nullptr, 0);
        else if (a == "--option" && i + 1 < argc) {
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
    std::vector<uint8_t> buffer(size);
    for (uint64_t i = 0; i < size; ++i) buffer[i] = ferry::test::peer_pattern(i);
    if (auto r = (*engine)->register_memory(buffer.data(), size); !r) {
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
        } else if (cmd == "unreg") {
            auto r = (*engine)->unregister_memory(buffer.data());
            std::printf("%s\n", r ? "OK" : r.error().message.c_str());
        } else if (cmd == "quit") {
            break;
        } else {
            std::printf("ERROR unknown command %s\n", cmd.c_str());
        }
        std::fflush(stdout);
    }
    return 0;
}
