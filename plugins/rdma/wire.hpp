// Bytes rdma.so instances exchange, encoded little-endian field by field (no struct images, so
// both ends agree whatever their compilers do). Pure code: no verbs calls, unit-tested in CI.
//
// Endpoint (export_endpoint, in the segment descriptor): the control server's IPv4 address and
// port, a random per-instance token, and per NIC its name and address (LID, GID, port, link
// layer, active MTU). Queue pair numbers are NOT in it: RC queue pairs exist per (local NIC,
// remote NIC) pair and per connection, so they are exchanged in the Connect handshake.
//
// Memory descriptor (export_mem): per registration chunk (regions are split at max_mr_size)
// its address range, the FERRY_ACCESS_* rights and one rkey per NIC of the owner, plus the
// owner's NICs nearest that memory (a bit mask), so initiators target the right NIC.
//
// Control messages (TCP, header + body):
//   Connect      initiator -> target: initiator token, its NICs, and per NIC pair the
//                initiator's qpn/psn. The target creates its queue pairs, moves them to RTS
//                and answers ConnectAck with its own qpn/psn per pair (same order).
//   Reconnect    same bodies for the pairs to re-create after a queue pair error.
//   Query        {addr, len}: the target answers QueryReply with the memory descriptor of the
//                registered region holding the range (import_mem without export_mem bytes).
//   Hello/HelloAck/Auth/AuthAck  the mutual challenge-response every control connection starts
//                with (control.hpp), before any other request is served.
//   A reply with status < 0 carries the target's error message as its body.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace ferry_rdma {

inline constexpr uint32_t kEndpointMagic = 0x45445246;  // "FRDE"
inline constexpr uint32_t kMemMagic = 0x4d445246;       // "FRDM"
inline constexpr uint32_t kCtrlMagic = 0x43445246;      // "FRDC"
inline constexpr uint16_t kWireVersion = 1;
inline constexpr size_t kMaxNics = 32;            // per instance (rkeys per chunk, masks)
inline constexpr size_t kMaxCtrlBody = 1u << 20;  // a control message body, at most
inline constexpr size_t kCtrlHeaderSize = 24;

enum class LinkLayer : uint8_t { InfiniBand = 1, Ethernet = 2 };

struct NicAddress {
    std::string name;  // ibv device name, for messages
    uint16_t lid = 0;  // InfiniBand only
    uint8_t port = 1;
    LinkLayer link = LinkLayer::InfiniBand;
    uint8_t mtu = 0;  // enum ibv_mtu value of the port's active MTU (1 = 256 ... 5 = 4096)
    uint8_t gid_index = 0;
    uint8_t gid[16] = {};
    bool has_gid() const;  // not all zero
};

struct Endpoint {
    uint64_t token = 0;
    uint8_t ip[4] = {};  // control server, network byte order
    uint16_t port = 0;
    std::vector<NicAddress> nics;
};

struct RemoteChunk {
    uint64_t addr = 0, len = 0;
    uint32_t access = 0;
    std::vector<uint32_t> rkeys;  // one per NIC of the owner, in its endpoint order
};

struct MemDescriptor {
    uint64_t nearest_nics = 0;        // bit i: the owner's NIC i is nearest this memory
    std::vector<RemoteChunk> chunks;  // ascending, not overlapping (a query's reply may have gaps, or none)
};

// One RC queue pair's handshake data; the rest of the address is in NicAddress.
struct PairInfo {
    uint16_t local_nic = 0;   // index in the sender's NIC list
    uint16_t remote_nic = 0;  // index in the receiver's NIC list
    uint32_t qpn = 0;         // 24 bits
    uint32_t psn = 0;         // 24 bits
};

struct ConnectBody {
    uint64_t token = 0;            // the initiator's
    std::vector<NicAddress> nics;  // the initiator's
    std::vector<PairInfo> pairs;
};

struct ConnectAckBody {
    std::vector<PairInfo> pairs;  // from the target's side: local_nic is the target's
};

enum class CtrlType : uint16_t {
    Connect = 1,
    ConnectAck = 2,
    Query = 3,
    QueryReply = 4,
    Reconnect = 5,
    ReconnectAck = 6,
    Hello = 7,
    HelloAck = 8,
    Auth = 9,
    AuthAck = 10
};

struct CtrlHeader {
    uint16_t type = 0;
    uint64_t req_id = 0;
    int32_t status = 0;
    uint32_t body_len = 0;
};

std::vector<uint8_t> encode_endpoint(const Endpoint &ep);
bool decode_endpoint(const void *bytes, size_t len, Endpoint *out, std::string *why);

std::vector<uint8_t> encode_mem(const MemDescriptor &m, size_t nic_count);
// nic_count: NICs in the owner's endpoint; every chunk must carry that many rkeys.
bool decode_mem(const void *bytes, size_t len, size_t nic_count, MemDescriptor *out, std::string *why);

std::vector<uint8_t> encode_connect(const ConnectBody &b);
bool decode_connect(const void *bytes, size_t len, ConnectBody *out, std::string *why);
std::vector<uint8_t> encode_connect_ack(const ConnectAckBody &b);
bool decode_connect_ack(const void *bytes, size_t len, ConnectAckBody *out, std::string *why);

// Query body: addr u64 | length u64, the range whose registrations the initiator asks about.
std::vector<uint8_t> encode_query(uint64_t addr, uint64_t length);
// False unless the body is exactly one query.
bool decode_query(const std::vector<uint8_t> &body, uint64_t *addr, uint64_t *length);

void encode_header(const CtrlHeader &h, uint8_t out[kCtrlHeaderSize]);
bool decode_header(const uint8_t in[kCtrlHeaderSize], CtrlHeader *out, std::string *why);

// "fe80::...", for messages.
std::string gid_string(const uint8_t gid[16]);

}  // namespace ferry_rdma
