// The mutual challenge-response of every authenticated Ferry connection: the engines' control
// channel (core/control/control_protocol.hpp), tcp.so (plugins/tcp/handshake.hpp) and rdma.so
// (plugins/rdma/control.hpp). Each side sends a fresh nonce and proves it holds the key over
// the other side's nonce:
//
//   proof = HMAC-SHA-256(key, label | role | client nonce | server nonce | context)
//
// label names the protocol (Protocol below), role is "server" or "client", context is what the
// protocol binds besides the nonces (the control channel: the client's segment name; the
// transports: nothing). So neither a captured exchange nor a proof reflected back to its sender
// nor a proof of one protocol replayed in another is accepted, and the key never crosses the
// wire. Without a key both proofs are zeros, and each protocol first checks that both sides
// agree neither has one. This is the only place that computes a proof: the bytes are part of
// three wire formats, pinned by HmacSha256.ProofsOnTheWireAreThoseOfEarlierVersions.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "hmac_sha256.hpp"

namespace ferry_auth {

inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kProofBytes = ferry_crypto::kDigestBytes;
using Nonce = std::array<uint8_t, kNonceBytes>;
using Proof = ferry_crypto::Digest;
using NonceView = std::span<const uint8_t, kNonceBytes>;
using ProofView = std::span<const uint8_t, kProofBytes>;

// One label per protocol, each distinct (auth_proof.cpp): a new protocol adds its own row.
enum class Protocol {
    kControl,  // "ferry control v2": engine to engine (descriptors, notifications)
    kTcp,      // "ferry tcp v2": tcp.so connections
    kRdma,     // "ferry rdma v1": rdma.so control connections
};
enum class Role { kServer, kClient };  // whose proof: the one the server sends, or the client's

// Zeros when key is empty.
Proof make_proof(std::string_view key, Protocol protocol, Role role, NonceView client_nonce, NonceView server_nonce,
                 std::string_view context = {});

// Whether `received` is the proof make_proof gives, compared in constant time.
bool proof_matches(std::string_view key, Protocol protocol, Role role, NonceView client_nonce, NonceView server_nonce,
                   ProofView received, std::string_view context = {});

// Views of nonces and proofs inside a received message.
inline NonceView nonce_at(const uint8_t *p) { return NonceView(p, kNonceBytes); }
inline ProofView proof_at(const uint8_t *p) { return ProofView(p, kProofBytes); }

// Fills `out` from the kernel's random source (getrandom); false with errno set when it fails.
bool fill_random(std::span<uint8_t> out);

// The key an engine hands the transports that authenticate their own connections (plugin
// option auth_key): hex of HMAC-SHA-256(secret, "ferry transport key v1"), so a plugin never
// sees the cluster secret and a leaked transport key does not reveal it.
std::string transport_key_hex(std::string_view secret);

// The plugins' side of it: an auth_key option is at least 32 hex digits; false (out untouched)
// otherwise.
bool transport_key_from_hex(std::string_view hex, std::string &out);

}  // namespace ferry_auth
