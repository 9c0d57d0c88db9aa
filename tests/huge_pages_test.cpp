// Transparent huge pages for host memory (base/huge_pages.hpp): the engine's huge_pages key on
// registered regions (off leaves the caller's memory alone; advise and collapse ask the kernel,
// and never change a byte), the bench's pre-faulted buffers, and the refusal of a bad value.
// What the kernel gives depends on /sys/kernel/mm/transparent_hugepage: where THP is "never"
// (or missing) the tests that need huge pages say SKIPPED and why.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>
#include <vector>

#include "ferry/engine.hpp"
#include "huge_pages.hpp"

using namespace ferry;

namespace {

constexpr uint64_t kLen = 64ull << 20;

std::unique_ptr<Engine> make(const char *huge_pages) {
    auto e = Engine::create({{"plugins", "tcp"}, {"local_ip", "127.0.0.1"}, {"huge_pages", huge_pages}});
    EXPECT_TRUE(e) << e.error().message;
    return e ? std::move(*e) : nullptr;
}

// 64 MiB of pre-faulted 4 KiB pages (no huge pages asked) with a pattern in them.
uint8_t *small_pages() {
    std::string error;
    auto *p = static_cast<uint8_t *>(map_prefaulted(kLen, false, error));
    EXPECT_NE(p, nullptr) << error;
    if (p)
        for (uint64_t i = 0; i < kLen; i += 4096) std::memset(p + i, static_cast<int>(i >> 12), 4096);
    return p;
}

bool pattern_intact(const uint8_t *p) {
    for (uint64_t i = 0; i < kLen; i += 4096)
        if (p[i] != static_cast<uint8_t>(i >> 12) || p[i + 4095] != static_cast<uint8_t>(i >> 12)) return false;
    return true;
}

#define SKIP_WITHOUT_THP()                                                                                         \
    do {                                                                                                           \
        std::string mode = thp_mode();                                                                             \
        if (mode != "always" && mode != "madvise")                                                                 \
            GTEST_SKIP() << "SKIPPED: transparent huge pages are '" << mode                                        \
                         << "' here (/sys/kernel/mm/transparent_hugepage/enabled): nothing to ask the kernel for"; \
    } while (0)

}  // namespace

TEST(HugePages, OffLeavesRegisteredMemoryAlone) {
    if (thp_mode() == "always") GTEST_SKIP() << "SKIPPED: THP is 'always' here: every buffer gets huge pages anyway";
    auto e = make("off");
    ASSERT_TRUE(e);
    uint8_t *p = small_pages();
    ASSERT_TRUE(p);
    ASSERT_EQ(huge_page_bytes(p, kLen), 0) << "4 KiB pages to begin with";
    ASSERT_TRUE(e->register_memory(p, kLen));
    EXPECT_EQ(huge_page_bytes(p, kLen), 0);
    EXPECT_TRUE(pattern_intact(p));
    munmap(p, kLen);
}

TEST(HugePages, CollapseMergesPagesAlreadyThereAndKeepsEveryByte) {
    SKIP_WITHOUT_THP();
    auto e = make("collapse");
    ASSERT_TRUE(e);
    uint8_t *p = small_pages();
    ASSERT_TRUE(p);
    ASSERT_TRUE(e->register_memory(p, kLen));
    int64_t got = huge_page_bytes(p, kLen);
    if (got == 0) {
        // MADV_COLLAPSE needs Linux 6.1 and free huge pages; the engine warned. Still no byte changed.
        EXPECT_TRUE(pattern_intact(p));
        GTEST_SKIP() << "SKIPPED: the kernel collapsed nothing (before Linux 6.1, or no free huge pages now)";
    }
    EXPECT_GE(got, static_cast<int64_t>(kLen / 2)) << "most of the 2 MiB-aligned range is huge pages now";
    EXPECT_TRUE(pattern_intact(p));
    ASSERT_TRUE(e->unregister_memory(p));
    munmap(p, kLen);
}

TEST(HugePages, AdviseGivesHugePagesToPagesFaultedInLater) {
    SKIP_WITHOUT_THP();
    auto e = make("advise");
    ASSERT_TRUE(e);
    void *v = mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(v, MAP_FAILED);
    auto *p = static_cast<uint8_t *>(v);
    ASSERT_TRUE(e->register_memory(p, kLen));
    std::memset(p, 7, kLen);  // faulted in after the advice
    int64_t got = huge_page_bytes(p, kLen);
    munmap(p, kLen);
    // A fragmented host may have no free 2 MiB page to give even after compaction.
    if (got == 0) GTEST_SKIP() << "SKIPPED: the kernel gave no huge page (none free after compaction)";
    EXPECT_GE(got, static_cast<int64_t>(kLen / 2));
}

TEST(HugePages, BatchRegistrationAdvisesEveryRange) {
    SKIP_WITHOUT_THP();
    auto e = make("collapse");
    ASSERT_TRUE(e);
    uint8_t *a = small_pages(), *b = small_pages();
    ASSERT_TRUE(a && b);
    std::vector<MemoryRange> ranges = {{a, kLen}, {b, kLen}};
    ASSERT_TRUE(e->register_memory_batch(ranges));
    if (huge_page_bytes(a, kLen) == 0) GTEST_SKIP() << "SKIPPED: the kernel collapsed nothing here";
    EXPECT_GT(huge_page_bytes(b, kLen), 0);
    EXPECT_TRUE(pattern_intact(a) && pattern_intact(b));
    munmap(a, kLen);
    munmap(b, kLen);
}

TEST(HugePages, PrefaultedBuffersAskForHugePagesOnlyWhenTold) {
    SKIP_WITHOUT_THP();
    std::string error;
    void *huge = map_prefaulted(kLen, true, error);
    ASSERT_NE(huge, nullptr) << error;
    int64_t got = huge_page_bytes(huge, kLen);
    munmap(huge, kLen);
    if (got == 0) GTEST_SKIP() << "SKIPPED: the kernel gave no huge page (none free after compaction)";
    EXPECT_GE(got, static_cast<int64_t>(kLen / 2));
    if (thp_mode() == "always") return;
    void *small = map_prefaulted(kLen, false, error);
    ASSERT_NE(small, nullptr) << error;
    EXPECT_EQ(huge_page_bytes(small, kLen), 0);
    munmap(small, kLen);
}

TEST(HugePages, ABadValueIsRefusedWithTheValuesThatWork) {
    auto e = Engine::create({{"plugins", "tcp"}, {"huge_pages", "yes"}});
    ASSERT_FALSE(e);
    EXPECT_EQ(e.error().code, -EINVAL);
    EXPECT_NE(e.error().message.find("use off (the default), advise or collapse"), std::string::npos)
        << e.error().message;
}

TEST(HugePages, ARangeWithoutAnAligned2MiBIsLeftAlone) {
    std::vector<uint8_t> small(1 << 20, 3);
    std::string error;
    EXPECT_EQ(advise_huge_pages(small.data(), small.size(), true, error), 0) << error;
    for (uint8_t c : small) ASSERT_EQ(c, 3);
}
