#include "peer_process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>

namespace ferry_test {

namespace {

std::string to_hex(const std::vector<uint8_t> &v) {
    static const char *d = "0123456789abcdef";
    std::string s;
    for (uint8_t b : v) {
        s += d[b >> 4];
        s += d[b & 15];
    }
    return s;
}

std::vector<uint8_t> from_hex(const std::string &s) {
    std::vector<uint8_t> v;
    for (size_t i = 0; i + 1 < s.size(); i += 2)
        v.push_back(static_cast<uint8_t>(std::stoul(s.substr(i, 2), nullptr, 16)));
    return v;
}

}  // namespace

ChildPeer::ChildPeer(const std::string &plugin_path, size_t size, uint32_t access, const Options &options) {
    std::vector<std::string> args = {"/proc/self/exe", kPeerFlag, plugin_path, std::to_string(size),
                                     std::to_string(access)};
    for (const auto &[k, v] : options) args.push_back(k + "=" + v);
    std::vector<char *> argv;
    for (auto &a : args) argv.push_back(a.data());
    argv.push_back(nullptr);

    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) {
        error_ = "pipe2 failed";
        return;
    }
    pid_ = fork();
    if (pid_ == 0) {
        // Child: async-signal-safe calls only until exec.
        dup2(in[0], 0);
        dup2(out[1], 1);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execv("/proc/self/exe", argv.data());
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    to_child_ = in[1];
    from_child_ = out[0];
    if (pid_ < 0) {
        error_ = "fork failed";
        return;
    }
    std::string line;
    if (!read_line(&line, 60000)) {
        error_ = "peer process did not start: " + (line.empty() ? "no output" : line);
        return;
    }
    std::istringstream is(line);
    std::string word, hex;
    is >> word >> hex >> addr_ >> size_;
    if (word != "READY") {
        error_ = "peer process failed: " + line;
        return;
    }
    endpoint_ = from_hex(hex);
    ok_ = true;
}

ChildPeer::~ChildPeer() {
    if (pid_ > 0) kill_now();
    if (to_child_ >= 0) close(to_child_);
    if (from_child_ >= 0) close(from_child_);
}

bool ChildPeer::read_line(std::string *line, int timeout_ms) {
    for (;;) {
        auto nl = pending_.find('\n');
        if (nl != std::string::npos) {
            *line = pending_.substr(0, nl);
            pending_.erase(0, nl + 1);
            return true;
        }
        pollfd p{from_child_, POLLIN, 0};
        int rc = ::poll(&p, 1, timeout_ms);
        if (rc < 0 && errno == EINTR) continue;
        if (rc <= 0) return false;
        char buf[512];
        ssize_t n = read(from_child_, buf, sizeof buf);
        if (n <= 0) {
            *line = pending_;
            return false;
        }
        pending_.append(buf, static_cast<size_t>(n));
    }
}

bool ChildPeer::command(const std::string &line, std::string *reply) {
    if (pid_ <= 0) return false;
    std::string l = line + "\n";
    if (write(to_child_, l.data(), l.size()) != static_cast<ssize_t>(l.size())) return false;
    return read_line(reply, 60000);
}

bool ChildPeer::fill(uint64_t off, uint64_t len, uint64_t seed) {
    std::string reply;
    return command("FILL " + std::to_string(off) + " " + std::to_string(len) + " " + std::to_string(seed), &reply) &&
           reply == "OK";
}

bool ChildPeer::hash(uint64_t off, uint64_t len, uint64_t *out) {
    std::string reply;
    if (!command("HASH " + std::to_string(off) + " " + std::to_string(len), &reply)) return false;
    return sscanf(reply.c_str(), "HASH %" SCNx64, out) == 1;
}

void ChildPeer::stop() {
    if (pid_ > 0) {
        ::kill(pid_, SIGSTOP);
        int st;
        waitpid(pid_, &st, WUNTRACED);  // returns once it is really stopped
    }
}

void ChildPeer::resume() {
    if (pid_ > 0) ::kill(pid_, SIGCONT);
}

void ChildPeer::kill_now() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int st;
    while (waitpid(pid_, &st, 0) < 0 && errno == EINTR) {}
    pid_ = -1;
}

bool ChildPeer::exit_cleanly() {
    if (pid_ <= 0) return false;
    std::string l = "EXIT\n";
    if (write(to_child_, l.data(), l.size()) != static_cast<ssize_t>(l.size())) return false;
    int st = 0;
    while (waitpid(pid_, &st, 0) < 0 && errno == EINTR) {}
    pid_ = -1;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

int peer_main(int argc, char **argv) {
    if (argc < 5) {
        printf("ERROR usage: %s %s <plugin> <size> <access> [key=value]...\n", argv[0], kPeerFlag);
        return 2;
    }
    Plugin plugin(argv[2]);
    if (!plugin.ok()) {
        printf("ERROR %s\n", plugin.error().c_str());
        return 1;
    }
    const size_t size = std::strtoull(argv[3], nullptr, 0);
    const uint32_t access = static_cast<uint32_t>(std::strtoul(argv[4], nullptr, 0));
    Options options;
    for (int i = 5; i < argc; ++i) {
        std::string kv = argv[i];
        auto eq = kv.find('=');
        options.emplace_back(kv.substr(0, eq), eq == std::string::npos ? "" : kv.substr(eq + 1));
    }
    Instance inst(plugin, options);
    if (inst.create_rc() != 0) {
        printf("ERROR create: %s\n", inst.last_error().c_str());
        return 1;
    }
    Buffer buf(size);
    uint64_t handle = 0;
    if (inst.register_mem(buf.data(), size, access, &handle) != 0) {
        printf("ERROR register_mem: %s\n", inst.last_error().c_str());
        return 1;
    }
    printf("READY %s %" PRIu64 " %" PRIu64 "\n", to_hex(inst.endpoint()).c_str(), buf.addr(),
           static_cast<uint64_t>(size));
    fflush(stdout);
    char line[256];
    while (fgets(line, sizeof line, stdin) != nullptr) {
        uint64_t off = 0, len = 0, seed = 0;
        if (sscanf(line, "FILL %" SCNu64 " %" SCNu64 " %" SCNu64, &off, &len, &seed) == 3 && off <= size &&
            len <= size - off) {
            fill_pattern(buf.data() + off, len, seed, off);
            printf("OK\n");
        } else if (sscanf(line, "HASH %" SCNu64 " %" SCNu64, &off, &len) == 2 && off <= size && len <= size - off) {
            printf("HASH %" PRIx64 "\n", fnv1a(buf.data() + off, len));
        } else if (strncmp(line, "EXIT", 4) == 0) {
            break;
        } else {
            printf("ERROR bad command\n");
        }
        fflush(stdout);
    }
    inst.deregister_mem(handle);
    inst.destroy();
    return 0;
}

}  // namespace ferry_test
