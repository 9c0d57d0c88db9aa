// Notifications: sending over the control channel, taking (at once, blocking, or through a
// pollable descriptor), and the notification a batch sends once all its ops succeeded.
#include <cerrno>

#include "control/control_protocol.hpp"
#include "engine/engine_impl.hpp"
#include "util/log.hpp"

namespace ferry {

namespace {

Result<void> check_size(const char *what, size_t size) {
    if (size <= kMaxNotificationBytes) return {};
    return fail(-EMSGSIZE, cat(what, ": ", size, " bytes exceed the limit of ", kMaxNotificationBytes,
                               " bytes; send larger data with a WRITE and notify after it"));
}

Result<std::string> control_address(RemoteSegment &seg, const char *what) {
    std::lock_guard lock(seg.mutex);
    if (seg.storage)
        return fail(-EOPNOTSUPP, cat(what, ": segment ", seg.name,
                                     " is a file (a storage segment): there is no engine to notify; use submit"));
    if (!seg.descriptor.control.empty()) return seg.descriptor.control;
    return fail(-EPROTONOSUPPORT, cat(what, ": segment ", seg.name,
                                      " publishes no control address (its engine runs an older Ferry); upgrade it"));
}

}  // namespace

Result<void> Engine::send_notification(SegmentId id, std::span<const uint8_t> message) {
    if (auto r = check_size("send_notification", message.size()); !r) return r;
    auto seg = impl_->segment(id);
    if (!seg) return fail(-ENOENT, cat("send_notification: segment id ", id, " is not open; open_segment it first"));
    return impl_->send_notification(*seg, message);
}

// Returns once the receiving engine queued the message (or refused it).
Result<void> Engine::Impl::send_notification(RemoteSegment &seg, std::span<const uint8_t> message) {
    auto address = control_address(seg, "send_notification");
    if (!address) return std::unexpected(address.error());
    auto deadline = Clock::now() + settings.metadata.timeout;
    auto label = cat("segment '", seg.name, "'");
    std::lock_guard lock(seg.control_mutex);
    if (seg.control && (seg.control->address() != *address || seg.control->broken())) seg.control.reset();
    auto connect = [&]() -> Result<void> {
        auto client = ControlClient::connect(*address, label, segment_name, settings.auth.secret, deadline);
        if (!client && client.error().code != -EACCES && client.error().code != -EUSERS) {
            // The peer may have restarted elsewhere: re-read its descriptor once and retry.
            std::string moved;
            if (refresh_segment(seg)) {
                std::lock_guard seg_lock(seg.mutex);
                moved = seg.descriptor.control;
            }
            if (!moved.empty() && moved != *address) {
                *address = std::move(moved);
                client = ControlClient::connect(*address, label, segment_name, settings.auth.secret, deadline);
            }
        }
        if (!client) return fail(client.error().code, "send_notification: " + client.error().message);
        seg.control.emplace(std::move(*client));
        return {};
    };
    const bool reused = seg.control.has_value();
    if (!reused)
        if (auto c = connect(); !c) return c;
    auto reply = seg.control->call(control::kNotify, message, deadline);
    // A kept connection the server closed as idle just as we sent (EOF or reset before any
    // reply) never delivered the request: the server closes only connections with nothing
    // unread. Otherwise not retried after the request left: the peer may have queued it, and
    // a duplicate is worse than a reported failure.
    if (!reply && reused && (reply.error().code == -ECONNRESET || reply.error().code == -EPIPE)) {
        seg.control.reset();
        if (auto c = connect(); !c) return c;
        reply = seg.control->call(control::kNotify, message, deadline);
    }
    if (!reply) {
        if (reply.error().code != -ENOBUFS) seg.control.reset();
        return fail(reply.error().code, "send_notification: " + reply.error().message);
    }
    return {};
}

std::vector<Notification> Engine::take_notifications() { return impl_->control->take_notifications(); }

Result<std::vector<Notification>> Engine::wait_notifications(std::chrono::milliseconds timeout) {
    // Beyond a year is forever (and now + INT64_MAX ms would overflow the clock).
    auto forever = timeout.count() < 0 || timeout > std::chrono::hours(24 * 365);
    auto got = impl_->control->wait_notifications(forever ? Clock::time_point::max() : Clock::now() + timeout);
    if (!got) return got;
    if (got->empty())
        return fail(kWaitPending, cat("wait_notifications: none arrived within ", timeout.count(), " ms"));
    return got;
}

int Engine::notification_fd() const { return impl_->control->notification_fd(); }

Result<BatchId> Engine::submit_with_notification(std::span<const Request> requests, SegmentId target,
                                                 std::span<const uint8_t> message) {
    if (auto r = check_size("submit_with_notification", message.size()); !r) return std::unexpected(r.error());
    auto seg = impl_->segment(target);
    if (!seg)
        return fail(-ENOENT, cat("submit_with_notification: segment id ", target,
                                 " (the notification's target) is not open; open_segment it first"));
    if (auto a = control_address(*seg, "submit_with_notification"); !a) return std::unexpected(a.error());
    auto n = std::make_unique<PendingNotification>();
    n->segment = std::move(seg);
    n->message.assign(message.begin(), message.end());
    return impl_->submit(requests, std::move(n));
}

// Called by the completion of a batch's last op, on whichever thread drives progress: never
// blocks on the network.
void Engine::Impl::batch_ops_finished(Batch &batch) {
    auto &n = *batch.notification;
    for (size_t i = 0; i < batch.size; ++i)
        if (batch.ops[i].state.load(std::memory_order_acquire) != static_cast<uint32_t>(OpState::Done)) {
            n.code = -ECANCELED;
            n.error = "an op failed, so it was not sent";
            release_share(batch);
            return;
        }
    {
        std::lock_guard lock(notifier_mutex);
        if (!notifier_stopped) {
            if (!notifier.joinable()) notifier = std::thread([this] { notifier_loop(); });
            notifier_queue.push_back(&batch);
            notifier_cv.notify_one();
            return;
        }
    }
    n.code = -ECANCELED;
    n.error = "the engine is being destroyed";
    release_share(batch);
}

// One thread sends them in completion order; a batch stays in `batches` (its notification
// share keeps free_batch refusing) until its entry here is done.
void Engine::Impl::notifier_loop() {
    std::unique_lock lock(notifier_mutex);
    for (;;) {
        notifier_cv.wait(lock, [&] { return notifier_stopped || !notifier_queue.empty(); });
        if (notifier_stopped) return;
        Batch *batch = notifier_queue.front();
        notifier_queue.pop_front();
        lock.unlock();
        auto &n = *batch->notification;
        if (auto r = send_notification(*n.segment, n.message); !r) {
            n.code = r.error().code;
            n.error = r.error().message;
            FERRY_WARN("batch ", batch->id, ": its notification to segment ", n.segment->name,
                       " was not delivered: ", n.error);
        }
        release_share(*batch);
        lock.lock();
    }
}

void Engine::Impl::stop_notifier() {
    std::deque<Batch *> dropped;
    {
        std::lock_guard lock(notifier_mutex);
        notifier_stopped = true;
        dropped.swap(notifier_queue);
        notifier_cv.notify_all();
    }
    if (notifier.joinable()) notifier.join();
    for (Batch *b : dropped) {
        b->notification->code = -ECANCELED;
        b->notification->error = "the engine is being destroyed";
        release_share(*b);
    }
}

}  // namespace ferry
