// What shm.so holds on to about the process at the other end of a socket, and the limits it
// keeps against hostile ones: the peer's pidfd (so a reused pid is never copied to or from), the
// initiator's revocation gate (wire.hpp), and rate-limited logging of refused connections.
#pragma once

#include "util.hpp"

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

namespace ferry_shm {

// A pidfd for the process at the other end of the unix socket `sock`: SO_PEERPIDFD (the very
// process that connected, Linux >= 6.5), else pidfd_open() of its SO_PEERCRED pid (the
// handshake's probe read then checks it is the process that holds the probe). -1 and errno
// when neither works.
int peer_pidfd(int sock, pid_t pid);

// False once the process `pidfd` refers to has exited (poll: POLLIN). A pid is reused only
// after its process is gone, so a copy made while this was true went to the right process.
bool process_alive(int pidfd);

// One page of the initiator whose first byte every copy of an op passes first (wire.hpp).
// revoke() makes it PROT_NONE: from then on the serving side's copy syscalls for the ops that
// name it fail before touching their buffers. A revoked page stays mapped (a new mapping at the
// same address would reopen the gate) until no op names it, and forever when keep_mapped().
class Gate {
public:
    static std::shared_ptr<Gate> make();  // nullptr when no page can be mapped
    ~Gate();
    Gate(const Gate &) = delete;
    Gate &operator=(const Gate &) = delete;
    uint64_t addr() const { return reinterpret_cast<uint64_t>(page_); }
    bool revoked() const { return revoked_; }
    void revoke();
    void keep_mapped() { keep_ = true; }

private:
    Gate() = default;
    void *page_ = nullptr;
    bool revoked_ = false, keep_ = false;
};

// Logs the first of a kind of event at once and then at most one line per interval with the
// count of the others ("N more ... in the last 10 s"), so garbage at the socket cannot flood the
// host's log.
class LogLimiter {
public:
    LogLimiter(const Logger &log, int level, std::chrono::milliseconds interval)
        : log_(log), level_(level), interval_(interval) {}
    void event(const std::string &line);
    void flush(bool force = false);  // logs the pending count once the interval is over

private:
    const Logger &log_;
    const int level_;
    const std::chrono::milliseconds interval_;
    std::mutex mu_;
    Clock::time_point last_{};
    bool logged_once_ = false;
    uint64_t suppressed_ = 0;
    std::string last_line_;
};

}  // namespace ferry_shm
