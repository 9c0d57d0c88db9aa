// Helpers shared by the rdma_logic test files (one subject each, all in the test rdma_logic).
#pragma once

#include <cstdint>
#include <string>

#include "wire.hpp"

namespace ferry_rdma::test {

inline constexpr uint64_t kMiB = 1ull << 20;

inline bool contains(const std::string &s, const std::string &part) { return s.find(part) != std::string::npos; }

inline NicAddress nic(const char *name, LinkLayer link, uint16_t lid, uint8_t last_gid_byte) {
    NicAddress n;
    n.name = name;
    n.link = link;
    n.lid = lid;
    n.port = 1;
    n.mtu = 5;
    n.gid_index = 3;
    n.gid[0] = 0xfe;
    n.gid[1] = 0x80;
    n.gid[15] = last_gid_byte;
    return n;
}

}  // namespace ferry_rdma::test
