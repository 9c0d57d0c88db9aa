#include "control.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace ferry_rdma {

namespace {

using Clock = std::chrono::steady_clock;

std::string err_text(int e) {
    char buf[128];
    return strerror_r(e, buf, sizeof buf);
}

int remaining_ms(Clock::time_point deadline) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    return left < 0 ? 0 : static_cast<int>(left);
}

// Waits for `events` on fd until the deadline: 0, -ETIMEDOUT, or -errno.
int wait_fd(int fd, short events, Clock::time_point deadline) {
    for (;;) {
        pollfd p{fd, events, 0};
        int rc = ::poll(&p, 1, remaining_ms(deadline));
        if (rc > 0) return 0;
        if (rc == 0) return -ETIMEDOUT;
        if (errno != EINTR) return -errno;
    }
}

int io_all(int fd, void *buf, size_t len, bool writing, Clock::time_point deadline, std::string *why) {
    auto *p = static_cast<uint8_t *>(buf);
    size_t done = 0;
    while (done < len) {
        ssize_t n = writing ? ::send(fd, p + done, len - done, MSG_NOSIGNAL | MSG_DONTWAIT)
                            : ::recv(fd, p + done, len - done, MSG_DONTWAIT);
        if (n > 0) {
            done += static_cast<size_t>(n);
            continue;
        }
        if (n == 0) {
            *why = "the peer closed the control connection";
            return -ECONNRESET;
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            int e = errno;
            *why = std::string(writing ? "send" : "recv") + " on the control connection: " + err_text(e);
            return -e;
        }
        if (int rc = wait_fd(fd, writing ? POLLOUT : POLLIN, deadline); rc != 0) {
            *why = rc == -ETIMEDOUT ? "no answer on the control connection in time" : "poll: " + err_text(-rc);
            return rc;
        }
    }
    return 0;
}

}  // namespace

std::string ip_string(const uint8_t ip[4], uint16_t port) {
    char buf[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, ip, buf, sizeof buf);
    return std::string(buf) + ":" + std::to_string(port);
}

int listen_tcp(const std::string &ip, uint16_t port, int *out, uint16_t *bound, std::string *why) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    if (inet_pton(AF_INET, ip.c_str(), &a.sin_addr) != 1) {
        *why = "bind_ip '" + ip + "' is not an IPv4 address";
        return -EINVAL;
    }
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        *why = "socket: " + err_text(errno);
        return -errno;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0 || ::listen(fd, 128) != 0) {
        int e = errno;
        ::close(fd);
        *why = "control server on " + ip + ":" + std::to_string(port) + ": " + err_text(e);
        return -e;
    }
    socklen_t len = sizeof a;
    getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len);
    *bound = ntohs(a.sin_port);
    *out = fd;
    return 0;
}

int connect_tcp(const uint8_t ip[4], uint16_t port, int timeout_ms, int *out, std::string *why) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    memcpy(&a.sin_addr, ip, 4);
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        *why = "socket: " + err_text(errno);
        return -errno;
    }
    auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    int rc = ::connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a);
    if (rc != 0 && errno == EINPROGRESS) {
        rc = wait_fd(fd, POLLOUT, deadline);
        if (rc == 0) {
            int soerr = 0;
            socklen_t l = sizeof soerr;
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &l);
            rc = soerr == 0 ? 0 : -soerr;
        }
    } else if (rc != 0) {
        rc = -errno;
    }
    if (rc != 0) {
        ::close(fd);
        *why = "cannot reach the rdma.so control server at " + ip_string(ip, port) + ": " +
               (rc == -ETIMEDOUT ? "no answer within " + std::to_string(timeout_ms) + " ms" : err_text(-rc)) +
               (rc == -ECONNREFUSED ? " (the peer exited or its transport was destroyed)" : "");
        return rc;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    *out = fd;
    return 0;
}

int send_msg(int fd, const CtrlHeader &h, const std::vector<uint8_t> &body, int timeout_ms, std::string *why) {
    uint8_t head[kCtrlHeaderSize];
    CtrlHeader copy = h;
    copy.body_len = static_cast<uint32_t>(body.size());
    encode_header(copy, head);
    auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    if (int rc = io_all(fd, head, sizeof head, true, deadline, why); rc != 0) return rc;
    if (body.empty()) return 0;
    return io_all(fd, const_cast<uint8_t *>(body.data()), body.size(), true, deadline, why);
}

int recv_msg(int fd, CtrlHeader *h, std::vector<uint8_t> *body, int timeout_ms, std::string *why) {
    uint8_t head[kCtrlHeaderSize];
    auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    if (int rc = io_all(fd, head, sizeof head, false, deadline, why); rc != 0) return rc;
    CtrlHeader got;
    if (!decode_header(head, &got, why)) return -EPROTO;
    std::vector<uint8_t> b(got.body_len);
    if (!b.empty())
        if (int rc = io_all(fd, b.data(), b.size(), false, deadline, why); rc != 0) return rc;
    *h = got;
    *body = std::move(b);
    return 0;
}

namespace {

const char *key_words(bool has) { return has ? "has a cluster key" : "has no cluster key"; }

}  // namespace

int auth_client(int fd, const std::string &key, int timeout_ms, std::string *why) {
    ferry_auth::Nonce cn;
    if (!ferry_auth::fill_random(cn)) {
        *why = "getrandom: " + err_text(errno);
        return -EIO;
    }
    std::vector<uint8_t> hello(cn.begin(), cn.end());
    hello.push_back(key.empty() ? 0 : 1);
    CtrlHeader h;
    h.type = static_cast<uint16_t>(CtrlType::Hello);
    if (int rc = send_msg(fd, h, hello, timeout_ms, why); rc != 0) return rc;
    CtrlHeader got;
    std::vector<uint8_t> body;
    if (int rc = recv_msg(fd, &got, &body, timeout_ms, why); rc != 0) return rc;
    if (got.type != static_cast<uint16_t>(CtrlType::HelloAck)) {
        *why = "the peer did not answer the authentication hello";
        return -EPROTO;
    }
    if (got.status != 0) {
        *why = "the peer refused the connection: " + std::string(body.begin(), body.end());
        return got.status < 0 ? got.status : -EACCES;
    }
    if (body.size() != kNonceSize + kProofSize) {
        *why = "malformed authentication reply";
        return -EPROTO;
    }
    auto sn = ferry_auth::nonce_at(body.data());
    if (!ferry_auth::proof_matches(key, kProtocol, Role::kServer, cn, sn,
                                   ferry_auth::proof_at(body.data() + kNonceSize))) {
        *why = "the peer does not know this instance's cluster key (its proof is wrong): refusing it";
        return -EACCES;
    }
    auto mine = ferry_auth::make_proof(key, kProtocol, Role::kClient, cn, sn);
    std::vector<uint8_t> proof(mine.begin(), mine.end());
    h.type = static_cast<uint16_t>(CtrlType::Auth);
    if (int rc = send_msg(fd, h, proof, timeout_ms, why); rc != 0) return rc;
    if (int rc = recv_msg(fd, &got, &body, timeout_ms, why); rc != 0) return rc;
    if (got.type != static_cast<uint16_t>(CtrlType::AuthAck) || got.status != 0) {
        *why = "the peer refused the connection: " + std::string(body.begin(), body.end());
        return got.status < 0 ? got.status : -EACCES;
    }
    return 0;
}

int AuthServer::on_message(const CtrlHeader &h, const std::vector<uint8_t> &body, CtrlHeader *reply,
                           std::vector<uint8_t> *out, std::string *why) {
    reply->req_id = h.req_id;
    reply->status = 0;
    out->clear();
    auto refuse = [&](const std::string &text) {
        *why = text;
        reply->status = -EACCES;
        out->assign(text.begin(), text.end());
        return -EACCES;
    };
    if (h.type == static_cast<uint16_t>(CtrlType::Hello) && !hello_) {
        reply->type = static_cast<uint16_t>(CtrlType::HelloAck);
        if (body.size() != kNonceSize + 1) return refuse("malformed authentication hello");
        bool peer_has = body[kNonceSize] != 0, have = !key_->empty();
        if (peer_has != have)
            return refuse(std::string("the initiator ") + key_words(peer_has) + " but this rdma.so instance " +
                          key_words(have) + ": give both engines the same auth_secret");
        memcpy(client_nonce_, body.data(), kNonceSize);
        if (!ferry_auth::fill_random(server_nonce_)) return refuse("getrandom failed: " + err_text(errno));
        auto proof = ferry_auth::make_proof(*key_, kProtocol, Role::kServer, client_nonce_, server_nonce_);
        out->assign(server_nonce_, server_nonce_ + kNonceSize);
        out->insert(out->end(), proof.begin(), proof.end());
        hello_ = true;
        return 0;
    }
    if (h.type == static_cast<uint16_t>(CtrlType::Auth) && hello_) {
        reply->type = static_cast<uint16_t>(CtrlType::AuthAck);
        if (body.size() != kProofSize || !ferry_auth::proof_matches(*key_, kProtocol, Role::kClient, client_nonce_,
                                                                    server_nonce_, ferry_auth::proof_at(body.data())))
            return refuse("wrong cluster key: the initiator's proof does not match");
        done_ = true;
        return 0;
    }
    reply->type = static_cast<uint16_t>(h.type + 1 <= 10 ? h.type + 1 : h.type);
    return refuse("the control connection must authenticate first (hello, then auth)");
}

}  // namespace ferry_rdma
