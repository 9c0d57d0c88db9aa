// Registration at scale over tcp.so between two engines of this process: registering is not
// quadratic in the regions already registered, and a peer still sees every region registered
// before it fetched the descriptor (P2PHANDSHAKE serves it on request, not on every change).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>

#include "ferry/engine.hpp"

using namespace ferry;

namespace {

std::unique_ptr<Engine> make() {
    auto e = Engine::create({{"plugins", "tcp"}, {"local_ip", "127.0.0.1"}});
    EXPECT_TRUE(e) << e.error().message;
    return e ? std::move(*e) : nullptr;
}

Result<void> run(Engine &e, const std::vector<Request> &reqs) {
    auto b = e.submit(reqs);
    if (!b) return std::unexpected(b.error());
    auto w = e.wait(*b, std::chrono::seconds(30));
    (void)e.free_batch(*b);
    return w;
}

}  // namespace

// 50k regions: the quadratic republish took ~2 min for this (10k: 5.5 s); linear work is well
// under a second. The deadline is 20x that, for a loaded 2-core CI machine.
TEST(Registration, ManyRegionsRegisterInLinearTimeAndPeersSeeAllOfThem) {
    auto target = make(), initiator = make();
    ASSERT_TRUE(target && initiator);
    constexpr size_t kRegions = 50000, kSize = 64;
    std::vector<uint8_t> remote(kRegions * kSize), local(4096);
    for (size_t i = 0; i < remote.size(); ++i) remote[i] = static_cast<uint8_t>(i * 13 + 1);
    ASSERT_TRUE(initiator->register_memory(local.data(), local.size()));
    auto start = std::chrono::steady_clock::now();
    for (size_t i = 0; i < kRegions; ++i) {
        auto r = target->register_memory(remote.data() + i * kSize, kSize);
        ASSERT_TRUE(r) << i << ": " << r.error().message;
    }
    auto took = std::chrono::steady_clock::now() - start;
    EXPECT_LT(took, std::chrono::seconds(20))
        << "registering " << kRegions << " regions took " << std::chrono::duration<double>(took).count() << " s";

    auto seg = initiator->open_segment(target->segment_name());
    ASSERT_TRUE(seg) << seg.error().message;
    auto regions = initiator->segment_regions(*seg);
    ASSERT_TRUE(regions) << regions.error().message;
    ASSERT_EQ(regions->size(), kRegions);
    EXPECT_EQ((*regions)[kRegions - 1].addr, reinterpret_cast<uintptr_t>(remote.data()) + (kRegions - 1) * kSize);

    // The first, a middle and the last region carry bytes.
    for (size_t i : {size_t{0}, kRegions / 2, kRegions - 1}) {
        uint64_t addr = reinterpret_cast<uintptr_t>(remote.data()) + i * kSize;
        ASSERT_TRUE(run(*initiator, {{Opcode::Read, local.data(), *seg, addr, kSize, ""}}));
        EXPECT_EQ(memcmp(local.data(), remote.data() + i * kSize, kSize), 0) << "region " << i;
    }
}

// Registered after the peer fetched the descriptor: the peer's next op re-fetches and finds it;
// unregistered: refused. What the on-demand descriptor must keep from the eager one.
TEST(Registration, ARegionRegisteredAfterTheFetchIsFoundAndAnUnregisteredOneIsRefused) {
    auto target = make(), initiator = make();
    ASSERT_TRUE(target && initiator);
    std::vector<uint8_t> first(4096, 1), later(4096, 7), local(4096, 0);
    ASSERT_TRUE(target->register_memory(first.data(), first.size()));
    ASSERT_TRUE(initiator->register_memory(local.data(), local.size()));
    auto seg = initiator->open_segment(target->segment_name());
    ASSERT_TRUE(seg) << seg.error().message;
    ASSERT_TRUE(target->register_memory(later.data(), later.size()));
    uint64_t addr = reinterpret_cast<uintptr_t>(later.data());
    auto r = run(*initiator, {{Opcode::Read, local.data(), *seg, addr, later.size(), ""}});
    ASSERT_TRUE(r) << r.error().message;
    EXPECT_EQ(local[100], 7);
    auto regions = initiator->segment_regions(*seg);
    ASSERT_TRUE(regions);
    EXPECT_EQ(regions->size(), 2u);

    ASSERT_TRUE(target->unregister_memory(later.data()));
    regions = initiator->segment_regions(*seg);  // re-reads the descriptor
    ASSERT_TRUE(regions);
    ASSERT_EQ(regions->size(), 1u);
    EXPECT_EQ((*regions)[0].addr, reinterpret_cast<uintptr_t>(first.data()));
}
