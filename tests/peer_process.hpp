// A ferry_test_peer child process driven over pipes.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#ifndef FERRY_TEST_PEER_BIN
#define FERRY_TEST_PEER_BIN ""  // set by the tests that use the default peer
#endif

namespace ferry::test {

class PeerProcess {
public:
    explicit PeerProcess(std::vector<std::string> args, const char *binary = FERRY_TEST_PEER_BIN) {
        // argv is built before fork: between fork and exec the child of a multithreaded parent
        // may only make async-signal-safe calls (malloc can deadlock on a lock another thread
        // held at fork time; under TSan it did).
        args.insert(args.begin(), binary);
        std::vector<char *> argv;
        for (auto &a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        int to_child[2], from_child[2];
        if (pipe2(to_child, O_CLOEXEC) != 0 || pipe2(from_child, O_CLOEXEC) != 0) return;
        pid_ = fork();
        if (pid_ == 0) {
            dup2(to_child[0], 0);
            dup2(from_child[1], 1);
            execv(argv[0], argv.data());
            _exit(127);
        }
        close(to_child[0]);
        close(from_child[1]);
        in_ = to_child[1];
        out_ = fdopen(from_child[0], "r");
        std::string ready = read_line();
        ready_line = ready;
        std::istringstream s(ready);
        std::string word, addr;
        s >> word >> segment >> addr >> size;
        ok = word == "READY";
        if (ok) base = std::stoull(addr, nullptr, 16);
        else error = ready;
    }
    ~PeerProcess() {
        if (pid_ > 0) {
            kill(pid_, SIGKILL);
            waitpid(pid_, nullptr, 0);
        }
        if (in_ >= 0) close(in_);
        if (out_) fclose(out_);
    }
    std::string command(const std::string &cmd) {
        std::string line = cmd + "\n";
        if (write(in_, line.data(), line.size()) != static_cast<ssize_t>(line.size())) return "";
        return read_line();
    }
    pid_t pid() const { return pid_; }
    void kill_now() {
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
        pid_ = -1;
    }

    bool ok = false;
    std::string error;
    std::string ready_line;  // the whole READY line, for peers that print more
    std::string segment;
    uint64_t base = 0;
    uint64_t size = 0;

private:
    // The whole line, however long (a long reply must not spill into the next command's).
    std::string read_line() {
        std::string s;
        char buf[1024];
        while (out_ && fgets(buf, sizeof buf, out_)) {
            s += buf;
            if (s.back() == '\n') {
                s.pop_back();
                break;
            }
        }
        return s;
    }
    pid_t pid_ = -1;
    int in_ = -1;
    FILE *out_ = nullptr;
};

// SIGSTOP, then wait until every thread of the process has stopped: kill() returns before they
// do, and an op submitted in between may still be served.
inline bool stop_process(pid_t pid) {
    if (kill(pid, SIGSTOP) != 0) return false;
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < until) {
        bool all = true;
        std::error_code ec;
        for (auto &task : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
            std::ifstream in(task.path() / "stat");
            std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
            auto close = text.rfind(')');
            char state = close != std::string::npos && close + 2 < text.size() ? text[close + 2] : '?';
            all = all && (state == 'T' || state == 't');
        }
        if (all && !ec) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polling /proc, nothing to wait on
    }
    return false;
}

}  // namespace ferry::test
