// Serving device memory (regions registered with a kind other than host, FERRY_CAP_STAGED_DEVICE)
// through the host's staging calls; no device address is ever dereferenced here.
// - READ_REQ: one out_ item per staging slice (the first carries the READ_RESP header, the
//   others continue its payload). Copies device -> buffer are started in order while the
//   connection's window (ferry_staged::kDefaultDepth buffers) has room; an item is sent once
//   its copy ended and goes back to the host when the kernel took its bytes. A request of fewer
//   slices than the window is sent all-or-nothing (its header waits for its last copy), so a
//   failed copy answers exactly that op with an ERROR; a longer one streams (as does the front
//   request when the host's bound cannot lend all its slices at once), and a copy failing after
//   its header left closes the connection (the peer's ops on it fail).
// - WRITE_REQ: the payload is received slice by slice into borrowed buffers, each copied to the
//   device once full; the WRITE_ACK (or ERROR, after the first failure the rest of the payload
//   is drained, not copied) is sent only after every copy ended.
// Copies end on host threads: the window's notify kicks this connection's reactor. A closed
// connection gives every buffer back (running copies: when they end) and its socket is closed
// only after the last copy ended, so the peer's EOF still means "nothing touches the memory".
#include "server.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace ferry_tcp {

namespace {
// Packed requests' parts start on this boundary of their shared buffer.
uint64_t align_part(uint64_t v) { return (v + 255) & ~uint64_t{255}; }
}  // namespace

ServerConn::FdCloser::~FdCloser() {
    if (fd >= 0) close(fd);
}

ferry_staged::StageWindow &ServerConn::window() {
    if (!window_) {
        Reactor *r = &reactor_;
        Handler *self = this;
        window_ = std::make_unique<ferry_staged::StageWindow>(ctx_.stager, ferry_staged::kDefaultDepth,
                                                              [r, self] { r->kick(self); });
        fd_keeper_ = std::make_shared<FdCloser>();
        fd_keeper_->fd = fd_;
    }
    return *window_;
}

bool ServerConn::stage_busy() const { return !staged_.empty() || !writes_.empty() || stage_wait_ || rx_ == Rx::Staged; }

size_t ServerConn::tx_count() const {
    if (staged_in_out_ == 0) return out_.size();
    size_t i = 0;
    while (i < out_.size() && out_[i].ready && !out_[i].dead) ++i;
    return i;
}

void ServerConn::make_error(Resp &r, int status, const std::string &msg) {
    Header h;
    h.type = kError;
    h.id = r.id;
    h.status = status;
    h.msg_len = static_cast<uint32_t>(std::min<size_t>(msg.size(), kMaxErrorMsg));
    r.msg = msg.substr(0, h.msg_len);
    r.data = reinterpret_cast<const uint8_t *>(r.msg.data());
    r.len = r.msg.size();
    r.head = true;
    r.group = 0;
    encode_header(h, r.hdr);
}

ferry_staged::SlicePtr ServerConn::stage_take(Region *r, uint64_t off, uint64_t len, int *code, std::string *why,
                                              bool *wait) {
    ferry_staged::SlicePtr s;
    *wait = false;
    auto got = window().acquire(r->kind, r->device_id, off, len, &s, code, why);
    if (got == ferry_staged::StageWindow::Got::Wait) {
        *wait = true;
        return nullptr;
    }
    if (got == ferry_staged::StageWindow::Got::Fail) return nullptr;
    // The slice's own reference: the region stays registered until no copy runs on it.
    r->refs.fetch_add(1);
    RegionTable *t = &ctx_.regions;
    s->on_release = [t, r, keep = fd_keeper_] { t->release(r); };
    return s;
}

void ServerConn::stage_release(Resp &r) {
    if (r.slice) {
        window_->release(r.slice);
        r.slice.reset();
    }
    if (r.staged) {
        r.staged = false;
        --staged_in_out_;
    }
}

bool ServerConn::stage_read(const Header &h, Region *r) {
    const uint64_t slice = ctx_.stager.slice_bytes();
    const uint64_t n = (h.length + slice - 1) / slice;
    const bool whole = n < window().depth();
    for (uint64_t i = 0; i < n; ++i) {
        const uint64_t off = i * slice;
        if (i == 0) {
            queue(kReadResp, h.id, 0, h.length);
        } else {
            out_.emplace_back();
            out_.back().id = h.id;
            out_.back().head = false;
            r->refs.fetch_add(1);  // every item holds the region until it is sent or skipped
        }
        Resp &it = out_.back();
        it.ref = r;
        it.len = std::min(slice, h.length - off);
        it.dev_addr = h.addr + off;
        it.dev_region = r;
        it.ready = false;
        it.staged = true;
        it.in_staged = true;
        it.group = i == 0 && whole ? static_cast<uint32_t>(n) : 0;
        staged_.push_back(&it);
        ++staged_in_out_;
    }
    if (!stage_hold_) stage_progress();
    return !closed_;
}

// READs of one region small enough to pack, queued one after another from feed_ on, share one
// buffer: one host copy out of the device for all of them (stage_copy_parts), each part on a
// 256-byte boundary. Each request is still answered on its own, and a failed copy fails exactly
// the requests of its buffer, each with an ERROR (none of them was sent). True when it started
// such a copy or must wait for a buffer; false when the item at feed_ goes alone.
bool ServerConn::stage_feed_pack() {
    const uint64_t slice = ctx_.stager.slice_bytes();
    const uint64_t max_op = stage_pack_max();
    if (max_op == 0) return false;
    ferry_staged::StageWindow &w = *window_;
    auto packable = [&](const Resp *x, const Region *r) {
        return x->head && !x->dead && !x->ready && !x->slice && x->group == 1 && x->len <= max_op && x->dev_region == r;
    };
    Resp *first = staged_[feed_];
    if (!packable(first, first->dev_region)) return false;
    std::vector<ferry_stage_part_t> parts;
    uint64_t end = 0;
    for (size_t i = feed_; i < staged_.size() && packable(staged_[i], first->dev_region); ++i) {
        const uint64_t at = align_part(end);
        if (at + staged_[i]->len > slice) break;
        parts.push_back({staged_[i]->dev_addr, at, staged_[i]->len});
        end = at + staged_[i]->len;
    }
    if (parts.size() < 2) return false;
    int code = 0;
    bool wait = false;
    std::string why;
    ferry_staged::SlicePtr s = stage_take(first->dev_region, first->dev_addr, end, &code, &why, &wait);
    if (wait) return true;
    if (s) {
        code = w.copy_parts(s, parts.data(), parts.size(), false, &why);
        if (code == 0) {
            w.share(s, static_cast<unsigned>(parts.size()));
            for (const ferry_stage_part_t &p : parts) {
                Resp *it = staged_[feed_++];
                it->data = static_cast<const uint8_t *>(s->buf()) + p.buf_offset;
                it->slice = s;
            }
            return true;
        }
        w.release(s);
    }
    for (size_t i = 0; i < parts.size(); ++i) stage_fail_read(staged_[feed_ + i], code, why);
    return true;
}

void ServerConn::stage_write(const Header &h, Region *r) {
    cur_ref_ = r;  // while the payload is received; every slice holds its own reference
    rx_dev_ = h.addr;
    rx_ = Rx::Staged;
    rx_slice_.reset();
    queue(kWriteAck, h.id, 0, 0);
    Resp &ack = out_.back();
    ack.ready = false;
    ack.staged = true;
    ++staged_in_out_;
    StagedWrite w;
    w.ack = &ack;
    writes_.push_back(std::move(w));
    window();
}

uint64_t ServerConn::stage_pack_max() const {
    if (!window_ || !window_->parts_offered()) return 0;
    return std::min<uint64_t>(ctx_.cfg.staged_pack_max_bytes, ctx_.stager.slice_bytes() / 4);
}

bool ServerConn::stage_rx_slice() {
    StagedWrite &w = writes_.back();
    const uint64_t slice = ctx_.stager.slice_bytes();
    const uint64_t max_op = stage_pack_max();
    const bool small = max_op > 0 && cur_.length <= max_op && left_ == cur_.length;
    if (pack_ && (!small || pack_region_ != cur_ref_ || align_part(pack_end_) + cur_.length > slice)) {
        stage_flush_pack();
        if (closed_) return false;
    }
    if (!pack_) {
        int code = 0;
        bool wait = false;
        std::string why;
        const uint64_t len = small ? slice : std::min<uint64_t>(slice, left_);
        ferry_staged::SlicePtr s = stage_take(cur_ref_, rx_dev_, len, &code, &why, &wait);
        stage_wait_ = wait;
        if (wait) return false;
        if (!s) {  // the rest of the payload is drained; the ERROR goes out once started copies ended
            w.status = code;
            w.why = why;
            ctx_.peer_log.log(FERRY_LOG_WARN, "request from %s: %s", name_.c_str(), why.c_str());
            return true;
        }
        if (!small) {
            rx_slice_ = std::move(s);
            rx_base_ = static_cast<uint8_t *>(rx_slice_->buf());
            rx_len_ = rx_slice_->length();
            rx_slice_got_ = 0;
            return true;
        }
        pack_ = std::move(s);
        pack_region_ = cur_ref_;
        pack_end_ = 0;
    }
    // This request's part of the open pack.
    const uint64_t off = align_part(pack_end_);
    pack_parts_.push_back({rx_dev_, off, cur_.length});
    pack_end_ = off + cur_.length;
    rx_slice_ = pack_;
    rx_in_pack_ = true;
    rx_base_ = static_cast<uint8_t *>(pack_->buf()) + off;
    rx_len_ = cur_.length;
    rx_slice_got_ = 0;
    return true;
}

void ServerConn::stage_rx_filled() {
    ferry_staged::SlicePtr s = std::move(rx_slice_);
    rx_slice_.reset();
    StagedWrite &w = writes_.back();
    if (rx_in_pack_) {  // copied with the rest of the pack (stage_flush_pack)
        rx_in_pack_ = false;
        rx_dev_ += rx_len_;
        w.slices.push_back(std::move(s));
        pack_writes_.push_back(&w);
        return;
    }
    rx_dev_ += s->length();
    if (w.status != 0) {  // an earlier slice's copy failed: nothing more is written
        window_->release(s);
        return;
    }
    std::string why;
    int rc = window_->copy(s, s->offset(), true, &why);
    if (rc != 0) {
        window_->release(s);
        w.status = rc;
        w.why = why;
        return;
    }
    w.slices.push_back(std::move(s));
}

// The WRITEs packed so far: one host copy of all their parts into the device; each is
// acknowledged once it ended (stage_progress), or refused with its failure.
void ServerConn::stage_flush_pack() {
    ferry_staged::SlicePtr s = std::move(pack_);
    pack_.reset();
    std::vector<ferry_stage_part_t> parts = std::move(pack_parts_);
    std::vector<StagedWrite *> writes = std::move(pack_writes_);
    pack_parts_.clear();
    pack_writes_.clear();
    pack_region_ = nullptr;
    pack_end_ = 0;
    if (!s) return;
    std::string why;
    int rc = writes.empty() ? -ECANCELED : window_->copy_parts(s, parts.data(), parts.size(), true, &why);
    if (rc == 0) {
        window_->share(s, static_cast<unsigned>(writes.size()));
        return;
    }
    for (StagedWrite *w : writes) {
        w->slices.erase(std::remove(w->slices.begin(), w->slices.end(), s), w->slices.end());
        w->status = rc;
        w->why = why;
    }
    window_->release(s);
    reactor_.kick(this);  // their ERRORs go out from the next progress step, not from inside this one
}

void ServerConn::stage_rx_done() {
    if (rx_slice_) {  // not reached: a slice never outgrows the payload
        window_->release(rx_slice_);
        rx_slice_.reset();
    }
    writes_.back().received = true;
    ctx_.regions.release(cur_ref_);
    cur_ref_ = nullptr;
    stage_progress();
}

void ServerConn::stage_pop() {
    staged_.front()->in_staged = false;
    staged_.pop_front();
    if (feed_ > 0) --feed_;
}

// Nothing of the request was sent yet: its head becomes an ERROR, its other items are skipped.
void ServerConn::stage_fail_read(Resp *head, int code, const std::string &why) {
    auto pos = std::find(staged_.begin(), staged_.end(), head);
    for (auto p = pos == staged_.end() ? pos : pos + 1; p != staged_.end() && !(*p)->head; ++p) {
        (*p)->dead = true;
        if ((*p)->slice) {
            window_->release((*p)->slice);
            (*p)->slice.reset();
        }
    }
    if (head->slice) {
        window_->release(head->slice);
        head->slice.reset();
    }
    const std::string msg = strprintf(
        "tcp: READ of %llu bytes of %s device memory at 0x%llx failed: %s", static_cast<unsigned long long>(head->len),
        ferry_staged::kind_name(head->dev_region->kind), static_cast<unsigned long long>(head->dev_addr), why.c_str());
    make_error(*head, code < 0 ? code : -EIO, msg);
    head->ready = true;
    ctx_.peer_log.log(FERRY_LOG_WARN, "request from %s: %s", name_.c_str(), msg.c_str());
}

void ServerConn::stage_progress() {
    if (closed_ || !window_) return;
    stage_wait_ = false;  // receiving asks again
    ferry_staged::StageWindow &w = *window_;
    // 1. WRITE slices whose copy ended go back at once; the first failure decides the answer.
    for (StagedWrite &sw : writes_) {
        size_t k = 0;
        while (k < sw.slices.size() && sw.slices[k]->copied()) {
            if (sw.slices[k]->status() != 0 && sw.status == 0) {
                sw.status = sw.slices[k]->status();
                sw.why = "tcp: staging copy into device memory failed: " + sw.slices[k]->message();
            }
            w.release(sw.slices[k]);
            ++k;
        }
        sw.slices.erase(sw.slices.begin(), sw.slices.begin() + static_cast<ptrdiff_t>(k));
    }
    while (!writes_.empty() && writes_.front().received && writes_.front().slices.empty()) {
        StagedWrite &sw = writes_.front();
        if (sw.status != 0) make_error(*sw.ack, sw.status, sw.why);
        sw.ack->ready = true;
        writes_.pop_front();
    }
    // 2. READ items: copies out of the device, in order, while the window has room.
    while (feed_ < staged_.size()) {
        Resp *it = staged_[feed_];
        if (it->dead || it->ready || it->slice) {
            ++feed_;
            continue;
        }
        const size_t was = feed_;
        if (stage_feed_pack()) {
            if (closed_) return;
            if (feed_ == was && !staged_[feed_]->ready) break;  // waits for a buffer
            continue;
        }
        int code = 0;
        bool wait = false;
        std::string why;
        ferry_staged::SlicePtr s = stage_take(it->dev_region, it->dev_addr, it->len, &code, &why, &wait);
        if (wait) {
            // The front request waits for all its slices, but the bound (or the window) cannot
            // lend them all while it holds some: stream it instead, or it would wait forever.
            Resp *front = staged_.front();
            if (front->group > 0 && feed_ < front->group) front->group = 0;
            break;
        }
        if (s) {
            code = w.copy(s, it->dev_addr, false, &why);
            if (code == 0) {
                it->data = static_cast<const uint8_t *>(s->buf());
                it->slice = std::move(s);
                ++feed_;
                continue;
            }
            w.release(s);
        }
        if (!it->head) {
            close_conn(FERRY_LOG_WARN, "staging in the middle of a READ response failed: " + why);
            return;
        }
        stage_fail_read(it, code, why);
    }
    // 3. Items whose copies ended are sent, in order.
    while (!staged_.empty()) {
        Resp *it = staged_.front();
        if (it->dead || it->ready) {
            stage_pop();
            continue;
        }
        if (!it->slice) break;
        if (it->group > 0) {
            if (staged_.size() < it->group) break;
            bool all = true;
            int bad = 0;
            std::string msg;
            for (uint32_t i = 0; i < it->group && all; ++i) {
                Resp *x = staged_[i];
                all = x->slice && x->slice->copied();
                if (all && bad == 0 && x->slice->status() != 0) {
                    bad = x->slice->status();
                    msg = "staging copy out of device memory failed: " + x->slice->message();
                }
            }
            if (!all) break;
            if (bad != 0) {
                stage_fail_read(it, bad, msg);
                continue;
            }
            const uint32_t n = it->group;
            for (uint32_t i = 0; i < n; ++i) {
                staged_.front()->ready = true;
                stage_pop();
            }
            continue;
        }
        if (!it->slice->copied()) break;
        if (it->slice->status() != 0) {
            std::string msg = "staging copy out of device memory failed: " + it->slice->message();
            if (!it->head) {
                close_conn(FERRY_LOG_WARN, "in the middle of a READ response: " + msg);
                return;
            }
            stage_fail_read(it, it->slice->status(), msg);
            continue;
        }
        it->ready = true;
        stage_pop();
    }
}

void ServerConn::on_kick() {
    if (closed_) return;
    last_progress_ = Clock::now();
    stage_progress();
    progress();
}

void ServerConn::stage_teardown() {
    if (!window_) return;
    window_->detach();
    for (Resp &r : out_)
        if (r.slice) window_->release(r.slice);
    for (StagedWrite &sw : writes_)
        for (auto &s : sw.slices) window_->release(s);
    if (rx_slice_) window_->release(rx_slice_);
    if (pack_) window_->release(pack_);  // not copied yet: one release gives it back
    pack_.reset();
    pack_parts_.clear();
    pack_writes_.clear();
    staged_.clear();
    writes_.clear();
    rx_slice_.reset();
    window_.reset();
}

}  // namespace ferry_tcp
