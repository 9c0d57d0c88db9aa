// shm.so as an initiator facing a hostile serving side on its map channel (map_wire.hpp): the
// plugin is loaded with dlopen and connected to a fake instance in this process that answers
// the map request with a bad descriptor (not a memfd, unsealed, too small, read-only where the
// reply grants write, two descriptors, a socket, a descriptor with a refusal). Each is refused
// (the import falls back to cross-memory attach), nothing is mapped and no descriptor is left
// open; a well-formed memfd (the control) is mapped, and unmapped again on release.
#include <gtest/gtest.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "ferry/plugin.h"
#include "map_wire.hpp"
#include "wire.hpp"

using namespace ferry_shm;

namespace {

constexpr uint64_t kPage = 4096;
constexpr uint64_t kAddr = 0x7f0000000000ull, kLen = 1 << 20;

int open_fds() {
    int n = 0;
    for (auto &e : std::filesystem::directory_iterator("/proc/self/fd")) n += e.path().filename() != ".";
    return n;
}

int mappings_named(const char *name) {
    std::ifstream in("/proc/self/maps");
    int n = 0;
    for (std::string line; std::getline(in, line);) n += line.find(name) != std::string::npos;
    return n;
}

// A memfd as alloc_shared makes one: the region, then the plugin's page holding `live`.
int good_memfd(uint64_t live, int seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL, uint64_t size = kLen + kPage) {
    int fd = memfd_create("hostile", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(size)), 0);
    EXPECT_EQ(posix_fallocate(fd, 0, static_cast<off_t>(size)), 0);
    if (size >= kLen + kPage) EXPECT_EQ(pwrite(fd, &live, sizeof live, kLen), 8);
    if (seals) EXPECT_EQ(fcntl(fd, F_ADD_SEALS, seals), 0);
    return fd;
}

MapReply reply_for(int fd) {
    MapReply r{};
    r.magic = kMapReplyMagic;
    r.base = kAddr;
    r.length = kLen;
    r.fd_offset = 0;
    r.live_offset = kLen;
    r.live_value = 0x77;
    struct stat st {};
    if (fd >= 0 && fstat(fd, &st) == 0) r.ino = st.st_ino;
    r.access = FERRY_ACCESS_REMOTE_READ | FERRY_ACCESS_REMOTE_WRITE;
    return r;
}

void send_with_fds(int sock, const MapReply &r, const std::vector<int> &fds) {
    iovec iov{const_cast<MapReply *>(&r), sizeof r};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)] = {};
    if (!fds.empty()) {
        mh.msg_control = control;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
        cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
        memcpy(CMSG_DATA(cm), fds.data(), sizeof(int) * fds.size());
    }
    EXPECT_EQ(sendmsg(sock, &mh, MSG_NOSIGNAL), static_cast<ssize_t>(sizeof r));
}

bool read_exact(int fd, void *buf, size_t n) {
    auto *p = static_cast<char *>(buf);
    while (n > 0) {
        ssize_t k = read(fd, p, n);
        if (k <= 0) return false;
        p += k;
        n -= static_cast<size_t>(k);
    }
    return true;
}

// A fake shm.so instance: accepts every handshake, answers map requests with `answer`.
class FakeInstance {
public:
    FakeInstance() {
        (void)!getrandom(&token, sizeof token, 0);
        token |= 1;
        listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        std::string name = socket_name(static_cast<uint32_t>(getpid()), token);
        sockaddr_un sa{};
        sa.sun_family = AF_UNIX;
        memcpy(sa.sun_path, name.data(), name.size());
        EXPECT_EQ(bind(listen_fd, reinterpret_cast<sockaddr *>(&sa),
                       static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size())),
                  0);
        EXPECT_EQ(listen(listen_fd, 8), 0);
        thread = std::thread([this] { serve(); });
    }
    ~FakeInstance() {
        shutdown(listen_fd, SHUT_RDWR);
        thread.join();
        close(listen_fd);
        for (int fd : data_conns) close(fd);
    }
    void wait_answered(int n) {
        std::unique_lock lock(mu);
        EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return answered >= n; }));
    }
    uint64_t token = 0;
    std::function<void(int sock)> answer;
    int answered = 0;

private:
    void serve() {
        for (;;) {
            int c = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
            if (c < 0) return;
            Hello h{};
            if (!read_exact(c, &h, sizeof h)) {
                close(c);
                continue;
            }
            HelloAck ack{};
            ack.magic = kAckMagic;
            EXPECT_EQ(write(c, &ack, sizeof ack), static_cast<ssize_t>(sizeof ack));
            if (h.magic == kHelloMagic) {
                data_conns.push_back(c);  // the data connection: kept, never answered
                continue;
            }
            MapRequest m{};
            if (read_exact(c, &m, sizeof m)) answer(c);
            char b;
            while (read(c, &b, 1) > 0) {}  // until the initiator closes its end
            close(c);
            std::lock_guard lock(mu);
            ++answered;
            cv.notify_all();
        }
    }
    int listen_fd = -1;
    std::thread thread;
    std::vector<int> data_conns;
    std::mutex mu;
    std::condition_variable cv;
};

void log_line(void *, int, const char *, const char *msg) { fprintf(stderr, "shm: %s\n", msg); }

}  // namespace

TEST(ShmFdPassing, HostileServingSideDescriptorsAreRefusedAndNothingLeaks) {
    void *so = dlopen(FERRY_SHM_PLUGIN, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(so, nullptr) << dlerror();
    auto *api = static_cast<const ferry_plugin_v1_t *>(dlsym(so, "ferry_plugin_v1"));
    ASSERT_NE(api, nullptr);
    ASSERT_GE(api->struct_size, FERRY_PLUGIN_V1_SIZE_UNTIL(register_mem_fd));
    ASSERT_NE(api->register_mem_fd, nullptr) << "shm.so implements ABI 1.3's register_mem_fd";
    ferry_host_api_t host{};
    host.struct_size = sizeof host;
    host.log = log_line;
    host.log_level = FERRY_LOG_INFO;
    ferry_transport_t *t = nullptr;
    ferry_error_t err{};
    ferry_kv_t opt{"connect_timeout_ms", "5000"};
    ASSERT_EQ(api->create(&opt, 1, &host, &t, &err), 0) << err.message;
    {
        FakeInstance fake;
        EndpointBytes ep{
            kEndpointMagic, kWireVersion, 0, static_cast<uint32_t>(getpid()), static_cast<uint32_t>(geteuid()),
            fake.token};
        uint64_t peer = 0;
        ASSERT_EQ(api->connect(t, &ep, sizeof ep, &peer, &err), 0) << err.message;
        SharedDesc desc{kSharedDescMagic, kWireVersion, 0};
        ferry_mem_region_t region{kAddr, kLen, FERRY_MEM_HOST, -1, FERRY_ACCESS_REMOTE_READ | FERRY_ACCESS_REMOTE_WRITE,
                                  0};
        struct Case {
            const char *what;
            std::function<void(int)> answer;
            bool maps;
        };
        auto one = [](int sock, int fd, MapReply r) {
            send_with_fds(sock, r, {fd});
            close(fd);
        };
        std::vector<Case> cases = {
            {"not a memfd (/dev/null)",
             [&](int s) {
                 int fd = open("/dev/null", O_RDWR | O_CLOEXEC);
                 one(s, fd, reply_for(fd));
             },
             false},
            {"an unsealed memfd",
             [&](int s) {
                 int fd = good_memfd(0x77, 0);
                 one(s, fd, reply_for(fd));
             },
             false},
            {"a memfd too small for the region",
             [&](int s) {
                 int fd = good_memfd(0x77, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL, kPage);
                 one(s, fd, reply_for(fd));
             },
             false},
            {"a read-only memfd where the reply grants write",
             [&](int s) {
                 int rw = good_memfd(0x77);
                 int ro = open(("/proc/self/fd/" + std::to_string(rw)).c_str(), O_RDONLY | O_CLOEXEC);
                 auto r = reply_for(rw);
                 close(rw);
                 one(s, ro, r);
             },
             false},
            {"two memfds in one message",
             [&](int s) {
                 int a = good_memfd(0x77), b = good_memfd(0x77);
                 send_with_fds(s, reply_for(a), {a, b});
                 close(a);
                 close(b);
             },
             false},
            {"a socket",
             [&](int s) {
                 int sv[2];
                 socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv);
                 one(s, sv[0], reply_for(sv[0]));
                 close(sv[1]);
             },
             false},
            {"a refusal that carries a memfd",
             [&](int s) {
                 int fd = good_memfd(0x77);
                 auto r = reply_for(fd);
                 r.status = -EACCES;
                 one(s, fd, r);
             },
             false},
            {"another memfd than the reply names (inode)",
             [&](int s) {
                 int fd = good_memfd(0x77);
                 auto r = reply_for(fd);
                 r.ino ^= 1;
                 one(s, fd, r);
             },
             false},
            {"a well-formed managed buffer (control)",
             [&](int s) {
                 int fd = good_memfd(0x77);
                 one(s, fd, reply_for(fd));
             },
             true},
        };
        int n = 0;
        for (auto &c : cases) {
            SCOPED_TRACE(c.what);
            fake.answer = c.answer;
            const int fds_before = open_fds();
            uint64_t remote = 0;
            ASSERT_EQ(api->import_mem(t, peer, &region, &desc, sizeof desc, &remote, &err), 0)
                << "a refused memfd leaves the import on cross-memory attach: " << err.message;
            fake.wait_answered(++n);
            EXPECT_EQ(mappings_named("/memfd:hostile"), c.maps ? 1 : 0);
            ASSERT_EQ(api->release_mem(t, peer, remote, &err), 0) << err.message;
            EXPECT_EQ(mappings_named("/memfd:hostile"), 0) << "the mapping goes with the last import";
            EXPECT_EQ(open_fds(), fds_before) << "no descriptor is left open";
        }
        ASSERT_EQ(api->disconnect(t, peer, &err), 0);
    }
    api->destroy(t);
    dlclose(so);
}
