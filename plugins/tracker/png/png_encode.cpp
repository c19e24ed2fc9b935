#include "png_encode.hpp"

#include <hasten/plugin.hpp>

#include <png.h>

#include <cstring>

namespace hasten::tracker_png {

std::string encode_png(const uint8_t* pixels, uint32_t height, uint32_t width, uint32_t channels, const char* who) {
  using hasten::sdk::Error;
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  image.width = width;
  image.height = height;
  switch (channels) {
    case 1: image.format = PNG_FORMAT_GRAY; break;
    case 3: image.format = PNG_FORMAT_RGB; break;
    case 4: image.format = PNG_FORMAT_RGBA; break;
    default:
      throw Error(HASTEN_ERR_INVALID_ARGUMENT,
                  std::string(who) + ": an image of " + std::to_string(channels) + " channels (allowed: 1, 3, 4)");
  }
  png_alloc_size_t size = 0;
  // First the size, then the file (the row stride 0: rows are packed).
  if (!png_image_write_to_memory(&image, nullptr, &size, 0, pixels, 0, nullptr))
    throw Error(HASTEN_ERR_INTERNAL, std::string(who) + ": libpng: " + image.message);
  std::string out(size, '\0');
  if (!png_image_write_to_memory(&image, out.data(), &size, 0, pixels, 0, nullptr))
    throw Error(HASTEN_ERR_INTERNAL, std::string(who) + ": libpng: " + image.message);
  out.resize(size);
  png_image_free(&image);
  return out;
}

}  // namespace hasten::tracker_png
