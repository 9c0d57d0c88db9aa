// rdma.so's control channel over real loopback sockets: messages and their failures, and the
// authentication with the cluster key (base/auth_proof.hpp).
#include "control.hpp"
#include "rdma_test_util.hpp"

#include <ferry/plugin.h>
#include <gtest/gtest.h>

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <numeric>
#include <thread>

namespace ferry_rdma {
namespace {

using namespace ferry_rdma::test;

TEST(RdmaControl, MessagesRoundTripAndFailuresAreNamed) {
    int lfd = -1;
    uint16_t port = 0;
    std::string why;
    ASSERT_EQ(listen_tcp("127.0.0.1", 0, &lfd, &port, &why), 0) << why;
    uint8_t ip[4] = {127, 0, 0, 1};
    int cfd = -1;
    ASSERT_EQ(connect_tcp(ip, port, 2000, &cfd, &why), 0) << why;
    int sfd = -1;
    for (int i = 0; i < 200 && sfd < 0; ++i) {
        sfd = accept(lfd, nullptr, nullptr);
        if (sfd < 0) usleep(10000);
    }
    ASSERT_GE(sfd, 0);
    CtrlHeader h;
    h.type = static_cast<uint16_t>(CtrlType::Connect);
    h.req_id = 5;
    std::vector<uint8_t> body(100000);
    std::iota(body.begin(), body.end(), 0);
    ASSERT_EQ(send_msg(cfd, h, body, 2000, &why), 0) << why;
    CtrlHeader got;
    std::vector<uint8_t> rbody;
    ASSERT_EQ(recv_msg(sfd, &got, &rbody, 2000, &why), 0) << why;
    EXPECT_EQ(got.req_id, 5u);
    EXPECT_EQ(rbody, body);
    // Nothing sent: the deadline ends the wait.
    EXPECT_EQ(recv_msg(sfd, &got, &rbody, 50, &why), -ETIMEDOUT);
    // Garbage instead of a header.
    std::vector<uint8_t> junk(kCtrlHeaderSize, 0x55);
    ASSERT_EQ(::send(cfd, junk.data(), junk.size(), 0), static_cast<ssize_t>(junk.size()));
    EXPECT_EQ(recv_msg(sfd, &got, &rbody, 2000, &why), -EPROTO);
    EXPECT_TRUE(contains(why, "magic")) << why;
    close(cfd);
    EXPECT_EQ(recv_msg(sfd, &got, &rbody, 2000, &why), -ECONNRESET);
    close(sfd);
    close(lfd);
    // A closed port: refused, naming the address.
    EXPECT_EQ(connect_tcp(ip, port, 2000, &cfd, &why), -ECONNREFUSED);
    EXPECT_TRUE(contains(why, "127.0.0.1:" + std::to_string(port))) << why;
}

// Runs the server side of the authentication on sfd until it finishes or refuses.
int serve_auth(int sfd, const std::string &key, std::string *why) {
    AuthServer auth(&key);
    while (!auth.done()) {
        CtrlHeader h, reply;
        std::vector<uint8_t> body, out;
        if (int rc = recv_msg(sfd, &h, &body, 2000, why); rc != 0) return rc;
        int rc = auth.on_message(h, body, &reply, &out, why);
        std::string ignored;
        send_msg(sfd, reply, out, 2000, &ignored);
        if (rc != 0) return rc;
    }
    return 0;
}

struct AuthResult {
    int client = 0, server = 0;
    std::string client_why, server_why;
};

AuthResult authenticate(const std::string &client_key, const std::string &server_key, bool skip_hello = false) {
    int sv[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    AuthResult r;
    std::thread server([&] { r.server = serve_auth(sv[1], server_key, &r.server_why); });
    if (skip_hello) {
        CtrlHeader h, got;
        h.type = static_cast<uint16_t>(CtrlType::Query);
        std::vector<uint8_t> body(16), reply;
        send_msg(sv[0], h, body, 2000, &r.client_why);
        r.client = recv_msg(sv[0], &got, &reply, 2000, &r.client_why);
        if (r.client == 0) r.client = got.status;
        r.client_why = std::string(reply.begin(), reply.end());
    } else {
        r.client = auth_client(sv[0], client_key, 2000, &r.client_why);
    }
    close(sv[0]);
    server.join();
    close(sv[1]);
    return r;
}

TEST(RdmaControl, ConnectionsAuthenticateWithTheClusterKey) {
    const std::string key(32, 'k'), other(32, 'o');
    auto ok = authenticate(key, key);
    EXPECT_EQ(ok.client, 0) << ok.client_why;
    EXPECT_EQ(ok.server, 0) << ok.server_why;
    auto none = authenticate("", "");
    EXPECT_EQ(none.client, 0) << none.client_why;
    EXPECT_EQ(none.server, 0) << none.server_why;
    // Different keys: the client finds the server's proof wrong and goes away.
    auto wrong = authenticate(key, other);
    EXPECT_EQ(wrong.client, -EACCES);
    EXPECT_TRUE(contains(wrong.client_why, "does not know this instance's cluster key")) << wrong.client_why;
    EXPECT_NE(wrong.server, 0) << "the server must not accept the connection";
    // One side without a key: refused at hello, both told why.
    auto missing = authenticate("", key);
    EXPECT_EQ(missing.client, -EACCES);
    EXPECT_TRUE(contains(missing.client_why, "has no cluster key but this rdma.so instance has a cluster key"))
        << missing.client_why;
    EXPECT_EQ(missing.server, -EACCES);
    // A request before authenticating is refused.
    auto early = authenticate("", "", true);
    EXPECT_EQ(early.client, -EACCES);
    EXPECT_TRUE(contains(early.client_why, "must authenticate first")) << early.client_why;
    EXPECT_EQ(early.server, -EACCES);
    // The proofs depend on key, role and both nonces.
    uint8_t cn[kNonceSize] = {1}, sn[kNonceSize] = {2};
    auto a = ferry_auth::make_proof(key, kProtocol, Role::kServer, cn, sn);
    auto b = ferry_auth::make_proof(key, kProtocol, Role::kClient, cn, sn);
    EXPECT_NE(memcmp(a.data(), b.data(), kProofSize), 0);
    b = ferry_auth::make_proof(other, kProtocol, Role::kServer, cn, sn);
    EXPECT_NE(memcmp(a.data(), b.data(), kProofSize), 0);
    sn[0] = 3;
    b = ferry_auth::make_proof(key, kProtocol, Role::kServer, cn, sn);
    EXPECT_NE(memcmp(a.data(), b.data(), kProofSize), 0);
}

}  // namespace
}  // namespace ferry_rdma
