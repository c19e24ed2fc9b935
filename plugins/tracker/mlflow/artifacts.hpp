// Where a run's artifacts go: the paths the mlflow tracker gives its images, tables and text
// inside a run's artifact directory, and how a run's artifact_uri is reached (MLflow's
// artifact proxy on the tracking server, or a directory on this machine).
//
// Paths (docs/trackers.md): images/<name>/step_<N>.png, tables/<name>/step_<N>.json and
// text/<name>/step_<N>.txt; without a step, images/<name>.png and so on. A table is the JSON
// object that mlflow.log_table writes ({"columns": [...], "data": [[...], ...]}), so
// mlflow.load_table reads it.
#pragma once

#include <cstdint>
#include <string>

namespace hasten::mlflow {

// The artifact path of a logged name under dir ("images", "tables", "text"): each '/'-separated
// segment of name keeps letters, digits, '_', '-', '.' and ' ' (others become '_'); empty, "."
// and ".." segments become "_", so no path leaves the run's artifact directory.
std::string artifact_path(const std::string& dir, const std::string& name, int64_t step, const std::string& extension);

// A run's artifact_uri as the tracker can reach it.
struct ArtifactRoot {
  enum Kind {
    Proxy,  // mlflow-artifacts:[//host:port]/path: PUT through the tracking server's artifact proxy
    Local,  // file:///dir or /dir: written straight to the directory, as MLflow's own clients do
    Other   // s3://, gs://, ...: stores that need their own credentials and SDKs
  } kind = Other;
  std::string path;  // Proxy: the path under the proxy's root, no leading '/'; Local: the directory
};
ArtifactRoot parse_artifact_uri(const std::string& uri);

}  // namespace hasten::mlflow
