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
    auto load_of = [&](uint16_t nic) {
        return in.nic_load != nullptr && nic < in.nic_load->size() ? (*in.nic_load)[nic] : RailLoad{};
    };
    // Candidates in rotation order, each with its index in local_nics (SIZE_MAX: another NIC).
    struct Candidate {
        uint16_t nic;
        size_t slot;
    };
    std::vector<Candidate> cands;
    const size_t nl = in.local_nics.size(), nr = in.remote_nics.size();
    for (size_t s = 0; s < nl; ++s) {
        size_t j = (in.rotation + s) % nl;
        if (load_of(in.local_nics[j]).usable) cands.push_back({in.local_nics[j], j});
    }
    for (size_t s = 0; cands.empty() && s < in.other_nics.size(); ++s) {
        uint16_t nic = in.other_nics[(in.rotation + s) % in.other_nics.size()];
        if (load_of(nic).usable) cands.push_back({nic, SIZE_MAX});
    }
    if (cands.empty())  // every NIC paused: the nearest are tried, the probe that finds one back
        for (size_t s = 0; s < nl; ++s)
            cands.push_back({in.local_nics[(in.rotation + s) % nl], (in.rotation + s) % nl});
    std::vector<RailLoad> loads;
    for (const auto &c : cands) {
        loads.push_back(load_of(c.nic));
        loads.back().usable = true;
    }
    std::vector<uint64_t> parts(cands.size(), 0);
    if (cands.size() > 1 && in.stripe_min > 0 && in.len >= 2 * in.stripe_min)
        parts = split_by_finish(loads, in.len,
                                {in.stripe_min, std::min<uint64_t>(cands.size(), in.len / in.stripe_min), kPage});
    else parts[earliest_finish(loads, in.len)] = in.len;
    uint64_t max_wr = in.max_wr_size == 0 ? UINT64_MAX : in.max_wr_size;
    uint64_t off = 0;
    size_t s = 0;  // stripes so far
    for (size_t k = 0; k < cands.size(); ++k) {
        if (parts[k] == 0) continue;
        const uint64_t stripe_end = off + parts[k];
        // Round robin put stripe s on local_nics[v % nl] and remote_nics[v % nr], v = rotation
        // + s: the remote NIC that shares its turn with the chosen local NIC keeps the pairing
        // (NIC j with NIC j on symmetric hosts).
        const size_t v = in.rotation + s;
        const size_t r = cands[k].slot == SIZE_MAX ? v % nr : (v - v % nl + cands[k].slot) % nr;
        const uint16_t lnic = cands[k].nic, rnic = in.remote_nics[r];
        while (off < stripe_end) {
            uint64_t la = in.local_addr + off, ra = in.remote_addr + off;
            size_t lc = chunk_index(*in.local_chunks, la), rc = chunk_index(*in.remote_chunks, ra);
            if (lc == SIZE_MAX || rc == SIZE_MAX)
                return {};  // the caller validated the ranges; an empty plan is its error
            const Span &l = (*in.local_chunks)[lc], &rs = (*in.remote_chunks)[rc];
            uint64_t n = stripe_end - off;
            n = std::min(n, l.addr + l.len - la);
            n = std::min(n, rs.addr + rs.len - ra);
            n = std::min(n, max_wr);
            out.push_back({la, ra, n, static_cast<uint32_t>(lc), static_cast<uint32_t>(rc), lnic, rnic});
            off += n;
        }
        ++s;
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
