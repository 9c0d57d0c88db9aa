// file.so when things go wrong: a full filesystem (a 256 KiB tmpfs mounted in a private mount
// namespace of a child process) and a read-only one, a file removed under an open segment, a
// process killed in the middle of its WRITE batches (what it was told had reached the file has),
// and a wait whose timeout passes before the batch ends.
#include <gtest/gtest.h>

#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>

#include <functional>
#include <thread>

#include "file_test_util.hpp"

using namespace ferry;
using namespace ferry::test;

namespace {

// Exit codes of the mount-namespace child.
constexpr int kChildSkip = 77;

// Runs `body` in a child with a private mount namespace in which a tmpfs of `size` is mounted on
// `dir` (root: a mount namespace; otherwise a user namespace too). The child's stderr carries its
// messages; returns its exit status, kChildSkip when no such mount can be made here.
int in_small_tmpfs(const std::string &dir, const char *size, const std::function<int(const std::string &)> &body) {
    pid_t pid = ::fork();
    if (pid == 0) {
        int flags = CLONE_NEWNS | (::geteuid() == 0 ? 0 : CLONE_NEWUSER);
        if (::unshare(flags) != 0) {
            std::fprintf(stderr, "unshare: %s\n", std::strerror(errno));
            ::_exit(kChildSkip);
        }
        ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr);  // nothing leaks out
        std::string opts = std::string("size=") + size;
        if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, opts.c_str()) != 0) {
            std::fprintf(stderr, "mount tmpfs: %s\n", std::strerror(errno));
            ::_exit(kChildSkip);
        }
        ::_exit(body(dir));
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

#define CHILD_CHECK(cond, ...)                                      \
    do {                                                            \
        if (!(cond)) {                                              \
            std::fprintf(stderr, "line %d: %s: ", __LINE__, #cond); \
            std::fprintf(stderr, __VA_ARGS__);                      \
            std::fprintf(stderr, "\n");                             \
            return 1;                                               \
        }                                                           \
    } while (0)

TEST(FileFailure, FullFilesystemFailsTheWriteWithEnospcNamingFileAndOffset) {
    ScratchDir dir(FERRY_TEST_DISK_DIR);
    ASSERT_TRUE(dir.ok());
    int rc = in_small_tmpfs(dir.path(), "256k", [](const std::string &mnt) {
        std::string path = mnt + "/full.bin";
        make_file(path, 0);
        auto e = file_engine();
        CHILD_CHECK(e.has_value(), "%s", e.error().message.c_str());
        AlignedBuffer buf(1 << 20);
        fill_pattern(buf.data, buf.size, 5);
        CHILD_CHECK((*e)->register_memory(buf.data, buf.size).has_value(), "register");
        auto seg = (*e)->open_segment("file:" + path);
        CHILD_CHECK(seg.has_value(), "%s", seg.error().message.c_str());
        // 64 KiB fits; 1 MiB cannot.
        auto small = run_batch(**e, {op(Opcode::Write, buf.data, *seg, 0, 65536)});
        CHILD_CHECK(small.has_value(), "%s", small.error().message.c_str());
        auto big = run_batch(**e, {op(Opcode::Write, buf.data, *seg, 1 << 20, 1 << 20)});
        CHILD_CHECK(!big.has_value(), "a 1 MiB WRITE into a 256 KiB filesystem succeeded");
        const std::string &m = big.error().message;
        CHILD_CHECK(m.find("No space left on device") != std::string::npos, "%s", m.c_str());
        CHILD_CHECK(m.find(path) != std::string::npos, "%s", m.c_str());
        CHILD_CHECK(m.find("WRITE of") != std::string::npos && m.find("at offset") != std::string::npos, "%s",
                    m.c_str());
        CHILD_CHECK(m.find("free space") != std::string::npos, "%s", m.c_str());
        // What fitted is intact.
        CHILD_CHECK(read_file(path, 0, 65536) == std::vector<char>(buf.data, buf.data + 65536), "first 64 KiB");

        // The same filesystem read-only: the file opens for reading, WRITEs fail naming why.
        (void)(*e)->close_segment(*seg);
        // The kernel drops its last reference to a file io_uring wrote from a work queue, a moment
        // after close: until then the filesystem counts it open for writing.
        int rc = -1;
        for (int i = 0; i < 200 && rc != 0; ++i) {
            rc = ::mount(nullptr, mnt.c_str(), nullptr, MS_REMOUNT | MS_RDONLY, nullptr);
            if (rc != 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        CHILD_CHECK(rc == 0, "remount ro: %s", std::strerror(errno));
        auto ro = (*e)->open_segment("file:" + path);
        CHILD_CHECK(ro.has_value(), "%s", ro.error().message.c_str());
        auto r = run_batch(**e, {op(Opcode::Read, buf.data + 65536, *ro, 0, 4096)});
        CHILD_CHECK(r.has_value(), "%s", r.error().message.c_str());
        auto w = run_batch(**e, {op(Opcode::Write, buf.data, *ro, 0, 4096)});
        CHILD_CHECK(!w.has_value(), "a WRITE to a read-only filesystem succeeded");
        CHILD_CHECK(w.error().message.find("read-only") != std::string::npos, "%s", w.error().message.c_str());
        return 0;
    });
    if (rc == kChildSkip) GTEST_SKIP() << "SKIPPED: no private tmpfs mount here (no mount or user namespace)";
    EXPECT_EQ(rc, 0) << "the child's messages are above";
}

TEST(FileFailure, RemovedFileStaysUsableThroughTheOpenSegment) {
    ScratchDir dir(FERRY_TEST_DISK_DIR);
    std::string path = dir / "gone.bin";
    make_file(path, 65536, 'g');
    auto e = file_engine();
    ASSERT_TRUE(e) << e.error().message;
    AlignedBuffer buf(1 << 20);
    ASSERT_TRUE((*e)->register_memory(buf.data, buf.size));
    auto seg = (*e)->open_segment("file:" + path);
    ASSERT_TRUE(seg) << seg.error().message;
    ASSERT_EQ(::unlink(path.c_str()), 0);
    // The segment holds the file open: its inode lives on, as for any open file.
    fill_pattern(buf.data, 65536, 11);
    ASSERT_TRUE(run_batch(**e, {op(Opcode::Write, buf.data, *seg, 4096, 65536)}));
    auto r = run_batch(**e, {op(Opcode::Read, buf.data + 65536, *seg, 0, 65536 + 4096)});
    ASSERT_TRUE(r) << r.error().message;
    EXPECT_EQ(buf.data[65536], 'g');
    EXPECT_EQ(std::memcmp(buf.data + 65536 + 4096, buf.data, 65536), 0);
    // Closed and opened again, the name is gone.
    ASSERT_TRUE((*e)->close_segment(*seg));
    auto again = (*e)->open_segment("file:" + path);
    ASSERT_FALSE(again);
    EXPECT_EQ(again.error().code, -ENOENT);
}

// The child writes 64 KiB blocks in batches of 8 and, after each batch's wait returned, tells the
// parent (through a pipe) how many blocks are done; the parent kills it mid-way. Every block the
// child was told had reached the file must be there, whole, when the file is opened again.
TEST(FileFailure, KilledMidBatchLeavesEveryReportedWriteInTheFile) {
    ScratchDir dir(FERRY_TEST_DISK_DIR);
    std::string path = dir / "killed.bin";
    make_file(path, 0);
    constexpr size_t kBlock = 65536, kBlocks = 4096;  // 256 MiB at most
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    pid_t pid = ::fork();
    if (pid == 0) {
        ::close(fds[0]);
        auto e = file_engine();
        if (!e) ::_exit(2);
        AlignedBuffer buf(8 * kBlock);
        if (!(*e)->register_memory(buf.data, buf.size)) ::_exit(3);
        auto seg = (*e)->open_segment("file:" + path);
        if (!seg) ::_exit(4);
        for (uint32_t b = 0; b < kBlocks; b += 8) {
            std::vector<Request> reqs;
            for (uint32_t i = 0; i < 8; ++i) {
                fill_pattern(buf.data + i * kBlock, kBlock, b + i + 1);
                reqs.push_back(op(Opcode::Write, buf.data + i * kBlock, *seg, (b + i) * kBlock, kBlock));
            }
            if (!run_batch(**e, reqs)) ::_exit(5);
            uint32_t done = b + 8;
            if (::write(fds[1], &done, sizeof done) != sizeof done) ::_exit(6);
        }
        ::_exit(0);
    }
    ::close(fds[1]);
    uint32_t reported = 0, got = 0;
    // Let it write some batches, then kill it while it is inside one.
    while (reported < 64 && ::read(fds[0], &got, sizeof got) == sizeof got) reported = got;
    ::kill(pid, SIGKILL);
    while (::read(fds[0], &got, sizeof got) == sizeof got) reported = got;  // what it said before dying
    int status = 0;
    ::waitpid(pid, &status, 0);
    ::close(fds[0]);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the child ended before it was killed (status " << status << ")";
    ASSERT_GE(reported, 64u);

    auto e = file_engine();
    ASSERT_TRUE(e) << e.error().message;
    AlignedBuffer buf(2 * kBlock);
    ASSERT_TRUE((*e)->register_memory(buf.data, buf.size));
    auto seg = (*e)->open_segment("file:" + path);
    ASSERT_TRUE(seg) << seg.error().message;
    for (uint32_t b = 0; b < reported; ++b) {
        auto r = run_batch(**e, {op(Opcode::Read, buf.data, *seg, b * kBlock, kBlock)});
        ASSERT_TRUE(r) << "block " << b << ": " << r.error().message;
        fill_pattern(buf.data + kBlock, kBlock, b + 1);
        ASSERT_EQ(std::memcmp(buf.data, buf.data + kBlock, kBlock), 0) << "block " << b << " of " << reported;
    }
}

TEST(FileFailure, WaitTimeoutLeavesTheBatchPendingThenItCompletes) {
    ScratchDir dir(FERRY_TEST_DISK_DIR);
    std::string path = dir / "slow.bin";
    make_file(path, 0);
    auto e = file_engine({{"file.write_through", "true"}});
    ASSERT_TRUE(e) << e.error().message;
    AlignedBuffer buf(64 << 20);
    fill_pattern(buf.data, buf.size, 2);
    ASSERT_TRUE((*e)->register_memory(buf.data, buf.size));
    auto seg = (*e)->open_segment("file:" + path);
    ASSERT_TRUE(seg) << seg.error().message;
    // 64 MiB written through to stable storage cannot end within the first microsecond.
    std::vector<Request> reqs;
    for (size_t i = 0; i < 16; ++i)
        reqs.push_back(op(Opcode::Write, buf.data + i * (4 << 20), *seg, i * (4 << 20), 4 << 20));
    auto b = (*e)->submit(reqs);
    ASSERT_TRUE(b) << b.error().message;
    auto early = (*e)->wait(*b, std::chrono::milliseconds(0));
    ASSERT_FALSE(early);
    EXPECT_EQ(early.error().code, kWaitPending) << early.error().message;
    EXPECT_EQ((*e)->free_batch(*b).error().code, -EBUSY);
    auto done = (*e)->wait(*b, std::chrono::seconds(60));
    ASSERT_TRUE(done) << done.error().message;
    ASSERT_TRUE((*e)->free_batch(*b));
    EXPECT_EQ(read_file(path, 60 << 20, 4 << 20), std::vector<char>(buf.data + (60 << 20), buf.data + (64 << 20)));
}

}  // namespace
