// hasten's exceptions. Every message is one line that names what is wrong and what is
// allowed; programs print e.what() and exit non-zero.
#pragma once

#include <stdexcept>
#include <string>

namespace hasten {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A bad configuration value, key or file.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// A plugin that could not be found, loaded or created, or that failed a call.
class PluginError : public Error {
 public:
  using Error::Error;
};

// The program used hasten's API in a way it does not allow (wrong order, wrong object).
class UsageError : public Error {
 public:
  using Error::Error;
};

}  // namespace hasten
