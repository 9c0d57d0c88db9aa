// What the metadata stores an engine may reach before they run (etcd, Redis, an HTTP metadata
// server) share at start: the first contact, retried with backoff.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "ferry/result.hpp"

namespace ferry {

// Tries `attempt` until it succeeds, fails with -EACCES or -EINVAL (a refused password or
// certificate, a bad setting: waiting does not cure them; -EPROTO and -EROFS too, when
// `protocol_is_fatal`), or `retry_for` has passed; backoff 0.1 s doubling to 2 s. Errors read
// "<label>: ..." (label: "etcd metadata"); giving up reads "<label>: cannot reach <server>
// (<last error>) after N ms; <hint>". Each retry is logged as a warning under `component`.
Result<void> retry_at_start(const std::string &label, const std::string &server, const char *component,
                            std::chrono::milliseconds retry_for, const std::string &hint,
                            const std::function<Result<void>()> &attempt, bool protocol_is_fatal = false);

}  // namespace ferry
