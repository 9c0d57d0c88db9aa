// When copies on the GPU IPC transport end: the completion thread waits on the runs' events in
// submission order, poll() takes the runs already finished itself, and each run's ops are
// reported together.
#include "ipc_transport.hpp"

namespace ferry_gpu {

void IpcTransport::completion_loop() {
    for (;;) {
        Event event;
        uint64_t seq = 0;
        {
            std::unique_lock lock(pending_mu_);
            for (;;) {
                pending_cv_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
                if (pending_.empty()) return;  // stopping with nothing left
                // Within the poll window the host's poll() reports finished runs itself, sooner:
                // standing back until it ends spares the lock both would take for every run and
                // a core spinning on the head's event (H100, 64 KiB x 256 block transfers).
                if (stopping_ || poll_window_.count() == 0 || Clock::now() >= poll_until_) break;
                pending_cv_.wait_until(lock, poll_until_);
            }
            event = pending_.front().event;
            seq = pending_.front().seq;
        }
        // Even when stopping: the copies are on the GPU already, and their memory must outlive them.
        std::string e;
        int rc = rt_->event_wait(event, e);
        Pending done;
        {
            std::lock_guard lock(pending_mu_);
            // poll() reported this run meanwhile (its event may even be in use again): next one.
            if (pending_.empty() || pending_.front().seq != seq) continue;
            done = std::move(pending_.front());
            pending_.pop_front();
            recycle_locked(done);
            settle_group(done, rc, e);
        }
        push_completions(done.user_data, rc, e);
        pending_cv_.notify_all();  // release_mem may be waiting for the queue to drain
    }
}

bool IpcTransport::reap_finished() {
    std::vector<Pending> done;
    std::vector<int> codes;
    std::vector<std::string> errors;
    bool keep_polling = false, drained = false;
    {
        std::lock_guard lock(pending_mu_);
        auto poll_more = [&] { return !pending_.empty() && Clock::now() < poll_until_; };
        while (!pending_.empty()) {
            std::string e;
            int q = rt_->event_query(pending_.front().event, e);
            if (q == 0) break;  // still copying; so are the runs behind it, as far as we report
            done.push_back(std::move(pending_.front()));
            pending_.pop_front();
            recycle_locked(done.back());
            int code = q < 0 ? q : 0;
            settle_group(done.back(), code, e);
            codes.push_back(code);
            errors.push_back(std::move(e));
        }
        keep_polling = poll_more();
        drained = pending_.empty();
    }
    if (!done.empty()) {
        for (size_t i = 0; i < done.size(); ++i) push_completions(done[i].user_data, codes[i], errors[i]);
        if (drained) pending_cv_.notify_all();  // release_mem may be waiting for the queue to drain
    }
    return keep_polling;
}

void IpcTransport::settle_group(Pending &run, int &status, std::string &message) {
    if (!run.group) return;
    BlockGroup &g = *run.group;
    if (status != 0 && g.status == 0) g.status = status, g.message = message;
    if (!run.reports_group) return;  // user_data empty: nothing to report yet
    run.user_data.assign(1, g.user_data);
    status = g.status;
    message = g.message;
}

// All of them under one lock and at most one eventfd signal: the engine wakes once per run.
void IpcTransport::push_completions(const std::vector<uint64_t> &user_data, int status, const std::string &message) {
    cq_.push(user_data, status, message);
}

int IpcTransport::poll(ferry_completion_t *out, size_t max) {
    size_t n = cq_.poll(out, max);
    if (n == 0) {
        bool keep_polling = reap_finished();
        n = cq_.poll(out, max);
        // Copies in flight within the poll window: the fd stays readable, so a host sleeping
        // in poll(2) on it calls again at once and sees the run the moment its event completes
        // (no wakeup from the completion thread). After the window, the thread reports it.
        if (keep_polling) cq_.signal();
    }
    return static_cast<int>(n);
}

}  // namespace ferry_gpu
