// What shm.so instances exchange. Both ends run on one host (and, in practice, one build), so
// records are fixed-size native structs; magic and version catch anything else.
//
// Endpoint bytes (export_endpoint): EndpointBytes. The instance listens on the abstract unix
// socket "\0ferry-shm.<pid>.<token hex>", so only that process can own the name.
//
// Connection (initiator -> serving side, SOCK_STREAM):
//   initiator: Hello                  serving side: HelloAck (after probing the initiator)
//   initiator: Request, Request, ...  serving side: Done + message bytes, ...
// The SERVING side does every copy, with process_vm_readv/writev against the initiator's pid as
// the kernel reports it for the socket (SO_PEERCRED, pinned by a pidfd: peer.hpp), after checking
// the request against its own registered regions.
//
// Revocation gate: every Request names a byte in a page of the initiator (gate_addr). The
// serving side's copy syscall lists that byte first, so once the initiator has made the page
// PROT_NONE (an op timed out, client.cpp) every later copy for the op fails at the gate before a
// byte of the buffer moves: the initiator can stop the serving side's copies by itself.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace ferry_shm {

inline constexpr uint32_t kEndpointMagic = 0x4d485346;  // "FSHM"
inline constexpr uint32_t kHelloMagic = 0x48485346;     // "FSHH"
inline constexpr uint32_t kAckMagic = 0x41485346;       // "FSHA"
inline constexpr uint16_t kWireVersion = 3;

struct EndpointBytes {
    uint32_t magic;
    uint16_t version;
    uint16_t reserved;
    uint32_t pid;
    uint32_t uid;
    uint64_t token;  // random per instance
};
static_assert(sizeof(EndpointBytes) == 24);

struct Hello {
    uint32_t magic;
    uint16_t version;
    uint16_t reserved;
    uint64_t target_token;  // the token of the instance the initiator means to reach
    uint64_t probe_addr;    // 16 bytes in the initiator that hold probe_token twice
    uint64_t probe_token;
    uint32_t pid;  // as the initiator sees itself (the serving side trusts SO_PEERCRED instead)
    uint32_t uid;
};

struct HelloAck {
    uint32_t magic;
    int32_t status;  // 0 or a negative errno
    char message[200];
};

struct Request {
    uint64_t id;
    uint32_t opcode;
    int32_t local_fd;      // the initiator's memfd of the local region, -1: none (memfd.hpp); read
                           // only when both ends set adopt_memfd
    uint64_t remote_addr;  // in the serving process
    uint64_t length;
    uint64_t local_addr;  // in the initiator
    uint64_t local_ino;   // memfd only: its inode,
    uint64_t local_base;  // the address it is mapped at in the initiator,
    uint64_t local_len;   // and its size
    uint64_t gate_addr;   // a byte in the initiator the copy passes first; 0: no gate
};
static_assert(sizeof(Request) == 72);

struct Done {
    uint64_t id;
    int32_t status;
    uint16_t message_len;  // bytes of message that follow (no NUL)
    uint16_t reserved;
};
static_assert(sizeof(Done) == 16);

inline std::string socket_name(uint32_t pid, uint64_t token) {
    char buf[64];
    int n = snprintf(buf, sizeof buf, "%cferry-shm.%u.%016llx", '\0', pid, static_cast<unsigned long long>(token));
    return std::string(buf, static_cast<size_t>(n));
}

}  // namespace ferry_shm
