// Everything a training program needs from hasten.
#pragma once

#include <hasten/accelerator.hpp>
#include <hasten/big_modeling.hpp>
#include <hasten/checksum.hpp>
#include <hasten/config.hpp>
#include <hasten/data.hpp>
#include <hasten/error.hpp>
#include <hasten/launch.hpp>
#include <hasten/logging.hpp>
#include <hasten/memory.hpp>
#include <hasten/process.hpp>
#include <hasten/progress.hpp>
#include <hasten/safetensors.hpp>
#include <hasten/unit.hpp>
#include <hasten/version.hpp>
