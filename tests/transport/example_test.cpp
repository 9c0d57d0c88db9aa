// Tests of plugins/example/example.c beyond the conformance suite (transport_params.cpp runs the
// suite over it): the locking of the file plugin authors copy.
#include "harness.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <thread>

#ifdef FERRY_TEST_EXAMPLE_PLUGIN

namespace ferry_test {
namespace {

constexpr uint32_t kRW = FERRY_ACCESS_REMOTE_READ | FERRY_ACCESS_REMOTE_WRITE;

std::string example_path() {
    const char *e = std::getenv("FERRY_TEST_EXAMPLE_PLUGIN");
    return e != nullptr && *e != '\0' ? e : FERRY_TEST_EXAMPLE_PLUGIN;
}

// example.c read regions[handle].used before taking the lock that copies hold: two deregisters
// of one handle arriving while a copy ran both saw it used and both succeeded. Each round starts
// two deregisters while a 128 MiB copy into the same instance holds its lock; exactly one may
// succeed. (After the fix the outcome does not depend on timing; before it, both won whenever
// both arrived inside the copy.)
TEST(ExamplePlugin, ConcurrentDeregisterOfOneHandleSucceedsOnce) {
    Plugin plugin(example_path());
    ASSERT_TRUE(plugin.ok()) << plugin.error();
    Instance a(plugin, {}), b(plugin, {});
    ASSERT_EQ(a.create_rc(), 0) << a.last_error();
    ASSERT_EQ(b.create_rc(), 0) << b.last_error();
    const size_t sz = 128u << 20, probes = 16;
    Buffer src(sz), tgt(sz), small(4096);
    memset(src.data(), 0x5A, sz);
    uint64_t hs, ht, peer, rmem;
    ASSERT_EQ(a.register_mem(src.data(), sz, 0, &hs), 0) << a.last_error();
    ASSERT_EQ(b.register_mem(tgt.data(), sz, kRW, &ht), 0) << b.last_error();
    ASSERT_EQ(a.connect(b.endpoint(), &peer), 0) << a.last_error();
    ASSERT_EQ(a.import_mem(peer, tgt.addr(), sz, kRW, &rmem), 0) << a.last_error();
    for (int round = 0; round < 4; ++round) {
        SCOPED_TRACE("round " + std::to_string(round));
        memset(tgt.data(), 0, sz);
        uint64_t h = 0;
        ASSERT_EQ(b.register_mem(small.data(), small.size(), kRW, &h), 0) << b.last_error();
        std::thread copier([&] { a.submit(peer, {make_op(FERRY_OP_WRITE, src.addr(), hs, tgt.addr(), rmem, sz, 1)}); });
        // The copy runs (under b's lock) once any probe byte of the target has changed.
        auto started = [&] {
            for (size_t i = 0; i < probes; ++i)
                if (watch_byte(tgt.data() + i * (sz / probes) + sz / (2 * probes)) != 0) return true;
            return false;
        };
        auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        while (!started() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
        std::atomic<int> rc1{1}, rc2{1};
        std::thread d1([&] { rc1 = b.deregister_mem(h); });
        std::thread d2([&] { rc2 = b.deregister_mem(h); });
        d1.join();
        d2.join();
        copier.join();
        auto c = a.wait(1);
        ASSERT_EQ(c.size(), 1u);
        EXPECT_EQ(c[0].status, 0) << c[0].message;
        EXPECT_EQ((rc1 == 0) + (rc2 == 0), 1) << "deregister of one handle succeeded " << (rc1 == 0) + (rc2 == 0)
                                              << " times (rc " << rc1 << ", " << rc2 << ")";
        EXPECT_EQ(rc1 + rc2, -ENOENT) << "the losing deregister must fail -ENOENT";
    }
}

}  // namespace
}  // namespace ferry_test

#endif
