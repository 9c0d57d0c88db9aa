// Connection authentication of the tcp transport (wire.hpp, HELLO .. AUTH_ACK). With a cluster
// key (option auth_key, derived by the host from the cluster secret) each end proves it knows
// the key over the other end's fresh nonce, before the server serves a single request:
//   proof = ferry_auth::make_proof(key, kProtocol, role, client nonce, server nonce)
// (base/auth_proof.hpp: HMAC-SHA-256 over "ferry tcp v2" | role | nonces). Without a key the
// proofs are zeros and both ends must agree that neither has one.
#pragma once

#include <cstddef>
#include <cstdint>

#include "auth_proof.hpp"

namespace ferry_tcp {

inline constexpr auto kProtocol = ferry_auth::Protocol::kTcp;
using ferry_auth::Role;
inline constexpr size_t kNonceSize = ferry_auth::kNonceBytes;
inline constexpr size_t kProofSize = ferry_auth::kProofBytes;
inline constexpr uint32_t kHelloData = kNonceSize;                  // HELLO: client nonce
inline constexpr uint32_t kHelloAckData = kNonceSize + kProofSize;  // HELLO_ACK: server nonce, proof
inline constexpr uint32_t kAuthData = kProofSize;                   // AUTH: client proof

}  // namespace ferry_tcp
