#pragma once

namespace hasten {

// hasten's version, "major.minor.patch".
const char* version() noexcept;

}  // namespace hasten
