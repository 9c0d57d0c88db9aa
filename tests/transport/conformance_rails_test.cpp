// Conformance of rail_stats (plugin ABI 1.5, optional): a transport that offers it reports its
// local rails under the capacity convention, with names that are text and unique, and counts on
// them exactly the bytes its initiator moved, nothing left queued once every op completed.
#include "conformance.hpp"

#include <cerrno>
#include <cstring>
#include <iostream>
#include <set>

namespace ferry_test {

namespace {
constexpr uint32_t kRW = FERRY_ACCESS_REMOTE_READ | FERRY_ACCESS_REMOTE_WRITE;
constexpr uint64_t kMiB = 1ull << 20;
}  // namespace

TEST_P(TransportConformance, RailStatsWhereOfferedCountWhatMoved) {
    const ferry_plugin_v1_t *api = plugin_->api();
    if (api->struct_size < FERRY_PLUGIN_V1_SIZE_UNTIL(rail_stats) || api->rail_stats == nullptr) {
        std::cout << GetParam().name << " has no rail_stats (optional): nothing to check\n";
        return;
    }
    auto a = make();
    auto b = make();
    ASSERT_TRUE(a && b);
    auto rails = [&](Instance &i) {
        size_t n = 0;
        ferry_error_t err{};
        int rc = api->rail_stats(i.t(), nullptr, &n, &err);
        EXPECT_TRUE(rc == 0 || (rc == -ENOSPC && n > 0)) << rc << " " << err.message;
        std::vector<ferry_rail_stats_t> out(n + 1);
        size_t got = out.size();
        EXPECT_EQ(api->rail_stats(i.t(), out.data(), &got, &err), 0) << err.message;
        EXPECT_EQ(got, n) << "the count -ENOSPC asked for";
        out.resize(std::min(got, out.size()));
        return out;
    };
    const uint64_t write_len = 3 * kMiB + 7, read_len = kMiB + 1;
    Buffer src(4 * kMiB), tgt(4 * kMiB);
    uint64_t hs, ht, peer, rmem;
    ASSERT_EQ(a->register_mem(src.data(), 4 * kMiB, 0, &hs), 0) << a->last_error();
    ASSERT_EQ(b->register_mem(tgt.data(), 4 * kMiB, kRW, &ht), 0) << b->last_error();
    ASSERT_NO_FATAL_FAILURE(connect_import(*a, b->endpoint(), tgt.addr(), 4 * kMiB, kRW, &peer, &rmem));
    fill_pattern(src.data(), write_len, 9);
    ASSERT_EQ(a->submit(peer, {make_op(FERRY_OP_WRITE, src.addr(), hs, tgt.addr(), rmem, write_len, 1)}), 0)
        << a->last_error();
    ASSERT_NO_FATAL_FAILURE(expect_all_ok(a->wait(1), 1));
    ASSERT_EQ(a->submit(peer, {make_op(FERRY_OP_READ, src.addr(), hs, tgt.addr(), rmem, read_len, 2)}), 0)
        << a->last_error();
    ASSERT_NO_FATAL_FAILURE(expect_all_ok(a->wait(1), 1));

    const auto report = rails(*a);
    ASSERT_FALSE(report.empty()) << "an initiator that moved bytes has a rail";
    uint64_t read = 0, written = 0;
    std::set<std::string> names;
    for (const auto &r : report) {
        const size_t len = strnlen(r.name, sizeof r.name);
        ASSERT_LT(len, sizeof r.name) << "name not NUL-terminated";
        EXPECT_GT(len, 0u) << "a rail without a name";
        EXPECT_TRUE(names.insert(r.name).second) << r.name << " twice";
        for (uint64_t z : r.reserved) EXPECT_EQ(z, 0u) << r.name;
        EXPECT_EQ(r.queued_bytes, 0u) << r.name << ": every op completed";
        EXPECT_EQ(r.paused_peers, 0u) << r.name;
        if (r.read_bytes + r.write_bytes > 0) EXPECT_GT(r.completed, 0u) << r.name << ": bytes but no piece completed";
        read += r.read_bytes;
        written += r.write_bytes;
    }
    EXPECT_EQ(written, write_len) << "each byte written counts once, on the rail that carried it";
    EXPECT_EQ(read, read_len);
}

}  // namespace ferry_test
