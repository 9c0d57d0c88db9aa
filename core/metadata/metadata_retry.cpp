#include "metadata/metadata_retry.hpp"

#include <cerrno>
#include <thread>

#include "util/log.hpp"

namespace ferry {

Result<void> retry_at_start(const std::string &label, const std::string &server, const char *component,
                            std::chrono::milliseconds retry_for, const std::string &hint,
                            const std::function<Result<void>()> &attempt, bool protocol_is_fatal) {
    auto deadline = std::chrono::steady_clock::now() + retry_for;
    auto backoff = std::chrono::milliseconds(100);
    for (;;) {
        auto r = attempt();
        if (r) return {};
        const int code = r.error().code;
        if (code == -EACCES || code == -EINVAL || (protocol_is_fatal && (code == -EPROTO || code == -EROFS)))
            return fail(code, cat(label, ": ", r.error().message));
        if (std::chrono::steady_clock::now() + backoff > deadline)
            return fail(code, cat(label, ": cannot reach ", server, " (", r.error().message, ") after ",
                                  retry_for.count(), " ms; ", hint));
        FERRY_LOG(Warn, component, server, " unreachable (", r.error().message, "); retrying in ", backoff.count(),
                  " ms");
        std::this_thread::sleep_for(backoff);
        backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
    }
}

}  // namespace ferry
