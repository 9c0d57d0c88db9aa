// What the shm.so tests of this binary share: the plugin under test, a fixture that makes
// instances of it, and a raw client that connects to an instance's socket and speaks the
// handshake itself, to send what a real initiator would not.
#pragma once

#include "../../plugins/shm/wire.hpp"
#include "harness.hpp"

#include <gtest/gtest.h>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace ferry_test {

inline std::string shm_path() {
    const char *e = std::getenv("FERRY_TEST_SHM_PLUGIN");
    return e != nullptr && *e ? e : FERRY_TEST_SHM_PLUGIN;
}

class ShmPluginTest : public ::testing::Test {
protected:
    void SetUp() override {
        plugin = std::make_unique<Plugin>(shm_path());
        ASSERT_TRUE(plugin->ok()) << plugin->error();
    }
    std::unique_ptr<Instance> make(const Options &o = {}) {
        auto i = std::make_unique<Instance>(*plugin, o);
        EXPECT_EQ(i->create_rc(), 0) << i->last_error();
        return i->create_rc() == 0 ? std::move(i) : nullptr;
    }
    std::unique_ptr<Plugin> plugin;
};

// A raw connection to the instance whose endpoint is `endpoint`, and the Hello this process
// would send on it with `probe` (two equal words the target reads back with cross-memory
// attach). fd is -1, with a test failure recorded, when it cannot connect.
struct RawShmClient {
    int fd = -1;
    ferry_shm::Hello hello{};
};
inline RawShmClient raw_shm_client(const std::vector<uint8_t> &endpoint, const uint64_t *probe) {
    using namespace ferry_shm;
    RawShmClient c;
    EndpointBytes ep;
    EXPECT_EQ(endpoint.size(), sizeof ep);
    if (endpoint.size() != sizeof ep) return c;
    memcpy(&ep, endpoint.data(), sizeof ep);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    EXPECT_GE(fd, 0);
    if (fd < 0) return c;
    std::string name = socket_name(ep.pid, ep.token);
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, name.data(), name.size());
    int rc = connect(fd, reinterpret_cast<sockaddr *>(&sa),
                     static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size()));
    EXPECT_EQ(rc, 0) << strerror(errno);
    if (rc != 0) {
        close(fd);
        return c;
    }
    c.fd = fd;
    c.hello = Hello{kHelloMagic,
                    kWireVersion,
                    0,
                    ep.token,
                    reinterpret_cast<uint64_t>(probe),
                    probe[0],
                    static_cast<uint32_t>(getpid()),
                    static_cast<uint32_t>(getuid())};
    return c;
}

}  // namespace ferry_test
