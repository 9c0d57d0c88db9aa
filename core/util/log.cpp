#include "util/log.hpp"

#include <atomic>
#include <cctype>
#include <cstdlib>
#include <mutex>

#include <boost/core/null_deleter.hpp>
#include <boost/log/attributes/constant.hpp>
#include <boost/log/core.hpp>
#include <boost/log/expressions.hpp>
#include <boost/log/sinks/sync_frontend.hpp>
#include <boost/log/sinks/text_ostream_backend.hpp>
#include <boost/log/sources/record_ostream.hpp>
#include <boost/log/sources/severity_channel_logger.hpp>
#include <iostream>

namespace ferry::log {
namespace {

namespace bl = boost::log;

BOOST_LOG_ATTRIBUTE_KEYWORD(channel_kw, "Channel", std::string)

const char *const kLevelNames[] = {"error", "warn", "info", "debug", "trace"};

Level initial_level() {
    Level l = Level::Warn;
    if (const char *env = std::getenv("FERRY_LOG_LEVEL")) parse_level(env, l);
    return l;
}

std::atomic<int> &current_level() {
    static std::atomic<int> value{static_cast<int>(initial_level())};
    return value;
}

using Logger = bl::sources::severity_channel_logger_mt<int, std::string>;

// Installs our stderr sink once; it accepts only the "ferry" channel so an application that
// uses Boost.Log itself keeps its own sinks and formats.
Logger &logger() {
    static Logger instance = [] {
        using Backend = bl::sinks::text_ostream_backend;
        auto backend = boost::make_shared<Backend>();
        backend->add_stream(boost::shared_ptr<std::ostream>(&std::clog, boost::null_deleter()));
        backend->auto_flush(true);
        auto sink = boost::make_shared<bl::sinks::synchronous_sink<Backend>>(backend);
        sink->set_filter(channel_kw == "ferry");
        sink->set_formatter(bl::expressions::stream << bl::expressions::smessage);
        bl::core::get()->add_sink(sink);
        return Logger(bl::keywords::channel = "ferry");
    }();
    return instance;
}

}  // namespace

bool parse_level(std::string_view text, Level &out) {
    std::string lower;
    for (char c : text) lower.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
    if (lower == "warning") lower = "warn";
    for (int i = 0; i < 5; ++i) {
        if (lower == kLevelNames[i] || lower == std::string(1, static_cast<char>('0' + i))) {
            out = static_cast<Level>(i);
            return true;
        }
    }
    return false;
}

void set_level(Level l) { current_level().store(static_cast<int>(l), std::memory_order_relaxed); }

Level level() { return static_cast<Level>(current_level().load(std::memory_order_relaxed)); }

void write(Level l, std::string_view component, std::string_view message) {
    auto &lg = logger();
    int severity = static_cast<int>(l);
    if (auto record = lg.open_record(bl::keywords::severity = severity)) {
        bl::record_ostream stream(record);
        stream << "[ferry " << kLevelNames[severity] << "] " << component << ": " << message;
        stream.flush();
        lg.push_record(std::move(record));
    }
}

}  // namespace ferry::log
