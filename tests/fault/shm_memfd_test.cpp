// shm.so's serving side against initiators that name descriptors in their requests: a
// file the initiator may only read, an O_PATH descriptor of a file it may not
// read at all, memfds that are not sealed or not shm.so's, and an initiator whose pid is taken
// over by another process while its socket lives on. The target is a real child process
// (ChildPeer, running as this test's user, root in CI); this process is the hostile initiator.
#include "../transport/harness.hpp"
#include "../transport/peer_process.hpp"
#include "shm_raw.hpp"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#ifdef FERRY_TEST_SHM_PLUGIN

using namespace ferry_test;
using ferry_fault::RawShm;

namespace {

constexpr uint32_t kRW = FERRY_ACCESS_REMOTE_READ | FERRY_ACCESS_REMOTE_WRITE;
constexpr size_t kLen = 8192;

std::string read_file(const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

// A file of kLen bytes `fill`, removed at the end.
struct TempFile {
    std::string path;
    explicit TempFile(char fill, mode_t mode) {
        char tmpl[] = "/var/tmp/ferry-shm-victim-XXXXXX";  // not tmpfs: a plain file
        int fd = mkstemp(tmpl);
        path = tmpl;
        std::string bytes(kLen, fill);
        EXPECT_EQ(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(kLen));
        fchmod(fd, mode);
        close(fd);
    }
    ~TempFile() { unlink(path.c_str()); }
    uint64_t ino() const {
        struct stat st {};
        stat(path.c_str(), &st);
        return st.st_ino;
    }
};

ferry_shm::Request named_fd_request(uint32_t opcode, int fd, uint64_t ino, const uint8_t *local, uint64_t remote,
                                    uint64_t len) {
    ferry_shm::Request r{};
    r.id = 1;
    r.opcode = opcode;
    r.local_fd = fd;
    r.remote_addr = remote;
    r.length = len;
    r.local_addr = reinterpret_cast<uint64_t>(local);
    r.local_ino = ino;
    r.local_base = reinterpret_cast<uint64_t>(local);
    r.local_len = kLen;
    return r;
}

class ShmDescriptors : public ::testing::TestWithParam<bool> {};  // the target's adopt_memfd

// The target copies our request with ITS rights: before the fix it reopened our read-only and
// O_PATH descriptors read-write through /proc and wrote the first file, and copied the second
// (which we cannot read) into its region, where READs hand it to us.
TEST_P(ShmDescriptors, AFileTheInitiatorCannotWriteIsNeverWrittenOrRead) {
    const bool adopt = GetParam();
    ChildPeer target(FERRY_TEST_SHM_PLUGIN, kLen, kRW, adopt ? Options{{"adopt_memfd", "true"}} : Options{});
    ASSERT_TRUE(target.ok()) << target.error();
    ASSERT_TRUE(target.fill(0, kLen, 5));
    TempFile readable('V', 0644), secret('S', 0600);
    int ro = open(readable.path.c_str(), O_RDONLY | O_CLOEXEC);
    int path_only = open(secret.path.c_str(), O_PATH | O_CLOEXEC);
    ASSERT_GE(ro, 0);
    ASSERT_GE(path_only, 0);
    RawShm raw(target.endpoint());
    ASSERT_TRUE(raw.connected());
    ASSERT_TRUE(ferry_fault::handshake(raw));
    std::vector<uint8_t> landing(kLen, 0xEE), source(kLen, 0x11);

    // READ: the target's region, meant for our memory at `landing`, must not go into the file.
    ferry_shm::Done d{};
    std::string m;
    ASSERT_TRUE(ferry_fault::request(
        raw, named_fd_request(FERRY_OP_READ, ro, readable.ino(), landing.data(), target.addr(), kLen), &d, &m));
    EXPECT_EQ(read_file(readable.path), std::string(kLen, 'V')) << "the target wrote a file opened read-only";
    EXPECT_EQ(d.status, 0) << m;  // served with cross-memory attach, into our memory
    EXPECT_EQ(find_mismatch(landing.data(), kLen, 5), SIZE_MAX);

    // WRITE: the target's region is filled from our memory at `source`, never from the file.
    ASSERT_TRUE(ferry_fault::request(
        raw, named_fd_request(FERRY_OP_WRITE, path_only, secret.ino(), source.data(), target.addr(), kLen), &d, &m));
    EXPECT_EQ(d.status, 0) << m;
    uint64_t h = 0;
    ASSERT_TRUE(target.hash(0, kLen, &h)) << "target died";
    const std::string s(kLen, 'S');
    EXPECT_NE(h, fnv1a(reinterpret_cast<const uint8_t *>(s.data()), kLen)) << "an O_PATH file's bytes were copied";
    EXPECT_EQ(h, fnv1a(source.data(), kLen));
    close(ro);
    close(path_only);
}

INSTANTIATE_TEST_SUITE_P(AdoptMemfd, ShmDescriptors, ::testing::Bool(),
                         [](const auto &info) { return info.param ? "on" : "off"; });

// A memfd of our own, mapped here; `landing` is a separate buffer. A READ whose request names
// the memfd and points at `landing` shows which way the target went: into the memfd (it mapped
// it) or into `landing` (cross-memory attach).
struct OwnMemfd {
    int fd = -1;
    uint8_t *map = nullptr;
    OwnMemfd(const char *name, unsigned flags, int seals) {
        fd = memfd_create(name, MFD_CLOEXEC | flags);
        EXPECT_GE(fd, 0);
        EXPECT_EQ(ftruncate(fd, kLen), 0);
        if (seals) {
            EXPECT_EQ(fcntl(fd, F_ADD_SEALS, seals), 0);
        }
        map = static_cast<uint8_t *>(mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
        memset(map, 0xEE, kLen);
    }
    ~OwnMemfd() {
        munmap(map, kLen);  // never touched after a truncation
        close(fd);
    }
    uint64_t ino() const {
        struct stat st {};
        fstat(fd, &st);
        return st.st_ino;
    }
};

enum class Went { Memfd, Landing, Neither };

// memfd_map nullptr: the memfd was truncated (touching our mapping would SIGBUS us).
Went read_through(RawShm &raw, const ChildPeer &target, int fd, uint64_t ino, uint8_t *memfd_map) {
    std::vector<uint8_t> landing(kLen, 0xEE);
    if (memfd_map != nullptr) memset(memfd_map, 0xEE, kLen);
    ferry_shm::Request r = named_fd_request(FERRY_OP_READ, fd, ino, landing.data(), target.addr(), kLen);
    ferry_shm::Done d{};
    std::string m;
    if (!ferry_fault::request(raw, r, &d, &m) || d.status != 0) return Went::Neither;
    if (memfd_map != nullptr && find_mismatch(memfd_map, kLen, 6) == SIZE_MAX) return Went::Memfd;
    return find_mismatch(landing.data(), kLen, 6) == SIZE_MAX ? Went::Landing : Went::Neither;
}

TEST(ShmMemfd, OnlySealedReadWriteFerryMemfdsAreMapped) {
    ChildPeer target(FERRY_TEST_SHM_PLUGIN, kLen, kRW, {{"adopt_memfd", "true"}});
    ASSERT_TRUE(target.ok()) << target.error();
    ASSERT_TRUE(target.fill(0, kLen, 6));
    const int seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
    {  // No seals: we could truncate it under the target's mapping (SIGBUS there).
        OwnMemfd unsealed("ferry-shm-region", MFD_ALLOW_SEALING, 0);
        RawShm raw(target.endpoint());
        ASSERT_TRUE(ferry_fault::handshake(raw));
        EXPECT_EQ(read_through(raw, target, unsealed.fd, unsealed.ino(), unsealed.map), Went::Landing);
        ASSERT_EQ(ftruncate(unsealed.fd, 0), 0);
        EXPECT_EQ(read_through(raw, target, unsealed.fd, unsealed.ino(), nullptr), Went::Landing);
        uint64_t h;
        ASSERT_TRUE(target.hash(0, kLen, &h)) << "the target died (SIGBUS through a truncated memfd?)";
    }
    {  // Sealed, but not shm.so's.
        OwnMemfd other("not-ferry", MFD_ALLOW_SEALING, seals);
        RawShm raw(target.endpoint());
        ASSERT_TRUE(ferry_fault::handshake(raw));
        EXPECT_EQ(read_through(raw, target, other.fd, other.ino(), other.map), Went::Landing);
    }
    {  // shm.so's memfd, but the descriptor we name is read-only.
        OwnMemfd good("ferry-shm-region", MFD_ALLOW_SEALING, seals);
        int ro = open(("/proc/self/fd/" + std::to_string(good.fd)).c_str(), O_RDONLY | O_CLOEXEC);
        ASSERT_GE(ro, 0);
        RawShm raw(target.endpoint());
        ASSERT_TRUE(ferry_fault::handshake(raw));
        EXPECT_EQ(read_through(raw, target, ro, good.ino(), good.map), Went::Landing);
        close(ro);
    }
    {  // The real thing is mapped (this test can tell the two ways apart).
        OwnMemfd good("ferry-shm-region", MFD_ALLOW_SEALING, seals);
        RawShm raw(target.endpoint());
        ASSERT_TRUE(ferry_fault::handshake(raw));
        EXPECT_EQ(read_through(raw, target, good.fd, good.ino(), good.map), Went::Memfd);
    }
    {  // A target without adopt_memfd maps nothing, even the real thing.
        ChildPeer plain(FERRY_TEST_SHM_PLUGIN, kLen, kRW, {});
        ASSERT_TRUE(plain.ok()) << plain.error();
        ASSERT_TRUE(plain.fill(0, kLen, 6));
        OwnMemfd good("ferry-shm-region", MFD_ALLOW_SEALING, seals);
        RawShm raw(plain.endpoint());
        ASSERT_TRUE(ferry_fault::handshake(raw));
        EXPECT_EQ(read_through(raw, plain, good.fd, good.ino(), good.map), Went::Landing);
    }
}

// The initiator exits after its handshake while another process holds its socket (here: we do,
// passed over SCM_RIGHTS). Requests on it must be refused, never copied to or from whatever
// process has that pid now: as root, the test puts a new process on the very pid
// (ns_last_pid) with the same memory layout and different bytes.
TEST(ShmMemfd, ASocketOutlivingItsInitiatorIsNeverServed) {
    ChildPeer target(FERRY_TEST_SHM_PLUGIN, kLen, kRW, {});
    ASSERT_TRUE(target.ok()) << target.error();
    ASSERT_TRUE(target.fill(0, kLen, 7));
    static uint8_t buf[kLen];  // same address in every fork of this process
    memset(buf, 0x22, kLen);
    int sp[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
    const std::vector<uint8_t> ep = target.endpoint();
    pid_t first = fork();
    if (first == 0) {  // the initiator: handshake, hand the socket over, exit
        RawShm raw(ep);
        if (!ferry_fault::handshake(raw)) _exit(1);
        int fd = raw.fd();
        char c = 'x';
        iovec iov{&c, 1};
        alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
        msghdr mh{};
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        mh.msg_control = ctl;
        mh.msg_controllen = sizeof ctl;
        cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &fd, sizeof fd);
        _exit(sendmsg(sp[1], &mh, 0) == 1 ? 0 : 2);
    }
    char c;
    iovec iov{&c, 1};
    alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = ctl;
    mh.msg_controllen = sizeof ctl;
    ASSERT_EQ(recvmsg(sp[0], &mh, 0), 1);
    int sock = -1;
    memcpy(&sock, CMSG_DATA(CMSG_FIRSTHDR(&mh)), sizeof sock);
    int st = 0;
    waitpid(first, &st, 0);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "initiator child failed";

    // Another process on the same pid, holding other bytes at the same address.
    pid_t impostor = -1;
    int go[2];
    ASSERT_EQ(pipe(go), 0);
    for (int attempt = 0; attempt < 20 && impostor != first; ++attempt) {
        if (impostor > 0) {
            kill(impostor, SIGKILL);
            waitpid(impostor, nullptr, 0);
        }
        FILE *f = fopen("/proc/sys/kernel/ns_last_pid", "w");
        if (f == nullptr) break;
        fprintf(f, "%d", first - 1);
        fclose(f);
        impostor = fork();
        if (impostor == 0) {
            memset(buf, 0x33, kLen);
            char b;
            (void)!read(go[0], &b, 1);
            // Exit status: were our bytes changed (a READ written into us)?
            for (size_t i = 0; i < kLen; ++i)
                if (buf[i] != 0x33) _exit(3);
            _exit(0);
        }
    }
    const bool reused = impostor == first;
    std::cout << (reused ? "pid reused by a new process"
                         : "pid reuse not arranged (needs root and a writable ns_last_pid): checking the refusal only")
              << "\n";
    RawShm held(sock);
    std::vector<uint8_t> landing(kLen, 0x44);
    ferry_shm::Request r{};
    r.opcode = FERRY_OP_WRITE;  // from "the initiator's" memory into the target's region
    r.local_fd = -1;
    r.remote_addr = target.addr();
    r.length = kLen;
    r.local_addr = reinterpret_cast<uint64_t>(buf);
    ferry_shm::Done d{};
    std::string m;
    r.id = 1;
    bool answered = ferry_fault::request(held, r, &d, &m);
    if (answered) {
        EXPECT_LT(d.status, 0) << "a request was served for an initiator that exited";
    }
    r.id = 2;
    r.opcode = FERRY_OP_READ;
    if (answered && ferry_fault::request(held, r, &d, &m)) {
        EXPECT_LT(d.status, 0) << "a request was served for an initiator that exited";
    }
    uint64_t h = 0;
    ASSERT_TRUE(target.hash(0, kLen, &h));
    std::vector<uint8_t> want(kLen);
    fill_pattern(want.data(), kLen, 7);
    EXPECT_EQ(h, fnv1a(want.data(), kLen)) << "the target's region was written from another process";
    if (impostor > 0) {
        (void)!write(go[1], "g", 1);
        waitpid(impostor, &st, 0);
        if (reused) {
            EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "the process on the reused pid was written";
        }
    }
    close(go[0]);
    close(go[1]);
    close(sp[0]);
    close(sp[1]);
}

}  // namespace

#endif  // FERRY_TEST_SHM_PLUGIN
