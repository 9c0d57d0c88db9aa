// Ferry's error type: Result<T> is std::expected<T, Error>, so no exceptions cross the API.
// The Engine API (engine.hpp) includes it; lower layers that report errors but know nothing of
// engines (sockets, HTTP, descriptors) include only this.
#pragma once

#include <expected>
#include <string>
#include <utility>

namespace ferry {

struct Error {
    int code = 0;         // negative errno-style
    std::string message;  // names the problem and what to do
};

template <class T>
using Result = std::expected<T, Error>;

inline std::unexpected<Error> fail(int code, std::string message) {
    return std::unexpected(Error{code, std::move(message)});
}

}  // namespace ferry
