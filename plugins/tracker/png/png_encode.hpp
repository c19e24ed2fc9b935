// PNG files of tracker images, through libpng's simplified write API: the tensorboard and
// mlflow trackers' one encoder (a static library both link).
#pragma once

#include <cstdint>
#include <string>

namespace hasten::tracker_png {

// pixels: height * width * channels bytes, HWC; channels 1 (grey), 3 (RGB) or 4 (RGBA).
// Throws hasten::sdk::Error with libpng's message, led by who ("tensorboard", "mlflow").
std::string encode_png(const uint8_t* pixels, uint32_t height, uint32_t width, uint32_t channels, const char* who);

}  // namespace hasten::tracker_png
