#include "metadata/redis_client.hpp"

#include "runtime_library.hpp"

#include <dlfcn.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/time.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "util/log.hpp"

#ifdef FERRY_HAVE_HIREDIS_H
#include <hiredis/hiredis.h>
#endif

namespace ferry {
namespace {

// hiredis' reply types (RESP2; 1.x adds RESP3 ones, which Ferry never asks for).
constexpr int kReplyString = 1, kReplyArray = 2, kReplyInteger = 3, kReplyNil = 4, kReplyStatus = 5, kReplyError = 6;

// The leading fields of hiredis' structs, as each major lays them out (its hiredis.h, read.h).
struct ReaderView {  // redisReader, both
    int err;
    char errstr[128];
    char *buf;
    size_t pos;
    size_t len;
};
struct ContextV0 {  // redisContext, 0.14
    int err;
    char errstr[128];
    int fd;
    int flags;
    char *obuf;
    ReaderView *reader;
};
struct ContextV1 {  // redisContext, 1.x: a function table first
    const void *funcs;
    int err;
    char errstr[128];
    int fd;
    int flags;
    char *obuf;
    ReaderView *reader;
};
struct ReplyV0 {  // redisReply, 0.14
    int type;
    long long integer;
    size_t len;
    char *str;
    size_t elements;
    ReplyV0 **element;
};
struct ReplyV1 {  // redisReply, 1.x: RESP3's double and verbatim type in between
    int type;
    long long integer;
    double dval;
    size_t len;
    char *str;
    char vtype[4];
    size_t elements;
    ReplyV1 **element;
};

#ifdef FERRY_HAVE_HIREDIS_H
// The headers this was built with must describe one of the two layouts.
#if HIREDIS_MAJOR >= 1
using HeaderContext = ContextV1;
using HeaderReply = ReplyV1;
#else
using HeaderContext = ContextV0;
using HeaderReply = ReplyV0;
#endif
static_assert(offsetof(redisContext, err) == offsetof(HeaderContext, err));
static_assert(offsetof(redisContext, fd) == offsetof(HeaderContext, fd));
static_assert(offsetof(redisContext, reader) == offsetof(HeaderContext, reader));
static_assert(offsetof(redisReader, len) == offsetof(ReaderView, len));
static_assert(offsetof(redisReply, len) == offsetof(HeaderReply, len));
static_assert(offsetof(redisReply, str) == offsetof(HeaderReply, str));
static_assert(offsetof(redisReply, elements) == offsetof(HeaderReply, elements));
static_assert(offsetof(redisReply, element) == offsetof(HeaderReply, element));
static_assert(REDIS_REPLY_STRING == kReplyString && REDIS_REPLY_ARRAY == kReplyArray &&
              REDIS_REPLY_INTEGER == kReplyInteger && REDIS_REPLY_NIL == kReplyNil &&
              REDIS_REPLY_STATUS == kReplyStatus && REDIS_REPLY_ERROR == kReplyError);
#endif

// The functions used; their signatures are the same in 0.14 and 1.x.
struct Hiredis {
    void *(*connect_with_timeout)(const char *ip, int port, const struct timeval tv) = nullptr;
    int (*set_timeout)(void *c, const struct timeval tv) = nullptr;
    int (*enable_keepalive)(void *c) = nullptr;
    void (*free_context)(void *c) = nullptr;
    int (*buffer_read)(void *c) = nullptr;
    int (*buffer_write)(void *c, int *done) = nullptr;
    int (*get_reply_from_reader)(void *c, void **reply) = nullptr;
    int (*append_command_argv)(void *c, int argc, const char **argv, const size_t *argvlen) = nullptr;
    void (*free_reply)(void *reply) = nullptr;
    bool v1 = false;
    std::string error;
};

Hiredis load_hiredis() {
    Hiredis h;
    auto opened = ferry_base::open_runtime_library(
        "FERRY_LIBHIREDIS", {"libhiredis.so.1.4.0", "libhiredis.so.1.3.0", "libhiredis.so.1.1.0", "libhiredis.so.1.0.0",
                             "libhiredis.so.0.14", "libhiredis.so"});
    void *lib = opened.handle;
    if (!lib) {
        h.error =
            "redis:// metadata needs hiredis, which could not be loaded: install libhiredis0.14 (Debian 12, "
            "Ubuntu 22.04) or libhiredis1.1.0 (newer)";
        if (opened.overridden) h.error += ", or point FERRY_LIBHIREDIS at an existing libhiredis";
        h.error += " (" + opened.tried + ")";
        return h;
    }
    auto get = [&](auto &fn, const char *name) {
        fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
        if (!fn && h.error.empty())
            h.error = cat("the hiredis that was loaded lacks ", name, "; install hiredis 0.14 or 1.x");
    };
    get(h.connect_with_timeout, "redisConnectWithTimeout");
    get(h.set_timeout, "redisSetTimeout");
    get(h.enable_keepalive, "redisEnableKeepAlive");
    get(h.free_context, "redisFree");
    get(h.buffer_read, "redisBufferRead");
    get(h.buffer_write, "redisBufferWrite");
    get(h.get_reply_from_reader, "redisGetReplyFromReader");
    get(h.append_command_argv, "redisAppendCommandArgv");
    get(h.free_reply, "freeReplyObject");
    h.v1 = dlsym(lib, "redisConnectWithOptions") != nullptr;
    return h;  // never dlclose'd: function pointers stay valid until the process exits
}

const Hiredis &hiredis() {
    static const Hiredis h = load_hiredis();
    return h;
}

int context_err(void *c) { return hiredis().v1 ? static_cast<ContextV1 *>(c)->err : static_cast<ContextV0 *>(c)->err; }
std::string context_errstr(void *c) {
    const char *s = hiredis().v1 ? static_cast<ContextV1 *>(c)->errstr : static_cast<ContextV0 *>(c)->errstr;
    return std::string(s, strnlen(s, 128));
}
int context_fd(void *c) { return hiredis().v1 ? static_cast<ContextV1 *>(c)->fd : static_cast<ContextV0 *>(c)->fd; }
ReaderView *context_reader(void *c) {
    return hiredis().v1 ? static_cast<ContextV1 *>(c)->reader : static_cast<ContextV0 *>(c)->reader;
}

// Whether the reply item being read is a bulk string announced ("$<n>") longer than `limit`, so
// it is refused before its bytes arrive, not after `limit` of them. hiredis keeps unparsed data
// from its buffer's pos on, and takes an item's type byte as soon as it arrives, so the head of
// that data is the item still incomplete, its '$' just before pos or at it.
bool announces_more_than(const ReaderView *r, size_t limit) {
    if (!r || !r->buf || r->pos > r->len) return false;
    const char *p = r->buf + r->pos, *end = r->buf + r->len;
    if (r->pos > 0 && p[-1] == '$') --p;
    if (p >= end || *p != '$') return false;
    unsigned long long n = 0;
    for (++p; p < end && *p >= '0' && *p <= '9'; ++p) {
        n = n * 10 + static_cast<unsigned>(*p - '0');
        if (n > limit) return true;
    }
    return false;
}

template <class Reply>
RedisReply copy_reply(const Reply *r, int depth) {
    RedisReply out;
    switch (r->type) {
        case kReplyString: out.type = RedisReply::Type::String; break;
        case kReplyStatus: out.type = RedisReply::Type::Status; break;
        case kReplyError: out.type = RedisReply::Type::Error; break;
        case kReplyInteger: out.type = RedisReply::Type::Integer; break;
        case kReplyNil: out.type = RedisReply::Type::Nil; break;
        case kReplyArray: out.type = RedisReply::Type::Array; break;
        default: out.type = RedisReply::Type::Other; return out;
    }
    if (out.type == RedisReply::Type::Integer) out.integer = r->integer;
    if ((out.type == RedisReply::Type::String || out.type == RedisReply::Type::Status ||
         out.type == RedisReply::Type::Error) &&
        r->str)
        out.str.assign(r->str, r->len);
    if (out.type == RedisReply::Type::Array) {
        if (depth >= 2) {  // Ferry's commands answer flat arrays
            out.type = RedisReply::Type::Other;
            return out;
        }
        out.elements.reserve(r->elements);
        for (size_t i = 0; i < r->elements; ++i)
            out.elements.push_back(r->element[i] ? copy_reply(r->element[i], depth + 1) : RedisReply{});
    }
    return out;
}

struct timeval to_timeval(std::chrono::milliseconds ms) {
    if (ms.count() < 1) ms = std::chrono::milliseconds(1);
    return {static_cast<time_t>(ms.count() / 1000), static_cast<suseconds_t>((ms.count() % 1000) * 1000)};
}

// hiredis writes with write()/send() without MSG_NOSIGNAL, and a write to a connection the peer
// reset may raise SIGPIPE, whose default action ends the whole process. Linux fails the first
// write after a reset with ECONNRESET and no signal, and the connection is dropped then, but
// nothing in hiredis promises that: while one of its writes runs, this thread blocks SIGPIPE and
// takes back a SIGPIPE the write raised (not one that was pending before).
class SigpipeBlocked {
public:
    SigpipeBlocked() {
        sigemptyset(&pipe_);
        sigaddset(&pipe_, SIGPIPE);
        sigset_t pending;
        sigemptyset(&pending);
        sigpending(&pending);
        was_pending_ = sigismember(&pending, SIGPIPE) == 1;
        pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
    }
    ~SigpipeBlocked() {
        if (!was_pending_) {
            sigset_t pending;
            sigemptyset(&pending);
            sigpending(&pending);
            timespec zero{0, 0};
            if (sigismember(&pending, SIGPIPE) == 1) sigtimedwait(&pipe_, nullptr, &zero);
        }
        pthread_sigmask(SIG_SETMASK, &old_, nullptr);
    }
    SigpipeBlocked(const SigpipeBlocked &) = delete;
    SigpipeBlocked &operator=(const SigpipeBlocked &) = delete;

private:
    sigset_t pipe_, old_;
    bool was_pending_ = false;
};

bool starts(const std::string &text, const char *prefix) { return text.rfind(prefix, 0) == 0; }
bool has(const std::string &text, const char *part) { return text.find(part) != std::string::npos; }

}  // namespace

const std::string &hiredis_error() { return hiredis().error; }

RedisClient::RedisClient(RedisTarget target, std::chrono::milliseconds timeout)
    : target_(std::move(target)), timeout_(timeout) {}

RedisClient::~RedisClient() { drop(); }

void RedisClient::drop() {
    if (context_) hiredis().free_context(context_);
    context_ = nullptr;
}

Error RedisClient::lost(int code, const std::string &why) {
    drop();
    return {code, cat("Redis at ", target_.where, ": ", why)};
}

Result<void> RedisClient::connect() { return connect(std::chrono::steady_clock::now() + timeout_); }

Result<void> RedisClient::connect(Deadline deadline) {
    if (context_) return {};
    const Hiredis &h = hiredis();
    if (!h.error.empty()) return fail(-ENOENT, h.error);
    auto left = [&] {
        return std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    };
    context_ = h.connect_with_timeout(target_.host.c_str(), target_.port, to_timeval(left()));
    if (!context_) return fail(-ENOMEM, cat("Redis at ", target_.where, ": cannot allocate a connection"));
    if (context_err(context_)) {
        std::string why = context_errstr(context_);
        int code = has(why, "timed out") ? -ETIMEDOUT : -ECONNREFUSED;
        return std::unexpected(lost(code, cat("cannot connect: ", why)));
    }
    h.enable_keepalive(context_);
    std::vector<std::vector<std::string>> login;
    if (!target_.password.empty()) {
        if (target_.user.empty()) login.push_back({"AUTH", target_.password});
        else login.push_back({"AUTH", target_.user, target_.password});
    }
    if (target_.db > 0) login.push_back({"SELECT", std::to_string(target_.db)});
    login.push_back({"PING"});
    auto replies = exchange(login, deadline);
    if (!replies) return std::unexpected(replies.error());
    const std::string who = target_.user.empty() ? std::string() : cat(" for user '", target_.user, "'");
    size_t i = 0;
    if (!target_.password.empty()) {
        const RedisReply &auth = (*replies)[i++];
        if (auth.type == RedisReply::Type::Error) {
            const std::string &e = auth.str;
            if (has(e, "without any password configured") || has(e, "no password is set"))
                return std::unexpected(
                    lost(-EACCES, cat("refused AUTH (", e, "): a password is set (", target_.password_origin,
                                      ") but this Redis has none; unset it")));
            return std::unexpected(
                lost(-EACCES, cat("refused the password", who, " (", e, "): wrong user or password; check ",
                                  target_.password_origin, target_.user.empty() ? "" : " and redis_user")));
        }
    }
    if (target_.db > 0) {
        const RedisReply &select = (*replies)[i++];
        if (select.type == RedisReply::Type::Error && !starts(select.str, "NOAUTH"))
            return std::unexpected(lost(
                has(select.str, "out of range") ? -EINVAL : -EPROTO,
                cat("cannot SELECT database ", target_.db, " (", select.str,
                    "): use a database index below the server's `databases` setting (the URL's /db or redis_db)")));
    }
    const RedisReply &ping = (*replies)[i];
    if (ping.type == RedisReply::Type::Error) {
        if (starts(ping.str, "NOAUTH"))
            return std::unexpected(lost(-EACCES, cat("requires a password (", ping.str,
                                                     "): set redis_password_file (or redis_password), and redis_user "
                                                     "for an ACL user")));
        if (starts(ping.str, "DENIED") || starts(ping.str, "NOPERM"))
            return std::unexpected(lost(-EACCES, cat("refused this client (", ping.str, ")")));
        return std::unexpected(lost(-EAGAIN, cat("is not ready (", ping.str, ")")));
    }
    if (ping.type != RedisReply::Type::Status || ping.str != "PONG")
        return std::unexpected(lost(-EPROTO, "answered PING without PONG: is it a Redis server?"));
    return {};
}

Result<std::vector<RedisReply>> RedisClient::exchange(const std::vector<std::vector<std::string>> &commands,
                                                      Deadline deadline) {
    const Hiredis &h = hiredis();
    // Each wait is bounded by the deadline, and each socket call (hiredis' blocking mode) by the
    // time left too, so a write larger than the socket buffer cannot outlast it either.
    auto wait = [&](short events) -> Result<void> {
        for (;;) {
            auto left =
                std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
            if (left.count() <= 0)
                return std::unexpected(lost(-ETIMEDOUT, cat("no answer within ", timeout_.count(), " ms")));
            pollfd p{context_fd(context_), events, 0};
            int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1 << 30)));
            if (n > 0) {
                h.set_timeout(context_, to_timeval(left));
                return {};
            }
            if (n < 0 && errno != EINTR) return std::unexpected(lost(-ECONNRESET, cat("poll: ", std::strerror(errno))));
        }
    };
    auto broken = [&](const char *doing) {
        std::string why = context_errstr(context_);
        bool timeout = has(why, "temporarily unavailable") || has(why, "timed out");
        return std::unexpected(
            lost(timeout ? -ETIMEDOUT : -ECONNRESET, cat(doing, ": ", why.empty() ? "connection lost" : why)));
    };
    for (const auto &cmd : commands) {
        std::vector<const char *> argv;
        std::vector<size_t> lens;
        for (const auto &a : cmd) {
            argv.push_back(a.data());
            lens.push_back(a.size());
        }
        if (h.append_command_argv(context_, static_cast<int>(argv.size()), argv.data(), lens.data()) != 0)
            return std::unexpected(lost(-ENOMEM, "cannot queue a command"));
    }
    for (int done = 0; !done;) {
        if (auto w = wait(POLLOUT); !w) return std::unexpected(w.error());
        int rc;
        {
            SigpipeBlocked quiet;
            rc = h.buffer_write(context_, &done);
        }
        if (rc != 0) return broken("sending");
    }
    std::vector<RedisReply> out;
    out.reserve(commands.size());
    size_t received = 0;
    while (out.size() < commands.size()) {
        void *reply = nullptr;
        if (h.get_reply_from_reader(context_, &reply) != 0)
            return std::unexpected(lost(-EPROTO, cat("the answer is not Redis protocol (", context_errstr(context_),
                                                     "): is it a Redis server?")));
        if (reply) {
            out.push_back(h.v1 ? copy_reply(static_cast<ReplyV1 *>(reply), 0)
                               : copy_reply(static_cast<ReplyV0 *>(reply), 0));
            h.free_reply(reply);
            continue;
        }
        // What arrives is counted, not what is buffered: hiredis moves each finished element of
        // an array out of its buffer into the reply it builds.
        const ReaderView *reader = context_reader(context_);
        if (announces_more_than(reader, kMaxRedisReplyBytes) || received > kMaxRedisReplyBytes)
            return std::unexpected(lost(-EPROTO, cat("an answer is larger than ", kMaxRedisReplyBytes,
                                                     " bytes, more than any value Ferry stores; not read further")));
        if (auto w = wait(POLLIN); !w) return std::unexpected(w.error());
        const size_t before = reader ? reader->len : 0;
        if (h.buffer_read(context_) != 0) return broken("receiving");
        reader = context_reader(context_);
        if (reader && reader->len > before) received += reader->len - before;
    }
    return out;
}

Result<std::vector<RedisReply>> RedisClient::run(const std::vector<std::vector<std::string>> &commands) {
    auto deadline = std::chrono::steady_clock::now() + timeout_;
    const bool kept = context_ != nullptr;
    if (auto c = connect(deadline); !c) return std::unexpected(c.error());
    auto r = exchange(commands, deadline);
    if (r || !kept || r.error().code != -ECONNRESET) return r;
    FERRY_LOG(Debug, "metadata", "Redis at ", target_.where, " closed a kept connection (", r.error().message,
              "); connecting again");
    if (auto c = connect(deadline); !c) return std::unexpected(c.error());
    return exchange(commands, deadline);
}

Result<RedisReply> RedisClient::command(std::vector<std::string> args) {
    auto r = run({std::move(args)});
    if (!r) return std::unexpected(r.error());
    return std::move(r->front());
}

}  // namespace ferry
