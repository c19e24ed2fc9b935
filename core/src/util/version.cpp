#include <hasten/version.hpp>

namespace hasten {
const char* version() noexcept { return HASTEN_VERSION_STRING; }
}  // namespace hasten
