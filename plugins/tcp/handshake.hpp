// Connection authentication of the tcp transport (wire.hpp, HELLO .. AUTH_ACK). With a cluster
// key (option auth_key, derived by the host from the cluster secret) each end proves it knows
// the key over the other end's fresh nonce, before the server serves a single request:
//   proof = HMAC-SHA-256(key, "ferry tcp v2" | role | client nonce | server nonce)
// with role "server" or "client". Without a key the proofs are zeros and both ends must agree
// that neither has one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ferry_tcp {

inline constexpr size_t kNonceSize = 32;
inline constexpr size_t kProofSize = 32;
inline constexpr uint32_t kHelloData = kNonceSize;                  // HELLO: client nonce
inline constexpr uint32_t kHelloAckData = kNonceSize + kProofSize;  // HELLO_ACK: server nonce, proof
inline constexpr uint32_t kAuthData = kProofSize;                   // AUTH: client proof

// Fresh random bytes from the kernel; false (errno set) when getrandom fails.
bool random_bytes(uint8_t *out, size_t n);

void make_proof(const std::string &key, const char *role, const uint8_t *client_nonce, const uint8_t *server_nonce,
                uint8_t out[kProofSize]);
// Constant-time comparison against the expected proof.
bool proof_matches(const std::string &key, const char *role, const uint8_t *client_nonce, const uint8_t *server_nonce,
                   const uint8_t *proof);

}  // namespace ferry_tcp
