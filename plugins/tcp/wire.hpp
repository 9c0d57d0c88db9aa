// Wire format of the tcp transport: a fixed 40-byte little-endian header, optionally followed
// by a payload (WRITE_REQ, READ_RESP) or an error message (ERROR). Also the endpoint bytes.
//
//   off size field
//     0    4 magic    "FRRY" (0x59525246), stable across versions
//     4    2 version  kWireVersion; magic+version+type never move, so any version can read a
//     6    1 type       peer's rejection
//     7    1 flags    0, or kFlagNeedsDone on a READ_RESP
//     8    4 status   0 or a negative errno (ERROR)
//    12    4 msg_len  bytes following an ERROR header (its message, < FERRY_MESSAGE_MAX) or a
//                     handshake header (HELLO, HELLO_ACK, AUTH: handshake.hpp)
//    16    8 id       request id chosen by the client, echoed in the response
//    24    8 addr     remote address (WRITE_REQ, READ_REQ)
//    32    8 length   payload bytes (WRITE_REQ, READ_REQ, READ_RESP), 1..kMaxPayload
//
// A connection is opened by the client with HELLO (client nonce; flags kFlagAuth when it has a
// cluster key), answered by HELLO_ACK (server nonce and proof; kFlagAuth likewise), then AUTH
// (client proof) answered by AUTH_ACK; the server answers any step with ERROR and a close
// instead when the keys differ or only one side has one (handshake.hpp). Only then does the
// client send WRITE_REQ / READ_REQ; the server answers each request, in request order, with
// WRITE_ACK / READ_RESP / ERROR.
// A READ_RESP flagged kFlagNeedsDone was sent by reference to the server's memory (zero-copy
// splice): the server keeps the region busy (deregister_mem waits) until the client reports,
// with READ_DONE (id = last such READ_RESP, length = how many, in order), that it consumed
// them. The client sends READ_DONE between requests, never inside one.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace ferry_tcp {

inline constexpr uint32_t kWireMagic = 0x59525246u;  // bytes 'F' 'R' 'R' 'Y'
inline constexpr uint16_t kWireVersion = 2;          // 2: HELLO carries the authentication exchange
inline constexpr size_t kHeaderSize = 40;
inline constexpr uint64_t kMaxPayload = 64ull << 20;  // largest slice on the wire
inline constexpr uint32_t kMaxErrorMsg = 255;         // fits a ferry_completion_t message

enum MsgType : uint8_t {
    kHello = 1,
    kHelloAck = 2,
    kWriteReq = 3,
    kWriteAck = 4,
    kReadReq = 5,
    kReadResp = 6,
    kError = 7,
    kReadDone = 8,
    kAuth = 9,
    kAuthAck = 10,
};

inline constexpr uint8_t kFlagNeedsDone = 0x1;
inline constexpr uint8_t kFlagAuth = 0x2;  // HELLO / HELLO_ACK: the sender has a cluster key

struct Header {
    uint32_t magic = kWireMagic;
    uint16_t version = kWireVersion;
    uint8_t type = 0;
    uint8_t flags = 0;
    int32_t status = 0;
    uint32_t msg_len = 0;
    uint64_t id = 0;
    uint64_t addr = 0;
    uint64_t length = 0;
};

void encode_header(const Header &h, uint8_t out[kHeaderSize]);
Header decode_header(const uint8_t in[kHeaderSize]);
const char *msg_type_name(uint8_t type);

// Checks a request header received by a server (after HELLO). Returns false with a reason
// when it is malformed (the connection must then be closed).
bool check_request(const Header &h, std::string *why);

// Endpoint bytes: "FRTE" magic, version, address family, port, 16 address bytes.
inline constexpr size_t kEndpointSize = 28;

struct Endpoint {
    sockaddr_storage addr{};
    socklen_t addr_len = 0;
    std::string name;  // "127.0.0.1:1234" / "[::1]:1234", for messages
};

void encode_endpoint(const sockaddr_storage &addr, uint8_t out[kEndpointSize]);
// Returns false with a reason when the bytes are not a tcp endpoint.
bool decode_endpoint(const void *buf, size_t len, Endpoint *ep, std::string *why);
std::string sockaddr_name(const sockaddr_storage &addr);

}  // namespace ferry_tcp
