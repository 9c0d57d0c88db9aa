// core/control/: the engine-to-engine control channel: its wire format (this file), the server
// every engine runs, the client that talks to a peer's, and the cluster secret they authenticate
// with (auth.hpp). It carries descriptors and notifications as bytes: it knows no engine.
// May include: util/
//
// Wire format of the engine-to-engine control channel (control_server / control_client):
// descriptor requests (P2PHANDSHAKE metadata) and notifications, after a mutual
// challenge-response when the cluster has a secret.
//
// Frame:   magic u32 | version u16 | code u16 | length u32 | payload (length bytes)
//          code = request type (client -> server) or errno status, 0 = ok (server -> client);
//          a non-zero status carries a message naming the problem as its payload.
//
// Connection (persistent; any number of requests after step 3):
//   1. client HELLO   payload = client nonce[32] | flags u32 | client segment name (str)
//   2. server reply   payload = server nonce[32] | flags u32 | server proof[32]
//   3. client AUTH    payload = client proof[32]
//      server reply   status 0, or EACCES and close
// flags: kFlagSecret when that side has a cluster secret. Without one both proofs are zeros.
// proof = ferry_auth::make_proof(secret, Protocol::kControl, role, client nonce, server nonce,
//                                client name) (base/auth_proof.hpp: HMAC-SHA-256 keyed with the
// cluster secret over "ferry control v2" | role | nonces | client name): each side proves
// knowledge of the secret over the other side's fresh nonce, so neither a captured exchange nor
// a proof reflected back to its sender is accepted, and the secret never crosses the wire.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "auth_proof.hpp"
#include "ferry/engine.hpp"
#include "util/byte_codec.hpp"

namespace ferry::control {

inline constexpr uint32_t kMagic = 0x46524853;  // "FRHS"
inline constexpr uint16_t kVersion = 2;         // 1: descriptor requests only, no HELLO
inline constexpr size_t kHeaderBytes = 12;
inline constexpr size_t kNonceBytes = ferry_auth::kNonceBytes;
inline constexpr uint32_t kFlagSecret = 1;

enum Type : uint16_t {
    kGetDescriptor = 1,  // payload: segment name; reply: encoded descriptor
    kHello = 2,
    kAuth = 3,
    kNotify = 4,  // payload: message bytes; reply: empty, once queued
};

// Largest request payload a server reads (a notification plus slack); larger ones close the
// connection after an EMSGSIZE reply.
inline constexpr size_t kMaxRequestBytes = kMaxNotificationBytes + 4096;
inline constexpr size_t kMaxNameBytes = 1024;

using Nonce = ferry_auth::Nonce;
using Proof = ferry_auth::Proof;
using ferry_auth::Role;
inline constexpr auto kProtocol = ferry_auth::Protocol::kControl;  // the proofs' label

struct Header {
    uint32_t magic = 0;
    uint16_t version = 0;
    uint16_t code = 0;
    uint32_t length = 0;
};

inline std::vector<uint8_t> frame(uint16_t code, std::span<const uint8_t> payload) {
    ByteWriter w;
    w.u32(kMagic);
    w.u16(kVersion);
    w.u16(code);
    w.u32(static_cast<uint32_t>(payload.size()));
    auto out = w.take();
    out.insert(out.end(), payload.begin(), payload.end());
    return out;
}

inline std::vector<uint8_t> frame(uint16_t code, std::string_view text) {
    return frame(code, {reinterpret_cast<const uint8_t *>(text.data()), text.size()});
}

inline Header parse_header(std::span<const uint8_t> bytes) {
    ByteReader r(bytes.first(kHeaderBytes));
    Header h;
    r.u32(h.magic);
    r.u16(h.version);
    r.u16(h.code);
    r.u32(h.length);
    return h;
}

}  // namespace ferry::control
