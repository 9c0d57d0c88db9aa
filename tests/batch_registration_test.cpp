// register_memory_batch / unregister_memory_batch (C++ and the C API's ferry_register_batch /
// ferry_unregister_batch) between two engines of this process over tcp.so and P2PHANDSHAKE: all
// or none, with a message naming the range that failed, and what the peer sees of it.
// tests/etcd_test.cpp covers the same over etcd.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>

#include "ferry/engine.hpp"
#include "ferry/ferry.h"

using namespace ferry;

namespace {

constexpr size_t kSize = 4096;

std::unique_ptr<Engine> make() {
    auto e = Engine::create({{"plugins", "tcp"}, {"local_ip", "127.0.0.1"}});
    EXPECT_TRUE(e) << e.error().message;
    return e ? std::move(*e) : nullptr;
}

bool has(const std::string &text, const std::string &part) { return text.find(part) != std::string::npos; }

class BatchRegistration : public ::testing::Test {
protected:
    void SetUp() override {
        target = make();
        initiator = make();
        ASSERT_TRUE(target && initiator);
        memory.resize(kRanges * kSize);
        for (size_t i = 0; i < memory.size(); ++i) memory[i] = static_cast<uint8_t>(i * 31 + 7);
        ASSERT_TRUE(initiator->register_memory(local.data(), local.size()));
        auto s = initiator->open_segment(target->segment_name());
        ASSERT_TRUE(s) << s.error().message;
        seg = *s;
    }
    uint8_t *range(size_t i) { return memory.data() + i * kSize; }
    std::vector<MemoryRange> all() {
        std::vector<MemoryRange> r;
        for (size_t i = 0; i < kRanges; ++i) r.push_back({range(i), kSize});
        return r;
    }
    std::vector<void *> starts() {
        std::vector<void *> r;
        for (size_t i = 0; i < kRanges; ++i) r.push_back(range(i));
        return r;
    }
    // The target's regions as the initiator sees them (re-read).
    size_t seen() {
        auto r = initiator->segment_regions(seg);
        EXPECT_TRUE(r) << r.error().message;
        return r ? r->size() : SIZE_MAX;
    }
    Result<void> read(size_t i) {
        std::vector<Request> reqs{{Opcode::Read, local.data(), seg, reinterpret_cast<uintptr_t>(range(i)), kSize, ""}};
        auto b = initiator->submit(reqs);
        if (!b) return std::unexpected(b.error());
        auto w = initiator->wait(*b, std::chrono::seconds(20));
        (void)initiator->free_batch(*b);
        return w;
    }
    // None of the ranges is registered: each registers on its own again.
    void expect_none_registered() {
        EXPECT_EQ(seen(), 0u);
        for (size_t i = 0; i < kRanges; ++i) {
            auto r = target->register_memory(range(i), kSize);
            EXPECT_TRUE(r) << "range " << i << " stayed registered: " << r.error().message;
        }
    }

    static constexpr size_t kRanges = 16;
    // Before the engines, so it is freed after them: the target's tcp.so thread may still be in
    // the sendmsg of a READ's reply (ASan checks its buffer once the call returned) when the
    // initiator already saw the READ complete and the test ended.
    std::vector<uint8_t> memory, local = std::vector<uint8_t>(kSize);
    std::unique_ptr<Engine> target, initiator;
    SegmentId seg = 0;
};

}  // namespace

TEST_F(BatchRegistration, EveryRangeRegistersAndUnregistersTogether) {
    auto ranges = all();
    ranges[3].options = MemoryOptions{MemoryKind::Host, -1, kRemoteRead};  // its own options
    ASSERT_TRUE(target->register_memory_batch(ranges));
    auto regions = initiator->segment_regions(seg);
    ASSERT_TRUE(regions) << regions.error().message;
    ASSERT_EQ(regions->size(), kRanges);
    EXPECT_EQ((*regions)[3].access, kRemoteRead);
    EXPECT_EQ((*regions)[4].access, kRemoteRead | kRemoteWrite);
    for (size_t i : {size_t{0}, size_t{7}, kRanges - 1}) {
        ASSERT_TRUE(read(i)) << i;
        EXPECT_EQ(memcmp(local.data(), range(i), kSize), 0) << i;
    }
    std::vector<Request> write{{Opcode::Write, local.data(), seg, reinterpret_cast<uintptr_t>(range(3)), kSize, ""}};
    EXPECT_FALSE(initiator->submit(write)) << "range 3 was registered read-only";

    std::vector<void *> addrs;
    for (size_t i = 0; i < kRanges; ++i) addrs.push_back(range(kRanges - 1 - i));  // any order
    ASSERT_TRUE(target->unregister_memory_batch(addrs));
    EXPECT_EQ(seen(), 0u);
    EXPECT_FALSE(read(0)) << "a region unregistered in a batch still serves reads";
    EXPECT_TRUE(target->register_memory_batch({}));  // nothing to do
    EXPECT_TRUE(target->unregister_memory_batch({}));
}

// MemoryKind::Auto without a GPU runtime (none is on this test's path): host memory, as
// register_memory finds it range by range.
TEST_F(BatchRegistration, AutoRangesWithoutAGpuRuntimeAreHostMemory) {
    ASSERT_TRUE(target->register_memory_batch(all(), MemoryOptions{MemoryKind::Auto, -1, kRemoteRead}));
    auto regions = initiator->segment_regions(seg);
    ASSERT_TRUE(regions) << regions.error().message;
    ASSERT_EQ(regions->size(), kRanges);
    for (const auto &r : *regions) {
        EXPECT_EQ(r.kind, MemoryKind::Host);
        EXPECT_EQ(r.device, -1);
        EXPECT_EQ(r.access, kRemoteRead);
    }
    // Asked for a device, Auto still checks every range, and finds no GPU memory.
    auto ranges = all();
    ranges[2].options = MemoryOptions{MemoryKind::Auto, 0, kRemoteRead};
    ASSERT_TRUE(target->unregister_memory_batch(starts()));
    auto r = target->register_memory_batch(ranges);
    ASSERT_FALSE(r);
    EXPECT_TRUE(has(r.error().message, "range 2 of 16")) << r.error().message;
    expect_none_registered();
}

TEST_F(BatchRegistration, AnInvalidRangeInTheMiddleRegistersNothing) {
    auto ranges = all();
    ranges[9].length = 0;
    auto r = target->register_memory_batch(ranges);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code, -EINVAL);
    EXPECT_TRUE(has(r.error().message, "range 9 of 16")) << r.error().message;
    EXPECT_TRUE(has(r.error().message, "nothing was registered")) << r.error().message;
    expect_none_registered();
}

// Fails while registering (the ranges before it are registered by then): they are taken out again.
TEST_F(BatchRegistration, ARangeOverlappingAnEarlierOneOfTheBatchLeavesNoneRegistered) {
    auto ranges = all();
    ranges[11] = {range(4) + 100, 64};
    auto r = target->register_memory_batch(ranges);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code, -EEXIST);
    EXPECT_TRUE(has(r.error().message, "range 11 of 16")) << r.error().message;
    EXPECT_TRUE(has(r.error().message, "(range 4 of this batch)")) << r.error().message;
    EXPECT_TRUE(has(r.error().message, "none of the 16 ranges stays registered")) << r.error().message;
    expect_none_registered();
}

TEST_F(BatchRegistration, ARangeOverlappingARegisteredRegionLeavesThatRegionAlone) {
    ASSERT_TRUE(target->register_memory(range(6), kSize));
    auto r = target->register_memory_batch(all());
    ASSERT_FALSE(r);
    EXPECT_TRUE(has(r.error().message, "range 6 of 16")) << r.error().message;
    EXPECT_FALSE(has(r.error().message, "of this batch")) << r.error().message;
    auto regions = initiator->segment_regions(seg);
    ASSERT_TRUE(regions);
    ASSERT_EQ(regions->size(), 1u);
    EXPECT_EQ((*regions)[0].addr, reinterpret_cast<uintptr_t>(range(6)));
    ASSERT_TRUE(read(6));
}

// Refused by the transports, not by the checks before them: no loaded transport moves CUDA memory.
TEST_F(BatchRegistration, ARangeNoTransportCanMoveLeavesNoneRegistered) {
    auto ranges = all();
    ranges[13].options = MemoryOptions{MemoryKind::Cuda, 0, kRemoteRead | kRemoteWrite};
    auto r = target->register_memory_batch(ranges);
    ASSERT_FALSE(r);
    EXPECT_TRUE(has(r.error().message, "range 13 of 16")) << r.error().message;
    expect_none_registered();
}

TEST_F(BatchRegistration, AnUnknownOrRepeatedAddressUnregistersNothing) {
    ASSERT_TRUE(target->register_memory_batch(all()));
    auto addrs = starts();
    auto bad = addrs;
    bad[5] = range(5) + 8;  // inside a region, not its start
    auto r = target->unregister_memory_batch(bad);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code, -ENOENT);
    EXPECT_TRUE(has(r.error().message, "address 5 of 16")) << r.error().message;
    EXPECT_TRUE(has(r.error().message, "nothing was unregistered")) << r.error().message;
    EXPECT_EQ(seen(), kRanges);
    bad = addrs;
    bad[12] = range(2);
    r = target->unregister_memory_batch(bad);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code, -EINVAL);
    EXPECT_TRUE(has(r.error().message, "addresses 2 and 12 of 16")) << r.error().message;
    EXPECT_EQ(seen(), kRanges);
    ASSERT_TRUE(read(12));
    ASSERT_TRUE(target->unregister_memory_batch(addrs));
    EXPECT_EQ(seen(), 0u);
}

TEST(BatchRegistrationCApi, AllOrNoneWithTheFailingRangeNamed) {
    const char *keys[] = {"plugins", "local_ip"};
    const char *values[] = {"tcp", "127.0.0.1"};
    ferry_engine_t *e = nullptr;
    ASSERT_EQ(ferry_engine_create(keys, values, 2, &e), 0) << ferry_last_error();
    std::vector<uint8_t> memory(8 * kSize);
    std::vector<ferry_memory_range_t> ranges(8);
    for (size_t i = 0; i < ranges.size(); ++i)
        ranges[i] = {
            memory.data() + i * kSize, kSize, FERRY_MEMORY_HOST, -1, FERRY_REMOTE_READ | FERRY_REMOTE_WRITE, 0};
    std::vector<void *> addrs;
    for (auto &r : ranges) addrs.push_back(r.addr);

    ranges[5].reserved = 1;
    EXPECT_EQ(ferry_register_batch(e, ranges.data(), ranges.size()), -EINVAL);
    EXPECT_TRUE(has(ferry_last_error(), "range 5 of 8")) << ferry_last_error();
    ranges[5].reserved = 0;
    ranges[6].length = 0;
    EXPECT_EQ(ferry_register_batch(e, ranges.data(), ranges.size()), -EINVAL);
    EXPECT_TRUE(has(ferry_last_error(), "range 6 of 8")) << ferry_last_error();
    ranges[6].length = kSize;
    ranges[7].addr = memory.data() + 2 * kSize + 16;  // overlaps range 2
    EXPECT_EQ(ferry_register_batch(e, ranges.data(), ranges.size()), -EEXIST);
    EXPECT_TRUE(has(ferry_last_error(), "range 7 of 8")) << ferry_last_error();
    EXPECT_TRUE(has(ferry_last_error(), "(range 2 of this batch)")) << ferry_last_error();
    EXPECT_EQ(ferry_unregister(e, addrs[0]), -ENOENT) << "range 0 stayed registered";
    ranges[7].addr = addrs[7];

    EXPECT_EQ(ferry_register_batch(e, ranges.data(), ranges.size()), 0) << ferry_last_error();
    EXPECT_EQ(ferry_register(e, addrs[4], kSize, FERRY_MEMORY_HOST, -1, FERRY_REMOTE_READ), -EEXIST);
    void *twice[] = {addrs[1], addrs[1]};
    EXPECT_EQ(ferry_unregister_batch(e, twice, 2), -EINVAL);
    EXPECT_EQ(ferry_unregister_batch(e, addrs.data(), addrs.size()), 0) << ferry_last_error();
    EXPECT_EQ(ferry_unregister_batch(e, addrs.data(), 1), -ENOENT);
    EXPECT_TRUE(has(ferry_last_error(), "address 0 of 1")) << ferry_last_error();
    EXPECT_EQ(ferry_register_batch(e, nullptr, 0), 0);
    EXPECT_EQ(ferry_register_batch(e, nullptr, 1), -EINVAL);
    EXPECT_EQ(ferry_unregister_batch(e, nullptr, 1), -EINVAL);
    EXPECT_EQ(ferry_register_batch(nullptr, ranges.data(), 1), -EINVAL);
    ferry_engine_destroy(e);
}
