// What shm.so holds on to about the process at the other end of a socket, and the limits it
// keeps against hostile ones: the peer's pidfd (so a reused pid is never copied to or from), the
// initiator's revocation gate (wire.hpp). Refused connections are logged through the kit's RateLimitedLog.
#pragma once

#include "plugin_util.hpp"

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

}  // namespace ferry_shm
