// The files of a checkpoint, written so that no failure loses the previous one: every rank
// writes into a temporary directory and flushes each file to disk (recording its size and
// CRC-32C), rank 0 then merges the ranks' file lists into manifest.json, flushes it and renames
// the directory into place. A checkpoint is complete exactly when its manifest says so and
// every file it lists has its size and checksum. No LibTorch here.
#pragma once

#include <nlohmann/json.hpp>

#include "formats/file_records.hpp"

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace hasten::detail {

// The chunk size of files that ranks read in ranges (model.safetensors under a sharding
// strategy): small enough that rounding a range out to whole chunks reads little extra.
constexpr uint64_t kChunkSize = uint64_t{1} << 20;
// What a manifest may claim: a reader trusts no larger file or chunk (a crafted manifest must
// not make it allocate or index past what exists).
constexpr uint64_t kMaxFileSize = uint64_t{1} << 50;
constexpr uint64_t kMaxChunkSize = uint64_t{1} << 30;
constexpr uint64_t kMaxManifestBytes = uint64_t{64} << 20;

// Each rank's list of the files it wrote, left in the temporary directory for rank 0.
void write_rank_files(const std::filesystem::path& tmp, int rank, const std::vector<FileRecord>& files);

// The temporary directory a save of final_dir writes into (".NAME.saving" beside it) and the
// one a replaced checkpoint is set aside in where the file system cannot swap directories
// atomically (".NAME.replaced").
std::filesystem::path saving_dir(const std::filesystem::path& final_dir);
std::filesystem::path set_aside_dir(const std::filesystem::path& final_dir);

// Rank 0, before a save: checks that final_dir may be written (absent, or a hasten checkpoint:
// anything else is left alone and refused with one line), puts back a checkpoint that a save
// killed mid-replace left set aside, removes what an earlier save of it left behind (only
// what hasten made: marked temporary directories, set-aside checkpoints) and creates the
// temporary directory anew (mkdir: it must not exist), its mark naming `owner` (one save's
// random token). Returns it. Throws Error with one line.
std::filesystem::path prepare_save(const std::filesystem::path& final_dir, const std::string& owner = "");

// The `owner` that prepare_save wrote into tmp's mark ("" when tmp is no temporary directory
// of a save): another machine sees its own save's owner there through a shared file system.
std::string saving_owner(const std::filesystem::path& tmp);

// Rank 0, after every rank has written its files: merges the ranks' lists and `meta` into
// manifest.json (complete: true), flushes it, and puts tmp in final_dir's place: a rename
// where there is none; where there is one, an atomic swap (renameat2 RENAME_EXCHANGE) and the
// old one removed after. Where the file system cannot swap, the old one is set aside, tmp
// renamed, the old one removed; a failure puts it back, and a kill in between leaves it set
// aside for recover_checkpoint. At every moment one complete checkpoint is readable.
// `ranks`: the ranks whose lists are merged (empty: all of world_size; save_on_each_node: this
// machine's copy holds its own ranks' files, and the manifest lists them as "ranks").
void finalize_checkpoint(const std::filesystem::path& tmp, const std::filesystem::path& final_dir, int world_size,
                         nlohmann::json meta, const std::vector<int>& ranks = {});

// Puts back a complete checkpoint that a save killed mid-replace left set aside, where
// final_dir is missing. Returns what it did ("" when nothing); never throws.
std::string recover_checkpoint(const std::filesystem::path& final_dir);

// Whether dir holds a manifest.json of hasten's checkpoint format (complete or not).
bool is_hasten_checkpoint(const std::filesystem::path& dir);

// "" when dir holds a complete checkpoint whose files all have the manifest's sizes; else
// one line naming the file and what is wrong. The checksums are verified as the files are
// read (checkpoint_reader.hpp), so that loading reads each byte once.
std::string verify_checkpoint(const std::filesystem::path& dir);

// The manifest of a checkpoint, every file entry checked (plain names, sizes and chunk layouts
// within bounds, checksums of the right form); throws Error with one line when it is missing
// or malformed.
nlohmann::json read_manifest(const std::filesystem::path& dir);

// checkpoint_N directories under `checkpoints` (complete or not), by N ascending.
std::vector<std::pair<int, std::filesystem::path>> numbered_checkpoints(const std::filesystem::path& checkpoints);

// Removes the oldest complete checkpoints so that `keep` remain (and leftover temporary
// directories of saves that died). Never throws; returns what it could not remove.
std::vector<std::string> prune_checkpoints(const std::filesystem::path& checkpoints, int keep);

}  // namespace hasten::detail
