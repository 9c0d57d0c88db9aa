// file.so through the engine: open_segment("file:<path>"), READ and WRITE byte for byte at
// aligned and unaligned offsets, lengths and addresses, on the real disk (the build directory)
// and on tmpfs (/dev/shm); O_DIRECT used where aligned (the page cache stays empty), refused
// under direct=require; striped segments; bad input with messages that name the fix; and the
// trust rule: a storage transport never carries a memory segment.
#include <gtest/gtest.h>

#include <sys/mman.h>

#include "file_test_util.hpp"

using namespace ferry;
using namespace ferry::test;

namespace {

struct Place {
    const char *name;
    std::string dir;
};

std::string place_dir(const std::string &which) { return which == "disk" ? FERRY_TEST_DISK_DIR : "/dev/shm"; }

class FileSegment : public ::testing::TestWithParam<std::string> {
protected:
    void SetUp() override {
        std::string dir = place_dir(GetParam());
        if (GetParam() == "tmpfs" && !on_tmpfs(dir)) GTEST_SKIP() << "SKIPPED: /dev/shm is not a tmpfs here";
        scratch = std::make_unique<ScratchDir>(dir);
        ASSERT_TRUE(scratch->ok()) << dir;
        auto e = file_engine();
        ASSERT_TRUE(e) << e.error().message;
        engine = std::move(*e);
        ASSERT_TRUE(engine->register_memory(mem.data, mem.size));
    }
    std::unique_ptr<ScratchDir> scratch;
    std::unique_ptr<Engine> engine;
    AlignedBuffer mem{8 << 20};
};

TEST_P(FileSegment, WriteThenReadByteExactAlignedAndUnaligned) {
    std::string path = *scratch / "kv.bin";
    make_file(path, 0);
    auto seg = engine->open_segment("file:" + path);
    ASSERT_TRUE(seg) << seg.error().message;
    char *src = mem.data;
    char *dst = mem.data + (4 << 20);
    fill_pattern(src, 4 << 20, 1);
    // Aligned 1 MiB, unaligned everything (address, offset, length), and a 6 MiB op cut into
    // several requests (max_io_bytes is 4 MiB).
    struct Case {
        size_t local, offset, length;
    } cases[] = {{0, 0, 1 << 20}, {3, (1 << 20) + 4097, 12345}, {8192, 2 << 20, 4096}, {17, 5 << 20, 1}};
    std::vector<Request> writes;
    for (auto &c : cases) writes.push_back(op(Opcode::Write, src + c.local, *seg, c.offset, c.length));
    auto w = run_batch(*engine, writes);
    ASSERT_TRUE(w) << w.error().message;
    for (auto &c : cases) {
        auto on_disk = read_file(path, c.offset, c.length);
        ASSERT_EQ(on_disk.size(), c.length);
        EXPECT_EQ(std::memcmp(on_disk.data(), src + c.local, c.length), 0) << "offset " << c.offset;
    }
    std::vector<Request> reads;
    for (auto &c : cases) reads.push_back(op(Opcode::Read, dst + c.local, *seg, c.offset, c.length));
    auto r = run_batch(*engine, reads);
    ASSERT_TRUE(r) << r.error().message;
    for (auto &c : cases) EXPECT_EQ(std::memcmp(dst + c.local, src + c.local, c.length), 0) << "offset " << c.offset;

    // One op larger than max_io_bytes, both ways.
    auto big = run_batch(*engine, {op(Opcode::Write, src, *seg, 8 << 20, 4 << 20)});
    ASSERT_TRUE(big) << big.error().message;
    std::memset(dst, 0, 4 << 20);
    auto back = run_batch(*engine, {op(Opcode::Read, dst, *seg, 8 << 20, 4 << 20)});
    ASSERT_TRUE(back) << back.error().message;
    EXPECT_EQ(std::memcmp(dst, src, 4 << 20), 0);
}

TEST_P(FileSegment, ReadPastEndFailsNamingFileAndOffset) {
    std::string path = *scratch / "short.bin";
    make_file(path, 8192, 'a');
    auto seg = engine->open_segment("file:" + path);
    ASSERT_TRUE(seg) << seg.error().message;
    auto r = run_batch(*engine, {op(Opcode::Read, mem.data, *seg, 4096, 8192)});
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code, -ENODATA) << r.error().message;
    EXPECT_NE(r.error().message.find(path), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find("offset 8192"), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find("the file ends before it"), std::string::npos) << r.error().message;
    // The part that exists did arrive; the batch's other op is unaffected.
    EXPECT_EQ(mem.data[0], 'a');
    auto ok = run_batch(*engine, {op(Opcode::Read, mem.data, *seg, 0, 8192)});
    EXPECT_TRUE(ok) << ok.error().message;
}

TEST_P(FileSegment, StripedSegmentSpreadsStripesOverItsFiles) {
    auto e = file_engine({{"file.stripe_bytes", "4k"}});
    ASSERT_TRUE(e) << e.error().message;
    ASSERT_TRUE((*e)->register_memory(mem.data, mem.size));
    std::string a = *scratch / "a", b = *scratch / "b";
    make_file(a, 0);
    make_file(b, 0);
    auto seg = (*e)->open_segment("file:" + a + "," + b);
    ASSERT_TRUE(seg) << seg.error().message;
    fill_pattern(mem.data, 40960, 9);
    // From offset 1000, so the first and last requests are partial stripes.
    auto w = run_batch(**e, {op(Opcode::Write, mem.data, *seg, 1000, 40960)});
    ASSERT_TRUE(w) << w.error().message;
    // Stripe k (4 KiB) of the segment is stripe k/2 of file a (k even) or b (k odd).
    for (uint64_t at = 1000; at < 1000 + 40960; ++at) {
        uint64_t stripe = at / 4096;
        auto byte = read_file(stripe % 2 ? b : a, (stripe / 2) * 4096 + at % 4096, 1);
        ASSERT_EQ(byte.size(), 1u) << at;
        ASSERT_EQ(byte[0], mem.data[at - 1000]) << "segment offset " << at;
    }
    char *dst = mem.data + (1 << 20);
    auto r = run_batch(**e, {op(Opcode::Read, dst, *seg, 1000, 40960)});
    ASSERT_TRUE(r) << r.error().message;
    EXPECT_EQ(std::memcmp(dst, mem.data, 40960), 0);
}

INSTANTIATE_TEST_SUITE_P(Places, FileSegment, ::testing::Values("disk", "tmpfs"));

// Whether the filesystem under `dir` takes O_DIRECT.
bool takes_direct(const std::string &dir) {
    std::string probe = dir + "/.direct-probe";
    int fd = ::open(probe.c_str(), O_CREAT | O_RDWR | O_DIRECT, 0600);
    if (fd >= 0) ::close(fd);
    ::unlink(probe.c_str());
    return fd >= 0;
}

// Pages of [offset, +length) of the file held in the page cache.
size_t cached_pages(const std::string &path, size_t offset, size_t length) {
    int fd = ::open(path.c_str(), O_RDONLY);
    void *m = ::mmap(nullptr, offset + length, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (m == MAP_FAILED) return SIZE_MAX;
    size_t pages = (offset + length + 4095) / 4096;
    std::vector<unsigned char> vec(pages);
    ::mincore(m, offset + length, vec.data());
    ::munmap(m, offset + length);
    size_t n = 0;
    for (size_t i = offset / 4096; i < pages; ++i) n += vec[i] & 1;
    return n;
}

TEST(FileDirect, AlignedOpsBypassThePageCacheUnalignedOnesUseIt) {
    ScratchDir dir(FERRY_TEST_DISK_DIR);
    ASSERT_TRUE(dir.ok());
    if (!takes_direct(dir.path()) || on_tmpfs(dir.path()))
        GTEST_SKIP() << "SKIPPED: the filesystem of " << dir.path() << " has no O_DIRECT without a page cache";
    std::string path = dir / "direct.bin";
    make_file(path, 0);
    for (const char *mode : {"auto", "off"}) {
        auto e = file_engine({{"file.direct", mode}});
        ASSERT_TRUE(e) << e.error().message;
        AlignedBuffer buf(4 << 20);
        ASSERT_TRUE((*e)->register_memory(buf.data, buf.size));
        auto seg = (*e)->open_segment("file:" + path);
        ASSERT_TRUE(seg) << seg.error().message;
        fill_pattern(buf.data, buf.size, 3);
        uint64_t base = std::string(mode) == "auto" ? 0 : (8 << 20);
        auto w = run_batch(**e, {op(Opcode::Write, buf.data, *seg, base, 1 << 20),
                                 op(Opcode::Write, buf.data + 1, *seg, base + (2 << 20) + 1, 100000)});
        ASSERT_TRUE(w) << w.error().message;
        size_t aligned = cached_pages(path, base, 1 << 20);
        size_t unaligned = cached_pages(path, base + (2 << 20), 100001);
        if (std::string(mode) == "auto") EXPECT_EQ(aligned, 0u) << "the aligned WRITE went through the page cache";
        else EXPECT_EQ(aligned, 256u) << "direct=off: the aligned WRITE should be in the page cache";
        EXPECT_GT(unaligned, 0u) << mode << ": the unaligned WRITE should go through the page cache";
        EXPECT_EQ(read_file(path, base, 1 << 20), std::vector<char>(buf.data, buf.data + (1 << 20)));
    }
}

TEST(FileDirect, RequireRefusesWhatCannotGoDirect) {
    ScratchDir dir(FERRY_TEST_DISK_DIR);
    ASSERT_TRUE(dir.ok());
    if (!takes_direct(dir.path())) GTEST_SKIP() << "SKIPPED: the filesystem of " << dir.path() << " has no O_DIRECT";
    std::string path = dir / "require.bin";
    make_file(path, 1 << 20, 'z');
    auto e = file_engine({{"file.direct", "require"}});
    ASSERT_TRUE(e) << e.error().message;
    AlignedBuffer buf(1 << 20);
    ASSERT_TRUE((*e)->register_memory(buf.data, buf.size));
    auto seg = (*e)->open_segment("file:" + path);
    ASSERT_TRUE(seg) << seg.error().message;
    auto ok = run_batch(**e, {op(Opcode::Read, buf.data, *seg, 0, 65536)});
    ASSERT_TRUE(ok) << ok.error().message;
    EXPECT_EQ(buf.data[100], 'z');
    auto bad = run_batch(**e, {op(Opcode::Read, buf.data + 1, *seg, 4096, 4096)});
    ASSERT_FALSE(bad);
    EXPECT_NE(bad.error().message.find("file.direct=require"), std::string::npos) << bad.error().message;
    EXPECT_NE(bad.error().message.find("address % "), std::string::npos) << bad.error().message;
    EXPECT_NE(bad.error().message.find("set file.direct=auto"), std::string::npos) << bad.error().message;
}

TEST(FileDirect, RequireOnAFilesystemWithoutDirectIoFailsOpen) {
    if (!on_tmpfs("/dev/shm")) GTEST_SKIP() << "SKIPPED: /dev/shm is not a tmpfs here";
    ScratchDir dir("/dev/shm");
    std::string path = dir / "x";
    make_file(path, 4096);
    auto e = file_engine({{"file.direct", "require"}});
    ASSERT_TRUE(e) << e.error().message;
    auto seg = (*e)->open_segment("file:" + path);
    if (takes_direct(dir.path())) {
        // Newer kernels give tmpfs O_DIRECT (it is memory either way): require then holds.
        EXPECT_TRUE(seg) << seg.error().message;
        return;
    }
    ASSERT_FALSE(seg);
    EXPECT_NE(seg.error().message.find("O_DIRECT"), std::string::npos) << seg.error().message;
    EXPECT_NE(seg.error().message.find("file.direct=auto"), std::string::npos) << seg.error().message;
}

TEST(FileErrors, MissingFileEmptyNameAndDirectoryAreRefusedWithTheFix) {
    ScratchDir dir(FERRY_TEST_DISK_DIR);
    auto e = file_engine();
    ASSERT_TRUE(e) << e.error().message;
    auto missing = (*e)->open_segment("file:" + dir / "nope.bin");
    ASSERT_FALSE(missing);
    EXPECT_EQ(missing.error().code, -ENOENT);
    EXPECT_NE(missing.error().message.find(dir / "nope.bin"), std::string::npos) << missing.error().message;
    EXPECT_NE(missing.error().message.find("file.create=true"), std::string::npos) << missing.error().message;
    auto empty = (*e)->open_segment("file:");
    ASSERT_FALSE(empty);
    EXPECT_EQ(empty.error().code, -EINVAL);
    auto directory = (*e)->open_segment("file:" + dir.path());
    ASSERT_FALSE(directory);
    EXPECT_EQ(directory.error().code, -EISDIR) << directory.error().message;

    // With create=true the file is made, with mode 0600.
    auto c = file_engine({{"file.create", "true"}});
    ASSERT_TRUE(c) << c.error().message;
    auto made = (*c)->open_segment("file:" + dir / "made.bin");
    ASSERT_TRUE(made) << made.error().message;
    struct stat st {};
    ASSERT_EQ(::stat((dir / "made.bin").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST(FileErrors, NoPermissionIsRefusedNamingThePath) {
    if (::geteuid() == 0)
        GTEST_SKIP() << "SKIPPED: running as root, which the kernel lets open any file (the read-only case runs "
                        "in file_failure's ReadOnlyFilesystem)";
    ScratchDir dir(FERRY_TEST_DISK_DIR);
    std::string none = dir / "none.bin", ro = dir / "ro.bin";
    make_file(none, 4096);
    make_file(ro, 4096, 'r');
    ::chmod(none.c_str(), 0);
    ::chmod(ro.c_str(), 0400);
    auto e = file_engine();
    ASSERT_TRUE(e) << e.error().message;
    auto seg = (*e)->open_segment("file:" + none);
    ASSERT_FALSE(seg);
    EXPECT_EQ(seg.error().code, -EACCES);
    EXPECT_NE(seg.error().message.find(none), std::string::npos) << seg.error().message;
    AlignedBuffer buf(8192);
    ASSERT_TRUE((*e)->register_memory(buf.data, buf.size));
    auto rs = (*e)->open_segment("file:" + ro);
    ASSERT_TRUE(rs) << rs.error().message;
    EXPECT_TRUE(run_batch(**e, {op(Opcode::Read, buf.data, *rs, 0, 4096)}));
    auto w = run_batch(**e, {op(Opcode::Write, buf.data, *rs, 0, 4096)});
    ASSERT_FALSE(w);
    EXPECT_NE(w.error().message.find("read-only"), std::string::npos) << w.error().message;
}

TEST(FileTrust, AStorageTransportNeverCarriesAMemorySegment) {
    auto e = file_engine({{"plugins", "file,tcp"}});
    ASSERT_TRUE(e) << e.error().message;
    AlignedBuffer buf(8192);
    ASSERT_TRUE((*e)->register_memory(buf.data, buf.size, {}));
    auto self = (*e)->open_segment((*e)->segment_name());
    ASSERT_TRUE(self) << self.error().message;
    // Its own descriptor publishes tcp and not file: a peer could not name our files through it.
    Request forced{Opcode::Read, buf.data, *self, reinterpret_cast<uintptr_t>(buf.data + 4096), 4096, "file"};
    auto r = run_batch(**e, {forced});
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message.find("file: "), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find("storage transport carries only file:<path> segments"), std::string::npos)
        << r.error().message;
    // And a file segment is carried by file, never by tcp.
    ScratchDir dir(FERRY_TEST_DISK_DIR);
    make_file(dir / "f", 8192, 'q');
    auto seg = (*e)->open_segment("file:" + dir / "f");
    ASSERT_TRUE(seg) << seg.error().message;
    Request via_tcp{Opcode::Read, buf.data, *seg, 0, 4096, "tcp"};
    auto t = run_batch(**e, {via_tcp});
    ASSERT_FALSE(t);
    EXPECT_NE(t.error().message.find("not a storage transport"), std::string::npos) << t.error().message;
    std::vector<Request> one{op(Opcode::Read, buf.data, *seg, 0, 4096)};
    auto b = (*e)->submit(one);
    ASSERT_TRUE(b) << b.error().message;
    ASSERT_TRUE((*e)->wait(*b, std::chrono::seconds(10)));
    EXPECT_EQ((*e)->status(*b, 0)->transport, "file");
    EXPECT_EQ(buf.data[0], 'q');
    // Notifications have no engine to go to.
    auto n = (*e)->send_notification(*seg, std::vector<uint8_t>{1, 2});
    ASSERT_FALSE(n);
    EXPECT_NE(n.error().message.find("storage segment"), std::string::npos) << n.error().message;
}

}  // namespace
