// A transport peer in a child process (the test binary re-executed with
// --ferry-transport-peer), so transfers cross a real process boundary and the peer can be
// stopped (SIGSTOP) or killed (SIGKILL) at will.
//
// The child registers one buffer, prints "READY <endpoint hex> <addr> <len>" and then answers
// line commands on stdin: "FILL off len seed", "HASH off len", "EXIT".
#pragma once

#include "harness.hpp"

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ferry_test {

inline constexpr const char *kPeerFlag = "--ferry-transport-peer";

class ChildPeer {
public:
    ChildPeer(const std::string &plugin_path, size_t size, uint32_t access, const Options &options);
    ~ChildPeer();  // SIGKILL and reap, if still running
    ChildPeer(const ChildPeer &) = delete;
    ChildPeer &operator=(const ChildPeer &) = delete;

    bool ok() const { return ok_; }
    const std::string &error() const { return error_; }
    const std::vector<uint8_t> &endpoint() const { return endpoint_; }
    uint64_t addr() const { return addr_; }
    uint64_t size() const { return size_; }
    pid_t pid() const { return pid_; }

    bool fill(uint64_t off, uint64_t len, uint64_t seed);
    bool hash(uint64_t off, uint64_t len, uint64_t *out);
    void stop();          // SIGSTOP
    void resume();        // SIGCONT
    void kill_now();      // SIGKILL and reap
    bool exit_cleanly();  // EXIT, then reap; true when it exited with status 0

private:
    bool command(const std::string &line, std::string *reply);
    bool read_line(std::string *line, int timeout_ms);

    pid_t pid_ = -1;
    int to_child_ = -1;
    int from_child_ = -1;
    std::string pending_;
    bool ok_ = false;
    std::string error_;
    std::vector<uint8_t> endpoint_;
    uint64_t addr_ = 0;
    uint64_t size_ = 0;
};

// Entry point of the child: argv = self --ferry-transport-peer <plugin> <size> <access> [k=v]...
int peer_main(int argc, char **argv);

}  // namespace ferry_test
