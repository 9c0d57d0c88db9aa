// Helpers of the trust tests (plugin_trust_test, config_trust_test): a second local user, modes
// and owners of real files, and the engine's log as this process writes it.
#pragma once

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>

#include "test_util.hpp"

namespace ferry::test {

// A local user made for this process (useradd) and removed at exit (userdel): files it owns are
// files "another user" wrote. Needs root; ok() is false, with why_not(), otherwise.
class OtherUser {
public:
    OtherUser() {
        if (geteuid() != 0) {
            why_ = "not root: giving files to a second user needs root (CI runs as root)";
            return;
        }
        name_ = "ferrytrust" + std::to_string(getpid());
        int status = -1;
        std::string out;
        // useradd waits for nobody: retry while another test holds /etc/passwd's lock.
        for (int i = 0; i < 50 && status != 0; ++i) {
            out =
                run_command("useradd --system --no-create-home --shell /usr/sbin/nologin " + name_ + " 2>&1", &status);
            if (status != 0) usleep(100000);
        }
        if (status != 0) {
            why_ = "useradd " + name_ + " failed: " + out;
            name_.clear();
            return;
        }
        const struct passwd *pw = getpwnam(name_.c_str());
        if (!pw) {
            why_ = "getpwnam(" + name_ + ") found no user after useradd";
            return;
        }
        uid_ = pw->pw_uid;
        gid_ = pw->pw_gid;
    }
    ~OtherUser() {
        int status = 0;
        if (!name_.empty()) run_command("userdel " + name_ + " 2>&1", &status);
    }
    OtherUser(const OtherUser &) = delete;
    OtherUser &operator=(const OtherUser &) = delete;

    bool ok() const { return why_.empty(); }
    const std::string &why_not() const { return why_; }
    const std::string &name() const { return name_; }
    uid_t uid() const { return uid_; }
    gid_t gid() const { return gid_; }

private:
    std::string name_, why_;
    uid_t uid_ = 0;
    gid_t gid_ = 0;
};

// One per process, removed when the process exits.
inline OtherUser &other_user() {
    static OtherUser user;
    return user;
}

// A test that needs the second user says why it cannot run, on a line CI collects.
#define REQUIRE_OTHER_USER()                                                        \
    do {                                                                            \
        if (!::ferry::test::other_user().ok()) {                                    \
            printf("SKIPPED: %s\n", ::ferry::test::other_user().why_not().c_str()); \
            GTEST_SKIP() << ::ferry::test::other_user().why_not();                  \
        }                                                                           \
    } while (0)

inline void set_mode(const std::filesystem::path &p, mode_t mode) {
    if (::chmod(p.c_str(), mode) != 0) perror(("chmod " + p.string()).c_str());
}

// lchown: a symlink itself, not what it points to.
inline void give_to(const std::filesystem::path &p, uid_t uid, gid_t gid) {
    if (::lchown(p.c_str(), uid, gid) != 0) perror(("lchown " + p.string()).c_str());
}

inline void write_text(const std::filesystem::path &p, const std::string &text, mode_t mode) {
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text;
    set_mode(p, mode);
}

// What this process writes to stderr (the engine's log) while it lives.
class StderrCapture {
public:
    StderrCapture() {
        std::fflush(stderr);
        std::clog.flush();
        char name[] = "/tmp/ferry-stderr-XXXXXX";
        file_ = mkstemp(name);
        ::unlink(name);
        saved_ = ::dup(2);
        ::dup2(file_, 2);
    }
    ~StderrCapture() { restore(); }
    std::string take() {
        restore();
        std::string out;
        char buf[4096];
        ssize_t n;
        for (off_t at = 0; (n = ::pread(file_, buf, sizeof buf, at)) > 0; at += n) out.append(buf, size_t(n));
        return out;
    }

private:
    void restore() {
        if (saved_ < 0) return;
        std::clog.flush();
        std::fflush(stderr);
        ::dup2(saved_, 2);
        ::close(saved_);
        saved_ = -1;
    }
    int file_ = -1, saved_ = -1;
};

inline size_t count_of(const std::string &text, const std::string &part) {
    size_t n = 0;
    for (size_t at = 0; (at = text.find(part, at)) != std::string::npos; at += part.size()) ++n;
    return n;
}

}  // namespace ferry::test
