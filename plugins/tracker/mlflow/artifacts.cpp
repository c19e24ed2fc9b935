#include "artifacts.hpp"

#include <cctype>

namespace hasten::mlflow {

std::string artifact_path(const std::string& dir, const std::string& name, int64_t step, const std::string& extension) {
  std::string out = dir, segment;
  auto flush = [&] {
    if (segment.empty() || segment == "." || segment == "..") segment = "_";
    out += "/" + segment;
    segment.clear();
  };
  for (unsigned char c : name) {
    if (c == '/') {
      flush();
    } else {
      const bool kept = std::isalnum(c) || c == '_' || c == '-' || c == '.' || c == ' ';
      segment += kept ? static_cast<char>(c) : '_';
    }
  }
  if (step < 0) {
    segment += "." + extension;
    flush();
  } else {
    flush();
    out += "/step_" + std::to_string(step) + "." + extension;
  }
  return out;
}

ArtifactRoot parse_artifact_uri(const std::string& uri) {
  ArtifactRoot root;
  auto strip = [](std::string rest) {
    if (rest.rfind("//", 0) == 0) {  // an authority: //host:port/path
      const size_t slash = rest.find('/', 2);
      rest = slash == std::string::npos ? "" : rest.substr(slash);
    }
    while (!rest.empty() && rest.front() == '/') rest.erase(0, 1);
    while (!rest.empty() && rest.back() == '/') rest.pop_back();
    return rest;
  };
  if (uri.rfind("mlflow-artifacts:", 0) == 0) {
    root.kind = ArtifactRoot::Proxy;
    root.path = strip(uri.substr(17));
  } else if (uri.rfind("file://", 0) == 0) {
    root.kind = ArtifactRoot::Local;
    root.path = "/" + strip(uri.substr(5));
  } else if (uri.rfind("file:", 0) == 0 || (!uri.empty() && uri.front() == '/')) {
    root.kind = ArtifactRoot::Local;
    root.path = uri.front() == '/' ? uri : uri.substr(5);
  }
  return root;
}

}  // namespace hasten::mlflow
