// PNG files of tracker images, through libpng's simplified write API.
#pragma once

#include <cstdint>
#include <string>

namespace hasten::tensorboard {

// pixels: height * width * channels bytes, HWC; channels 1 (grey), 3 (RGB) or 4 (RGBA).
// Throws hasten::sdk::Error with libpng's message.
std::string encode_png(const uint8_t* pixels, uint32_t height, uint32_t width, uint32_t channels);

}  // namespace hasten::tensorboard
