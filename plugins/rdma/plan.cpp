#include "plan.hpp"

#include <algorithm>

namespace ferry_rdma {

namespace {
constexpr uint64_t kPage = 4096;
}

uint64_t effective_mr_limit(uint64_t device_max, uint64_t option) {
    uint64_t limit = device_max == 0 ? UINT64_MAX : device_max;
    if (option != 0 && option < limit) limit = option;
    limit &= ~(kPage - 1);
    return limit == 0 ? kPage : limit;
}

std::vector<Span> plan_mr_chunks(uint64_t addr, uint64_t len, uint64_t limit) {
    std::vector<Span> out;
    if (len == 0 || limit == 0) return out;
    for (uint64_t off = 0; off < len;) {
        uint64_t n = std::min(limit, len - off);
        out.push_back({addr + off, n});
        off += n;
    }
    return out;
}

size_t chunk_index(const std::vector<Span> &chunks, uint64_t addr) {
    auto it =
        std::upper_bound(chunks.begin(), chunks.end(), addr, [](uint64_t a, const Span &s) { return a < s.addr; });
    if (it == chunks.begin()) return SIZE_MAX;
    --it;
    if (addr - it->addr >= it->len) return SIZE_MAX;
    return static_cast<size_t>(it - chunks.begin());
}

std::vector<WrPiece> plan_work_requests(const WrPlanInput &in) {
    std::vector<WrPiece> out;
    if (in.len == 0 || in.local_nics.empty() || in.remote_nics.empty() || in.local_chunks == nullptr ||
        in.remote_chunks == nullptr)
        return out;
    uint64_t stripes = 1;
    if (in.local_nics.size() > 1 && in.stripe_min > 0 && in.len >= 2 * in.stripe_min)
        stripes = std::min<uint64_t>(in.local_nics.size(), in.len / in.stripe_min);
    // Stripe size rounded up to whole pages so stripes start page aligned when the op does.
    uint64_t stripe = (in.len + stripes - 1) / stripes;
    if (stripes > 1) stripe = (stripe + kPage - 1) & ~(kPage - 1);
    uint64_t max_wr = in.max_wr_size == 0 ? UINT64_MAX : in.max_wr_size;
    for (uint64_t s = 0, off = 0; off < in.len; ++s) {
        uint64_t stripe_end = std::min(in.len, off + stripe);
        uint16_t lnic = in.local_nics[(in.rotation + s) % in.local_nics.size()];
        uint16_t rnic = in.remote_nics[(in.rotation + s) % in.remote_nics.size()];
        while (off < stripe_end) {
            uint64_t la = in.local_addr + off, ra = in.remote_addr + off;
            size_t lc = chunk_index(*in.local_chunks, la), rc = chunk_index(*in.remote_chunks, ra);
            if (lc == SIZE_MAX || rc == SIZE_MAX)
                return {};  // the caller validated the ranges; an empty plan is its error
            const Span &l = (*in.local_chunks)[lc], &r = (*in.remote_chunks)[rc];
            uint64_t n = stripe_end - off;
            n = std::min(n, l.addr + l.len - la);
            n = std::min(n, r.addr + r.len - ra);
            n = std::min(n, max_wr);
            out.push_back({la, ra, n, static_cast<uint32_t>(lc), static_cast<uint32_t>(rc), lnic, rnic});
            off += n;
        }
    }
    return out;
}

SendWindow::SendWindow(uint32_t depth, uint32_t interval)
    : depth_(std::max<uint32_t>(depth, 2)),
      interval_(std::clamp<uint32_t>(interval, 1, std::max<uint32_t>(depth_ / 2, 1))) {}

bool SendWindow::must_signal(bool last_of_op) const {
    if (last_of_op || run_ + 1 >= interval_) return true;
    // Without a signalled request in flight nothing would ever free the queue.
    return posted_.size() + 1 >= depth_;
}

uint64_t SendWindow::post(bool signalled) {
    uint64_t seq = next_++;
    posted_.push_back({seq, signalled});
    run_ = signalled ? 0 : run_ + 1;
    return seq;
}

uint32_t SendWindow::complete(uint64_t seq) {
    bool known = false;
    for (const auto &p : posted_)
        if (p.seq == seq) {
            known = p.signalled;
            break;
        }
    if (!known) return 0;
    uint32_t n = 0;
    while (!posted_.empty() && posted_.front().seq <= seq) {
        posted_.pop_front();
        ++n;
    }
    return n;
}

bool SendWindow::fail(uint64_t seq, uint32_t *before) {
    bool known = false;
    for (const auto &p : posted_)
        if (p.seq == seq) known = true;
    if (!known) return false;
    uint32_t n = 0;
    while (posted_.front().seq < seq) {
        posted_.pop_front();
        ++n;
    }
    posted_.pop_front();
    *before = n;
    return true;
}

void SendWindow::rollback(uint32_t n) {
    while (n-- > 0 && !posted_.empty()) {
        posted_.pop_back();
        --next_;
    }
    run_ = 0;
    for (auto it = posted_.rbegin(); it != posted_.rend() && !it->signalled; ++it) ++run_;
}

std::vector<uint64_t> SendWindow::drain() {
    std::vector<uint64_t> out;
    for (const auto &p : posted_) out.push_back(p.seq);
    posted_.clear();
    run_ = 0;
    return out;
}

}  // namespace ferry_rdma
