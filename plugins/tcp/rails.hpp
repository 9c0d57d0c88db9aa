// Rails: several local addresses (interfaces) used at once (tcp.rails). Each rail has its own
// listener and, towards each peer, its own lanes; the endpoint lists every rail's address. A
// peer's lanes are grouped by rail (peer.hpp), slices go to the rail that will finish them
// first by its measured throughput and queue, and a rail whose connection breaks hands its
// slices to the others and is paused (Peer::reroute).
#pragma once

#include "options.hpp"
#include "wire.hpp"

#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ferry_tcp {

// The addresses tcp.rails names: empty when it is not set (bind_ip alone, no source address
// bound: the single-rail behaviour); "auto": every address of an interface that is up, not a
// loopback one, IPv4 first. 0 or -EINVAL with *why naming the value and the fix (an address
// this host does not have, a malformed list, more than kMaxRails).
inline constexpr size_t kMaxRails = 8;
int resolve_rails(const Config &cfg, std::vector<std::string> *out, std::string *why);

// The endpoint of `addrs` (listening addresses, one per rail): the 28-byte single-address form
// (wire.hpp) for one, which peers without rails read; a list (version 2) for more.
std::vector<uint8_t> encode_rails_endpoint(const std::vector<sockaddr_storage> &addrs);
// Either form; false with *why when the bytes are neither.
bool decode_rails_endpoint(const void *buf, size_t len, std::vector<Endpoint> *out, std::string *why);

// Which remote rail each local rail connects to: the one in the local address's subnet (the
// interface's netmask), else the one at the same index (modulo). `local` empty: one pairing,
// with no source address, to the remote rail [0]. With auto rails, a local rail whose subnet
// holds no remote rail is left out when another one's does.
struct RailPlan {
    size_t local = 0;           // index into the local rails (0 when `local` is empty)
    size_t remote = 0;          // index into the remote rails
    sockaddr_storage source{};  // local address to bind before connecting (family 0: none)
    socklen_t source_len = 0;
    std::string name;  // "10.0.1.2 -> 10.0.1.1:7471", for messages
};
std::vector<RailPlan> plan_rails(const std::vector<std::string> &local, const std::vector<Endpoint> &remote,
                                 bool automatic);

}  // namespace ferry_tcp
