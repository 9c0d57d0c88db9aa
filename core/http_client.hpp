// Minimal HTTP POST over libcurl for etcd's JSON gateway: one request at a time per client,
// plus a streaming variant for watches.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <string>

#include "ferry/engine.hpp"

namespace ferry {

class HttpClient {
public:
    HttpClient();
    ~HttpClient();
    HttpClient(const HttpClient &) = delete;
    HttpClient &operator=(const HttpClient &) = delete;

    // POST a JSON body; the response body on HTTP 200, an error naming the URL otherwise.
    Result<std::string> post(const std::string &url, const std::string &body, std::chrono::milliseconds timeout);

    // POST and hand each received chunk to `on_data` until the server closes, `stop` becomes
    // true, or an error occurs.
    Result<void> stream(const std::string &url, const std::string &body, const std::atomic<bool> &stop,
                        const std::function<void(std::string_view)> &on_data);

private:
    void *curl_;
};

} // namespace ferry
