// The TCP control channel of rdma.so: queue pair handshakes (Connect/Reconnect) and
// registration queries. Framing is wire.hpp's CtrlHeader + body; every call has a deadline.
#pragma once

#include "auth_proof.hpp"
#include "wire.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace ferry_rdma {

// Listening socket on ip:port (port 0: any); *bound the port it got.
int listen_tcp(const std::string &ip, uint16_t port, int *fd, uint16_t *bound, std::string *why);
// Connected socket to ip (4 bytes, network order):port within timeout_ms.
int connect_tcp(const uint8_t ip[4], uint16_t port, int timeout_ms, int *fd, std::string *why);
int send_msg(int fd, const CtrlHeader &h, const std::vector<uint8_t> &body, int timeout_ms, std::string *why);
// -ECONNRESET on EOF, -ETIMEDOUT past the deadline, -EPROTO on a malformed header.
int recv_msg(int fd, CtrlHeader *h, std::vector<uint8_t> *body, int timeout_ms, std::string *why);
std::string ip_string(const uint8_t ip[4], uint16_t port);  // "10.0.0.1:4791"

// Authentication of a control connection, before anything is served. With a cluster key (option
// auth_key, derived by the host from its cluster secret) each end proves it knows the key over the
// other end's fresh nonce:
//   proof = ferry_auth::make_proof(key, kProtocol, role, client nonce, server nonce)
// (base/auth_proof.hpp: HMAC-SHA-256 over "ferry rdma v1" | role | nonces). Without a key the
// proofs are zeros and both ends must agree that neither has one. Hello = client nonce +
// has-key byte; HelloAck = server nonce + server proof; Auth = client proof; AuthAck = status.
inline constexpr auto kProtocol = ferry_auth::Protocol::kRdma;
using ferry_auth::Role;
inline constexpr size_t kNonceSize = ferry_auth::kNonceBytes;
inline constexpr size_t kProofSize = ferry_auth::kProofBytes;

// The client's side, run right after connect_tcp: 0, or -EACCES / a socket error with *why.
int auth_client(int fd, const std::string &key, int timeout_ms, std::string *why);

// The server's side, one message at a time (the server multiplexes connections).
class AuthServer {
public:
    explicit AuthServer(const std::string *key) : key_(key) {}
    bool done() const { return done_; }
    // Handles one message of an unauthenticated connection and fills the reply. Returns 0 to go on
    // (reply and continue), -EACCES to reply and close (*why says why).
    int on_message(const CtrlHeader &h, const std::vector<uint8_t> &body, CtrlHeader *reply, std::vector<uint8_t> *out,
                   std::string *why);

private:
    const std::string *key_;
    bool hello_ = false, done_ = false;
    uint8_t client_nonce_[kNonceSize] = {}, server_nonce_[kNonceSize] = {};
};

}  // namespace ferry_rdma
