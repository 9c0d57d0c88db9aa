// A Redis connection over hiredis, which is loaded at run time (dlopen), not linked: a host
// without hiredis runs Ferry, and only a redis:// metadata URL fails, naming the package to
// install. Sonames tried: $FERRY_LIBHIREDIS when set, else libhiredis.so.1.4.0, 1.3.0, 1.1.0
// (hiredis 1.1, 1.2), 1.0.0, libhiredis.so.0.14 (Debian 12, Ubuntu 22.04) and libhiredis.so.
// hiredis 1.x and 0.14 lay out their context and reply structs differently; the library's own
// symbols say which it is (redisConnectWithOptions exists from 1.0 on), and replies are copied
// into RedisReply at once, so nothing else depends on hiredis' structs. Both layouts were run
// against the Redis tests: Debian 12's 0.14 and hiredis 1.2.0 built from source
// (FERRY_LIBHIREDIS=.../libhiredis.so).
//
// Every call ends within the timeout it is given: commands go out and replies come in through
// poll() on the connection's socket against one deadline (hiredis' own blocking calls would
// wait the timeout again for every read), and an answer is refused once more than
// kMaxRedisReplyBytes of it arrived, or as soon as it announces a longer string, instead of being
// read into memory. A broken connection is dropped and made again (with AUTH and SELECT) by the
// next call.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "ferry/result.hpp"

namespace ferry {

// A whole descriptor at the decoder's limit (descriptor.hpp), and some.
inline constexpr size_t kMaxRedisReplyBytes = (64u << 20) + (1u << 20);

struct RedisReply {
    enum class Type { String, Array, Integer, Nil, Status, Error, Other };
    Type type = Type::Nil;
    long long integer = 0;
    std::string str;  // String, Status, Error
    std::vector<RedisReply> elements;
};

// Where and as whom to log in.
struct RedisTarget {
    std::string host;
    uint16_t port = 6379;
    std::string user;      // empty: AUTH with the password alone (the default user)
    std::string password;  // empty: no AUTH
    int db = 0;
    std::string where;            // the URL for messages, any password in it hidden
    std::string password_origin;  // where the password came from, for messages ("redis_password_file '...'")
};

// Empty when hiredis could be loaded, else why not and what to install.
const std::string &hiredis_error();

class RedisClient {
public:
    RedisClient(RedisTarget target, std::chrono::milliseconds timeout);
    ~RedisClient();
    RedisClient(const RedisClient &) = delete;
    RedisClient &operator=(const RedisClient &) = delete;

    // Connects unless connected: AUTH (with a password), SELECT (db > 0), PING. A refused
    // password, a missing one and a database that does not exist are -EACCES / -EINVAL.
    Result<void> connect();
    // The commands in one write, one reply each (an error reply is a reply). Errors are failures
    // to get them: -ECONNREFUSED, -ETIMEDOUT, -ECONNRESET, -EPROTO (not Redis, or a reply too
    // large). A command that finds a kept connection closed (an idle timeout, a restart) is sent
    // once more on a new one; every command Ferry sends may be repeated.
    Result<std::vector<RedisReply>> run(const std::vector<std::vector<std::string>> &commands);
    Result<RedisReply> command(std::vector<std::string> args);

    const RedisTarget &target() const { return target_; }

private:
    using Deadline = std::chrono::steady_clock::time_point;
    Result<void> connect(Deadline deadline);
    Result<std::vector<RedisReply>> exchange(const std::vector<std::vector<std::string>> &commands, Deadline deadline);
    Error lost(int code, const std::string &why);  // drops the connection
    void drop();

    RedisTarget target_;
    std::chrono::milliseconds timeout_;
    void *context_ = nullptr;  // hiredis' redisContext
};

}  // namespace ferry
